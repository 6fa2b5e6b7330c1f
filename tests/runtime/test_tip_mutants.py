"""A mutation round on runtime/engines/tip.py: the knobs reach the eviction policy, each token's
visible streams are the training mask's, the graph's links name its nodes, H2O scores the prefill,
and a request preempted between prompt chunks or mid-decode (after steps died) gives, token by
token, the logits and KV figures it gives alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from runtime.engines import GenerationConfig, Request, drain
from runtime.engines.tip import TipEngine
from runtime.kv import RequestKV
from runtime.lang.tip import PROMPT_STREAM, tip_visibility
from runtime.structure_replay import ForcedLogits
from runtime.tasks import get_task
from tests.runtime.test_tip_engine import annotated, run_steps, var_example


def test_engine_knobs_reach_the_policy(tiny_model, tok):
    h2o = TipEngine(tiny_model, tok, policy="h2o", budget_tokens=20, heavy_fraction=0.25).make_policy()
    assert h2o.heavy_fraction == 0.25 and h2o.recent == 20 - 5 - 1
    default = TipEngine(tiny_model, tok, policy="streaming", budget_tokens=20).make_policy()
    assert default.sinks == 4 and default.heavy_fraction == 0.5  # StreamingLLM's and H2O's defaults
    assert TipEngine(tiny_model, tok, policy="streaming", budget_tokens=20, sinks=2).make_policy().sinks == 2


def drive(eng: TipEngine, request: Request):
    """Run one request alone as `Engine.run` does, keeping its state: (state, steps)."""
    st = eng.start(request, RequestKV(eng.new_store(), request.request_id))
    steps = []
    while not st.done:
        inp = st.inputs()
        logits, attn = eng.forward([inp], st.kv.store)
        steps.append(st.after(logits, attn))
        st.passes_done += 1
    return st, steps


def test_streaming_keeps_the_first_prompt_tokens_as_sinks(tiny_model, tok):
    ex = var_example()
    model = ForcedLogits(tiny_model, tok.eos_id, script=tok.encode(annotated(ex)))
    eng = TipEngine(model, tok, GenerationConfig(max_tokens=20, page_size=4), policy="streaming", budget_tokens=12)
    st, steps = drive(eng, Request(0, ex.prompt))
    assert sum(s.evicted_tokens for s in steps) > st.n  # the prompt's tail went long ago
    assert list(st.live)[:4] == st.fed_slot[:4] and len(st.live) == 11


def test_visible_streams_are_the_training_masks_and_links_name_nodes(tiny_model, tok):
    """Each fed token records the streams its row sees under `tip_visibility` (itself included, a
    step killed by a tag not even by that tag); a step's parents are what its tag saw but the
    prompt and itself. Every link joins two nodes (the main stream is `main:0`, never `step:0`),
    and the prompt feeds every stream."""
    ex = var_example()
    model = ForcedLogits(tiny_model, tok.eos_id, script=tok.encode("so " + annotated(ex)))
    eng = TipEngine(model, tok, GenerationConfig(max_tokens=48, page_size=4))  # a few steps killed
    _, c = run_steps(eng, ex.prompt)
    ids = eng.prompt_ids(Request(0, ex.prompt))
    n = len(ids)
    mask, streams = tip_visibility(ids + c.output_ids[:-1], n, tok)
    for j, t in enumerate(c.tokens[:-1]):
        assert t.visible_streams == tuple(sorted({streams[k] for k in np.flatnonzero(mask[n + j].numpy())})), j
    tags = [t for t in c.tokens[:-1] if t.kind == "tag"]
    assert len(tags) > 3 and any(t.evicted_at_step >= 0 for t in c.tokens)  # some step died
    links = {(lk["source"], lk["target"]) for lk in c.graph["links"]}
    for t in tags:
        parents = [s for s in t.visible_streams if s not in (PROMPT_STREAM, t.stream)]
        assert {(f"step:{p}" if p > 0 else "main:0", f"step:{t.stream}") for p in parents} <= links
    nodes = {nd["id"] for nd in c.graph["nodes"]}
    assert all(a in nodes and b in nodes for a, b in links)
    assert any(a == "main:0" for a, _ in links)  # "so " opened the main stream before the steps
    assert {b for a, b in links if a == "prompt"} == nodes - {"prompt"}


def test_h2o_scores_the_prefill(tiny_model, tok):
    """The prefill pass asks for attention, so H2O's scores cover every prompt slot after it."""
    ex = var_example()
    eng = TipEngine(tiny_model, tok, GenerationConfig(max_tokens=4), policy="h2o", budget_tokens=200)
    st = eng.start(Request(0, ex.prompt), RequestKV(eng.new_store(), 0))
    inp = st.inputs()
    assert inp.attention
    st.after(*eng.forward([inp], st.kv.store))
    assert set(st.policy.scores) == set(st.live) and len(st.live) == st.n
    assert all(v > 0 for v in st.policy.scores.values())


