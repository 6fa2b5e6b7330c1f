"""A mutation round on runtime/engines/masked_diffusion.py: the knobs it refuses, what each denoising
pass records (streams, notes, rows, reads, tags, pads), every pass's logits against a dense forward
under the hybrid mask, and a preemption in the middle of the denoising that changes nothing."""

from __future__ import annotations

import json

import pytest
import torch

from runtime.engines.base import GenerationConfig, Request, drain
from runtime.engines.diffusion_common import Seg, hybrid_mask
from runtime.engines.masked_diffusion import MaskedDiffusionEngine
from runtime.lang.planned_diffusion import ASYNC, ASYNC_END, MASK, PAD
from runtime.structure_replay import ForcedLogits
from tests.runtime.test_tip_mutants import PreemptOnce

LENGTH, STEPS = 6, 3


class AllLogits(ForcedLogits):
    """The model's own logits, every row of every pass kept (`rows`), forced to `script` (the pass's
    token at every row) while the script lasts, then the model's own."""

    def __init__(self, model, script: list[int] | None = None) -> None:
        super().__init__(model, fallback=0)
        self.script, self.rows = list(script or []), []

    def forward(self, *args, **kw):
        out = self.inner(*args, **kw)
        logits = out[0] if isinstance(out, tuple) else out
        self.rows.append(logits.detach().clone())
        if self.i < len(self.script):
            forced = torch.full_like(logits, -1e9)
            forced[:, self.script[self.i]] = 0.0
            logits = forced
        self.i += 1
        return (logits, out[1]) if isinstance(out, tuple) else logits


def engine(model, tok, **kw):
    return MaskedDiffusionEngine(model, tok, GenerationConfig(max_tokens=16, page_size=4), length=LENGTH, **kw)


def test_length_and_steps_below_one_are_refused(tiny_model, tok):
    for bad in (dict(length=0), dict(steps=0), dict(length=-3), dict(steps=-1)):
        with pytest.raises(ValueError, match="length and steps must be >= 1"):
            MaskedDiffusionEngine(tiny_model, tok, **bad)


def test_each_pass_records_the_one_span(tiny_model, tok):
    """Two tags around the span, pads told from content, stream 1 in every pass, 1-based steps of
    round 0 in the notes, the prompt computed once (first pass) and never again."""
    pad = tok.token_id(PAD)
    model = AllLogits(tiny_model, script=[tok.encode("a")[0], pad, pad])
    eng = engine(model, tok, steps=STEPS)
    steps, c = drain(eng.run(Request(0, "hi")))
    n = c.prompt_tokens
    span = LENGTH + 2
    assert c.output_ids[0] == tok.token_id(ASYNC) and c.output_ids[-1] == tok.token_id(ASYNC_END)
    kinds = [t.kind for t in c.tokens]
    assert kinds[0] == kinds[-1] == "tag" and set(kinds[1:-1]) == {"content", "pad"}
    assert c.text == "a" * kinds.count("content") and "pad" in kinds
    assert [t.position_id for t in c.tokens] == list(range(n, n + span))
    assert all(t.stream == 1 and t.visible_streams == (-1, 1) for t in c.tokens)
    # each content/pad token's step is the pass that committed it; the tags were never masked
    committed = [s.emitted for s in steps]
    assert sorted(t.step_index for t in c.tokens[1:-1]) == [i for i, e in enumerate(committed) for _ in e]
    assert c.tokens[0].step_index == c.tokens[-1].step_index == 0  # laid out before the first pass
    assert len(steps) == c.steps == STEPS and all(s.streams == (1,) for s in steps)
    notes = [json.loads(s.note) for s in steps]
    assert [(x["round"], x["step"]) for x in notes] == [(0, i + 1) for i in range(STEPS)]
    assert [x["masks_left"]["1"] for x in notes][-1] == 0
    assert sum(x["unmasked"]["1"] for x in notes) == LENGTH == sum(len(e) for e in committed)
    assert [s.query_tokens for s in steps] == [n + span] + [span] * (STEPS - 1)
    # pass 0: the causal prompt triangle plus the span rows (each sees the prompt and its whole span)
    assert steps[0].kv_tokens_read == n * (n + 1) // 2 + span * (n + span)
    assert all(s.kv_tokens_read == span * (n + span) for s in steps[1:])
    assert all(s.live_kv_tokens == n + span for s in steps)
    assert c.peak_live_kv_tokens == n + span and c.peak_kv_bytes == steps[-1].kv_bytes_allocated
    st = eng.start(Request(1, "hi"), None)
    assert st.max_kv_tokens() == n + span and st.next_new_slots() == {None: n + span}
    assert c.critical_path_tokens == LENGTH
    (ev,) = c.events
    assert ev == {"event": "mdm", "length": LENGTH, "steps": STEPS, "denoise_passes": STEPS, "finished_at": STEPS}
    node = c.graph["nodes"][1]
    assert node["length"] == LENGTH and node["finished_at_step"] == STEPS and node["stream"] == 1