class ByPosition(ForcedLogits):
    """Forced to `script[j]` at the pass whose last row predicts generated token j (its position is
    n - 1 + j), whatever passes run in between (prompt chunks, a replay): `own[j]` keeps the model's
    own logits of that row."""

    def __init__(self, model, tok, n: int, script: list[int]) -> None:
        super().__init__(model, tok.eos_id, script=script)
        self.n, self.own = n, {}

    def forward(self, tokens, positions, *args, **kw):
        out = self.inner(tokens, positions, *args, **kw)
        logits, attn = out if isinstance(out, tuple) else (out, None)
        j = int(positions[-1]) - (self.n - 1)
        if j >= 0:
            self.own[j] = logits[-1].detach().clone()
        t = self.script[j] if 0 <= j < len(self.script) else self.fallback
        forced = torch.full_like(logits, -1e9)
        forced[:, t] = 0.0
        return (forced, attn) if attn is not None else forced


class PreemptOnce:
    """Admit everything, prefill in chunks of `chunk` rows (None: whole); on call `at` preempt
    request 0 and readmit it at once."""

    def __init__(self, at: int, chunk: int | None = 3) -> None:
        self.at, self.calls, self.chunk = at, 0, chunk

    def schedule(self, state) -> dict[int, int]:
        self.calls += 1
        for r in list(state.waiting):
            state.admit(r)
        if self.calls == self.at:
            state.preempt(0)
            state.admit(0)
        limits = None if self.chunk is None else [self.chunk] * len(state.running)
        q, _ = state.next_tokens_and_blocks(state.running, limits)
        return dict(zip(state.running, q.tolist()))


@pytest.mark.parametrize(
    "where,knobs",
    [
        ("between_chunks", {}),
        ("after_kills", {}),
        ("after_kills", {"policy": "window", "budget_tokens": 16, "free_pages": False}),
    ],
)
def test_preemption_changes_no_logits_and_no_kv_figure(tiny_model, tok, where, knobs):
    """Preempted between two chunks of its prompt (the prompt starts over, nothing stale stays
    visible) or after steps died (the replay re-feeds every token, the dead ones too, at its
    position and with what it saw): every generated token's logits, each pass's live and read KV and
    evictions, and which pass evicted each token are what the request gives alone. With
    `free_pages=False` (nothing freed), the bytes held too, pass by pass."""
    from runtime.server import FakeClock, Server

    ex = var_example()
    script = tok.encode(annotated(ex)) + [tok.eos_id]
    n = len(TipEngine(tiny_model, tok).prompt_ids(Request(0, ex.prompt)))

    def engine():
        model = ByPosition(tiny_model, tok, n, script)
        return TipEngine(model, tok, GenerationConfig(max_tokens=40, page_size=4), **knobs), model

    eng, alone_model = engine()
    steps, alone = drain(eng.run(Request(0, ex.prompt)))
    assert steps[0].query_tokens == n and all(s.query_tokens == 1 for s in steps[1:])  # one row a decode pass
    first_kill = next(i for i, s in enumerate(steps) if s.evicted_tokens)
    at = 2 if where == "between_chunks" else math.ceil(n / 3) + first_kill + 6
    eng, model = engine()
    out = Server(eng, scheduler=PreemptOnce(at), clock=FakeClock(), max_pages=4096).serve([(0.0, ex.prompt)])
    assert out["preemptions"] == 1 and out["recomputes"] == (where == "after_kills")
    c = out["requests"][0].completion
    assert c.output_ids == alone.output_ids and sorted(model.own) == sorted(alone_model.own)
    for j, want in alone_model.own.items():
        assert torch.allclose(model.own[j], want, atol=1e-4), j
    served = [e.step for p in out["passes"] for e in p.entries if e.step]
    for key in ("live_kv_tokens", "evicted_tokens"):
        assert [getattr(s, key) for s in served] == [getattr(s, key) for s in steps], key
    # a chunked prompt's prefill pass runs and reads only its last chunk's rows; decode passes alike
    for key in ("query_tokens", "kv_tokens_read"):
        assert [getattr(s, key) for s in served[1:]] == [getattr(s, key) for s in steps[1:]], key
    assert [t.evicted_at_step for t in c.tokens] == [t.evicted_at_step for t in alone.tokens]
    assert [t.visible_streams for t in c.tokens] == [t.visible_streams for t in alone.tokens]
    if not eng.free_pages:
        assert [s.kv_bytes_allocated for s in served] == [s.kv_bytes_allocated for s in steps]


def test_prompt_rows_then_one_row_a_pass(tiny_model, tok):
    """Before the prompt is fed, the next pass is the rest of it (in prompt pages); a prefill cut
    short forgets every slot it had; once the prompt is fed, one row (one generated slot) a pass."""
    ex = get_task("var_tracking").examples("test", 1)[0]
    eng = TipEngine(tiny_model, tok, GenerationConfig(max_tokens=3, page_size=4))
    st = eng.start(Request(0, ex.prompt), RequestKV(eng.new_store(), 0))
    assert st.next_rows() == st.prompt_left() == st.n and st.next_new_slots() == {"prompt": st.n}
    st.prompt_chunk(3)
    assert st.next_rows() == st.prompt_left() == st.n - 3 and st.next_new_slots() == {"prompt": st.n - 3}
    # preempted between chunks: the pages go (another request may take them) and so do the slots
    st.release()
    st.restart_prefill()
    assert not st.live and not st.fed and st.next_rows() == st.n
    st.prompt_chunk(3)
    inp = st.inputs()
    st.after(*eng.forward([inp], st.kv.store))
    assert st.next_rows() == 1 and st.prompt_left() == 0 and st.next_new_slots() == {"gen": 1}
    assert st.replay_owners() == ["prompt"] * st.n
    inp = st.inputs()
    assert st.replay_owners() == ["prompt"] * st.n + ["gen"]


@pytest.mark.parametrize(
    "where,attention",
    [
        ("chunked", "mask"),
        ("between_chunks", "mask"),
        ("after_kills", "mask"),
        ("after_kills_unchunked", "mask"),
        ("after_kills_unchunked", "gather"),
    ],
)
def test_h2o_scores_a_chunked_prompt_as_the_run_alone(tiny_model, tok, where, attention):
    """H2O with its prompt prefilled in chunks of 3 rows, never preempted, preempted between two
    chunks (the prompt starts over) or preempted after evictions (recomputed: the replay re-feeds
    every token): the attention of every chunk counts, once, as the run alone's one prefill counts
    the whole prompt's, and a replay's rows count none (their attention was scored when they first
    ran), so every generated token's logits, the evictions and which pass evicted each token are
    the run alone's. Was: the server never handed a chunk's attention to the request (only the
    last chunk scored), the model's logits differed from the run alone's from the first eviction
    on; a restarted prefill kept the dropped chunks' scores; and a replay added every replayed
    row's attention a second time."""
    from runtime.server import FakeClock, Server

    ex = var_example()
    script = tok.encode(annotated(ex)) + [tok.eos_id]
    n = len(TipEngine(tiny_model, tok).prompt_ids(Request(0, ex.prompt)))
    knobs = {"policy": "h2o", "budget_tokens": 16}

    def engine():
        model = ByPosition(tiny_model, tok, n, script)
        return TipEngine(model, tok, GenerationConfig(max_tokens=40, page_size=4), **knobs), model

    eng, alone_model = engine()
    alone_state, steps = drive(eng, Request(0, ex.prompt))
    alone = alone_state.completion()
    assert any(s.evicted_tokens for s in steps)  # the budget binds
    first_evict = next(i for i, s in enumerate(steps) if s.evicted_tokens)
    chunk = None if where == "after_kills_unchunked" else 3
    prefill = 1 if chunk is None else math.ceil(n / chunk)
    at = {"chunked": 10**6, "between_chunks": 2}.get(where, prefill + first_evict + 6)
    eng, model = engine()
    server = Server(eng, scheduler=PreemptOnce(at, chunk), clock=FakeClock(), max_pages=4096, attention=attention)
    out = server.serve([(0.0, ex.prompt)])
    assert out["preemptions"] == (where != "chunked")
    assert out["recomputes"] == where.startswith("after_kills")
    served_state = out["requests"][0].state

    def scores(st):  # H2O's score of each live token, by the order it was fed in
        return {st.slot_fed[sl]: v for sl, v in st.policy.scores.items() if sl in st.live}

    want, got = scores(alone_state), scores(served_state)
    assert sorted(got) == sorted(want)
    for j in want:
        assert got[j] == pytest.approx(want[j], rel=1e-4, abs=1e-4), j
    c = out["requests"][0].completion
    assert c.output_ids == alone.output_ids and sorted(model.own) == sorted(alone_model.own)
    for j, want in alone_model.own.items():
        assert torch.allclose(model.own[j], want, atol=1e-4), j
    served = [e.step for p in out["passes"] for e in p.entries if e.step]
    assert [s.evicted_tokens for s in served] == [s.evicted_tokens for s in steps]
    assert [t.evicted_at_step for t in c.tokens] == [t.evicted_at_step for t in alone.tokens]


def test_a_restarted_prefill_forgets_its_chunks_h2o_scores(tiny_model, tok):
    """A prompt chunk's attention scores its slots; when the prefill starts over (preempted between
    chunks, its pages freed) those scores go with it, so slots handed out again start from zero
    (was: kept, and added to by the re-run chunk)."""
    ex = var_example()
    eng = TipEngine(tiny_model, tok, GenerationConfig(max_tokens=4), policy="h2o", budget_tokens=200)
    st = eng.start(Request(0, ex.prompt), RequestKV(eng.new_store(), 0))
    inp = st.chunk_inputs(3)
    assert inp.attention
    st.after_chunk(eng.forward([inp], st.kv.store)[1])
    assert set(st.policy.scores) == set(st.live) and len(st.live) == 3
    st.release()
    st.preempted()  # nothing ran to the end: the prompt starts over
    assert not st.live and not st.policy.scores