def test_an_early_finish_counts_the_passes_it_ran(tiny_model, tok):
    """A confidence threshold every prediction reaches commits the whole span in the first pass:
    one denoising pass, in the event and the graph, whatever `steps` allowed."""
    c = engine(tiny_model, tok, steps=STEPS, confidence_threshold=1e-9).generate(Request(0, "hi"))
    assert c.steps == 1 and c.events[0]["denoise_passes"] == 1 and c.events[0]["finished_at"] == 1
    assert c.events[0]["steps"] == STEPS and c.graph["nodes"][1]["finished_at_step"] == 1


def test_every_pass_is_the_dense_forward_under_the_hybrid_mask(tiny_model, tok):
    """Pass i's rows (the prompt and the span first, the span after) give the logits of one dense
    forward over the sequence as it stood then (tokens committed before pass i, [MASK] elsewhere)."""
    model = AllLogits(tiny_model)
    eng = engine(model, tok, steps=STEPS)
    steps, c = drain(eng.run(Request(0, "hi")))
    prompt = eng.prompt_ids(Request(0, "hi"))
    n, span = len(prompt), LENGTH + 2
    segs = [Seg("ar", n), Seg("span", span)]
    mask = hybrid_mask(segs)
    for i, got in enumerate(model.rows):
        ids = prompt + [t.token_id if t.kind == "tag" or t.step_index < i else tok.token_id(MASK) for t in c.tokens]
        dense = tiny_model.forward_dense(torch.tensor([ids]), torch.arange(n + span)[None], mask[None])[0]
        want = dense if i == 0 else dense[n:]
        assert torch.allclose(got, want, atol=1e-4), f"pass {i}"
    assert len(model.rows) == STEPS


@pytest.mark.parametrize("at", [1, 3])
def test_a_preempted_span_denoises_as_alone(tiny_model, tok, at):
    """Preempted before its first pass (the prompt starts over) or mid-denoising (the prompt is
    re-prefilled at its positions; the half-committed span is not, as the next denoising pass
    computes every span row anyway): every pass's span rows, the commits and the KV held are what
    the request gives alone. Was: the replay re-fed the span too, 2 + LENGTH rows the next pass
    computed again."""
    from runtime.server import FakeClock, Server

    alone_model = AllLogits(tiny_model)
    eng = engine(alone_model, tok, steps=4)
    alone_steps, alone = drain(eng.run(Request(0, "hi")))
    model = AllLogits(tiny_model)
    out = Server(
        engine(model, tok, steps=4), scheduler=PreemptOnce(at, chunk=None), clock=FakeClock(), max_pages=4096
    ).serve([(0.0, "hi")])
    assert out["preemptions"] == 1 and out["recomputes"] == (at > 1)
    assert out["recompute_tokens"] == (len(eng.prompt_ids(Request(0, "hi"))) if at > 1 else 0)
    c = out["requests"][0].completion
    assert c.output_ids == alone.output_ids
    assert [t.step_index for t in c.tokens] == [t.step_index for t in alone.tokens]
    served = [e.step for p in out["passes"] for e in p.entries if e.step]
    assert [s.note for s in served] == [s.note for s in alone_steps]
    assert [s.live_kv_tokens for s in served] == [s.live_kv_tokens for s in alone_steps]
    span = LENGTH + 2
    for a, b in zip(alone_model.rows, model.rows):
        assert torch.allclose(a[-span:], b[-span:], atol=1e-4)
