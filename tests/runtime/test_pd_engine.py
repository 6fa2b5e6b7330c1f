"""Planned Diffusion and plain masked diffusion engines on tiny random models; the hybrid training
sequences."""

from __future__ import annotations

import json
import random

import pytest
import torch

from profiler.errors import UsageError
from runtime.engines.base import GenerationConfig, Request, drain
from runtime.engines.diffusion_common import Layout, check_knobs, order_scores, scheduled, steps_for
from runtime.engines.masked_diffusion import MaskedDiffusionEngine
from runtime.engines.planned_diffusion import PlannedDiffusionEngine
from runtime.lang.planned_diffusion import annotate, entry_text
from runtime.train.planned_diffusion import RECIPE, hybrid_seq, lay_out, prefix_ids
from runtime.train.sft import IGNORE

PLAN = entry_text("a", 1) + entry_text("b", 2) + "<sync/>xy<eos>"


def pd(tok, model, max_tokens=64, **kw):
    return PlannedDiffusionEngine(model, tok, GenerationConfig(max_tokens=max_tokens), **kw)


def test_schedule_one_token_a_step_at_ratio_one():
    for L in (1, 7, 30):
        steps = steps_for(L, 1.0)
        left = L
        for i in range(steps):
            left -= scheduled(left, i, steps)
            assert left == L - i - 1
    assert scheduled(5, 9, 10) == 5  # the last step commits everything


def test_spans_finish_at_their_length_and_trace(tok, tiny_model):
    eng = pd(tok, tiny_model, forced_plan=PLAN, length_scale=5)
    steps, c = drain(eng.run(Request(0, "hi")))
    rnd = [e for e in c.events if e["event"] == "round"]
    assert rnd[0]["span_lengths"] == [5, 10] and rnd[0]["finished_at"] == [5, 10] and rnd[0]["end"] == "sync"
    assert c.events[-1]["spans_finish_at_length"] is True
    denoise = [s for s in steps if s.phase == "denoise"]
    assert len(denoise) == 10 and {s.phase for s in steps} == {"prefill", "plan", "denoise", "sync"}
    left = [json.loads(s.note)["masks_left"] for s in denoise]
    assert left[0] == {"1": 4, "2": 9} and left[4] == {"1": 0, "2": 5} and left[-1] == {"2": 0}
    unmasked = [json.loads(s.note)["unmasked"] for s in denoise]
    assert all(u == dict.fromkeys(m, 1) for u, m in zip(unmasked, left))  # one token a step per active span
    assert denoise[5].streams == (2,)  # span 1 left the passes
    span2 = [t for t in c.tokens if t.stream == 2 and t.kind != "tag"]
    assert sorted(t.step_index for t in span2) == [d.step_index for d in denoise]  # one token per step
    assert c.text.endswith("xy") and c.status == "ok"
    kinds = {t.kind for t in c.tokens}
    assert {"plan", "tag"} <= kinds and kinds <= {"plan", "tag", "content", "pad"}
    assert any(n["kind"] == "span" and n["finished_at_step"] == 10 for n in c.graph["nodes"])
    assert [json.loads(s.note)["step"] for s in denoise] == list(range(1, 11))  # 1-based within the round
    pd_event = next(e for e in c.events if e["event"] == "pd")
    assert pd_event["rounds"] == 1 and pd_event["spans"] == 2 and pd_event["denoise_passes"] == 10
    ar = sum(t.stream == 0 for t in c.tokens)
    assert c.critical_path_tokens == ar + 10  # the round's spans run side by side: its longest counts
    for n in c.graph["nodes"]:  # a span's node counts its tokens, tags included
        if n["kind"] == "span":
            assert n["tokens"] == sum(t.stream == n["stream"] for t in c.tokens) == n["length"] + 2
    spans_text = tok.decode([t.token_id for t in c.tokens if t.stream > 0 and t.kind == "content"], skip_control=True)
    assert c.text == spans_text + "xy"  # the answer: span contents and AR text, never the plan
    after_sync = [t for t in c.tokens if t.stream == 0 and t.kind == "content"]
    assert after_sync and all({1, 2} <= set(t.visible_streams) for t in after_sync)  # <sync/> revealed both
    assert all(2 not in t.visible_streams for t in c.tokens if t.stream == 1)  # PD-SA: siblings blind


def test_dense_mask_records_siblings_and_guards(tok, tiny_model):
    c = pd(tok, tiny_model, forced_plan=PLAN, length_scale=2, block_sparse=False).generate(Request(0, "hi"))
    assert all({1, 2} <= set(t.visible_streams) for t in c.tokens if t.stream in (1, 2))
    c = pd(tok, tiny_model, forced_plan="x" * 40, max_plan_tokens=5).generate(Request(0, "hi"))
    assert c.stop_reason == "max_plan_tokens" and c.status == "truncated"
    for guard in ("max_plan_tokens", "max_rounds", "max_spans", "max_span_tokens"):
        with pytest.raises(ValueError, match=f"{guard} must be >= 1"):
            pd(tok, tiny_model, **{guard: 0})


def test_two_rounds_chain_in_the_graph_and_passes_add_up(tok, tiny_model):
    """prompt -> plan:0 -> span:1 -> plan:1 -> span:2 -> plan:2: each plan chunk holds the AR tokens
    laid out after the previous round's spans (its `<sync/>` included), and every pass is counted
    once, as AR or denoise."""
    plan = entry_text("a", 1) + "<sync/>" + entry_text("b", 1) + "<sync/>xy<eos>"
    steps, c = drain(pd(tok, tiny_model, forced_plan=plan, length_scale=2).run(Request(0, "hi")))
    nodes = {n["id"]: n for n in c.graph["nodes"]}
    links = {(link["source"], link["target"]) for link in c.graph["links"]}
    chain = ["prompt", "plan:0", "span:1", "plan:1", "span:2", "plan:2"]
    assert set(zip(chain, chain[1:])) <= links
    span_ends = [max(t.position_id for t in c.tokens if t.stream == sid) for sid in (1, 2)]
    ar = [t.position_id for t in c.tokens if t.stream == 0]
    for k in range(3):
        assert nodes[f"plan:{k}"]["tokens"] == sum(k == sum(p > e for e in span_ends) for p in ar)
    assert nodes["plan:2"]["tokens"] == 4  # <sync/> x y <eos>
    pd_event = next(e for e in c.events if e["event"] == "pd")
    assert pd_event["denoise_passes"] == sum(s.phase == "denoise" for s in steps) == 4
    assert pd_event["ar_passes"] == sum(s.phase != "denoise" for s in steps) == len(steps) - 4


@pytest.mark.parametrize("plan", ["x" * 40, "x" * 11 + "<sync/>" + "y" * 20])
def test_max_positions_stops_the_plan(tok, plan):
    """Text or a `<sync/>` that reaches the model's last position stops the request with
    stop_reason max_positions (was: UsageError 'sequence of 17 tokens exceeds the model's 16
    positions' from the layout, mid-run)."""
    import dataclasses

    from runtime.model import ModelConfig, TinyLM

    model = TinyLM(dataclasses.replace(ModelConfig.from_name("tiny-2l"), max_positions=16), seed=1).eval()
    c = pd(tok, model, max_tokens=100, forced_plan=plan).generate(Request(0, "hi"))
    assert c.stop_reason == "max_positions" and c.status == "truncated"
    assert c.prompt_tokens + len(c.output_ids) == 16


def test_a_round_starts_only_if_its_spans_sync_and_next_token_fit(tok):
    """A round's spans are laid out and denoised only when they, the `<sync/>` after them and one
    more token all have positions: with the spans ending at position e, a model of e + 3 positions
    denoises them (and stops at max_positions two tokens later), one of e + 2 stops before the
    round, with no span in its output (docs/planned_diffusion.md)."""
    import dataclasses

    from runtime.model import ModelConfig, TinyLM

    plan = entry_text("a", 1) + "<sync/>xyz<eos>"

    def run(max_positions):
        cfg = dataclasses.replace(ModelConfig.from_name("tiny-2l"), max_positions=max_positions)
        return pd(tok, TinyLM(cfg, seed=1).eval(), max_tokens=100, forced_plan=plan, length_scale=2).generate(
            Request(0, "hi")
        )

    full = run(64)
    assert full.stop_reason == "stop_token"
    end = max(t.position_id for t in full.tokens if t.stream == 1)
    fits = run(end + 3)
    assert any(t.stream == 1 for t in fits.tokens) and fits.stop_reason == "max_positions"
    assert fits.prompt_tokens + len(fits.output_ids) == end + 3
    short = run(end + 2)
    assert short.stop_reason == "max_positions" and not any(t.stream == 1 for t in short.tokens)


def test_threshold_and_ratio_cut_steps(tok, tiny_model):
    base = pd(tok, tiny_model, forced_plan=PLAN, length_scale=8).generate(Request(0, "hi"))
    half = pd(tok, tiny_model, forced_plan=PLAN, length_scale=8, steps_ratio=0.5).generate(Request(0, "hi"))
    keen = pd(tok, tiny_model, forced_plan=PLAN, length_scale=8, confidence_threshold=1e-9).generate(Request(0, "hi"))
    passes = [next(e for e in c.events if e["event"] == "pd")["denoise_passes"] for c in (base, half, keen)]
    assert passes == [16, 8, 1]
    rnd = next(e for e in keen.events if e["event"] == "round")
    assert rnd["denoise_steps"] == 1 and rnd["scheduled_steps"] == 16  # what ran, and what was scheduled
    assert next(e for e in half.events if e["event"] == "pd")["spans_finish_at_length"] is False


def test_guards_bound_a_random_model(tok, tiny_model):
    c = pd(tok, tiny_model, max_tokens=30).generate(Request(0, "hello"))
    assert c.status == "truncated" and sum(t.stream == 0 for t in c.tokens) <= 30
    c = pd(
        tok,
        tiny_model,
        forced_plan=entry_text("a", 1) + "<sync/>" + entry_text("b", 1) + "<sync/>",
        length_scale=2,
        max_rounds=1,
    ).generate(Request(0, "x"))
    assert c.stop_reason == "max_rounds" and len([e for e in c.events if e["event"] == "round"]) == 1
    with pytest.raises(ValueError, match="order"):
        pd(tok, tiny_model, order="random")
    with pytest.raises(ValueError, match="steps_ratio"):
        pd(tok, tiny_model, steps_ratio=0)


def test_masked_diffusion_fixed_steps(tok, tiny_model):
    c = MaskedDiffusionEngine(tiny_model, tok, length=12, steps=4).generate(Request(0, "hi"))
    assert c.steps == 4 and len(c.output_ids) == 14 and c.events[0]["finished_at"] == 4
    c = MaskedDiffusionEngine(tiny_model, tok, length=6).generate(Request(0, "hi"))
    assert c.steps == 6
    c = MaskedDiffusionEngine(tiny_model, tok, length=6, confidence_threshold=1e-9).generate(Request(0, "hi"))
    assert c.steps == 1


def test_masked_diffusion_span_is_bounded_by_max_tokens(tok, tiny_model):
    """The span is the whole answer: the default span fits `max_tokens`, a longer span asked for
    is refused (was: a 144-token span whatever --max-tokens said)."""
    eng = MaskedDiffusionEngine(tiny_model, tok, GenerationConfig(max_tokens=5))
    c = eng.generate(Request(0, "hi"))
    assert eng.length == 5 and c.steps == 5 and len(c.output_ids) == 5 + 2  # the span and its two tags
    assert MaskedDiffusionEngine(tiny_model, tok, GenerationConfig(max_tokens=500)).length == 144
    c = MaskedDiffusionEngine(tiny_model, tok, GenerationConfig(max_tokens=12), length=12).generate(Request(0, "hi"))
    assert c.steps == 12 and len(c.output_ids) == 14
    with pytest.raises(UsageError, match="length 13 exceeds max_tokens 12"):
        MaskedDiffusionEngine(tiny_model, tok, GenerationConfig(max_tokens=12), length=13)


def test_hybrid_training_sequence(tok):
    meta = {"parts": ["ab\n", "cde\n"], "topics": ["a", "c"], "closing": "z"}
    ids, segs = lay_out(tok, "p", annotate(meta, tok))
    n = len(prefix_ids(tok, "p"))
    seq = hybrid_seq(tok, ids, segs, n, random.Random(3))
    kinds = [s.kind for s in segs for _ in range(s.length)]
    # entries are fused tokens: `<promise>-<topic>` a ` 1</topic>`
    topic_end = max(i for i, t in enumerate(ids) if t == tok.token_id(" 1</topic>"))
    assert seq.targets[topic_end] == tok.token_id("<sync/>")  # the plan's last token predicts the end, after the spans
    assert seq.targets[n - 2] == IGNORE and seq.targets[n - 1] == tok.token_id("<promise>-<topic>")
    tags = {tok.token_id("<async>"), tok.token_id("</async>")}
    for i, k in enumerate(kinds):
        if k == "span" and ids[i] in tags:
            assert seq.ids[i] == ids[i] and seq.targets[i] == IGNORE and seq.weights[i] == 0
        elif k == "span" and seq.ids[i] == tok.token_id("[MASK]"):
            assert seq.targets[i] == ids[i] and seq.weights[i] >= 1.0
    assert seq.mask.shape == (len(ids), len(ids))


def test_recipe_mixture_builds(tok):
    from runtime.tasks import Example

    ex = Example(
        "facts: ab,cd",
        "ab up AB rev ba len 2\ncd up CD rev dc len 2\nini AC",
        {"parts": ["ab up AB rev ba len 2\n", "cd up CD rev dc len 2\n"], "topics": ["a", "c"], "closing": "ini AC"},
    )
    rng = random.Random(0)
    pd_seq = RECIPE.make_seq(tok, ex, rng, "pd")
    mdm_seq = RECIPE.make_seq(tok, ex, rng, "mdm")
    assert tok.token_id("<promise>-<topic>") in pd_seq.ids and tok.token_id("<promise>-<topic>") not in mdm_seq.ids
    assert RECIPE.for_stage("ar").extra["eval_system"] == "sequential"


def test_cache_committed_computes_fewer_rows(tok, tiny_model):
    def denoise_rows(**kw):
        steps, _ = drain(pd(tok, tiny_model, forced_plan=PLAN, length_scale=6, **kw).run(Request(0, "hi")))
        return [s.query_tokens for s in steps if s.phase == "denoise"]

    exact, approx = denoise_rows(), denoise_rows(cache_committed=True)
    assert exact[0] == approx[0] == 8 + 14  # the first pass computes both spans whole
    assert approx[2] < exact[2] and len(approx) == len(exact) == 12
    # spans of 6 and 12 tokens, one committed a step: pass i >= 1 computes each active span's masked
    # rows (L - i) and the row it committed in pass i - 1; the pass after span 1 finished (i = 6)
    # refreshes only its last commit, not its whole span (exact: every row of active spans, and
    # span 1's 8 rows once more after it finished)
    assert approx == [22] + [(6 - i + 1 if i < 6 else 1 if i == 6 else 0) + (12 - i + 1) for i in range(1, 12)]
    assert exact == [22] * 6 + [14 + 8] + [14] * 5


def test_layout_holds_exactly_the_models_positions():
    lay = Layout(6, kv=None)
    assert lay.append("ar", [1] * 4) == range(0, 4) and lay.append("span", [2, 3]) == range(4, 6)
    with pytest.raises(UsageError, match="sequence of 7 tokens exceeds the model's 6 positions"):
        lay.append("ar", [1])


def test_steps_round_the_ratio_and_knobs_are_checked():
    assert steps_for(3, 0.9) == 3 and steps_for(7, 0.5) == 4 and steps_for(10, 0.01) == 1  # round, at least 1
    for bad, match in (
        (dict(steps_ratio=float("inf")), "steps_ratio"),
        (dict(threshold=1.5), "confidence_threshold"),
        (dict(threshold=-0.1), "confidence_threshold"),
        (dict(length_scale=0.0), "length_scale"),
    ):
        kw = dict(steps_ratio=1.0, order="entropy", threshold=None, length_scale=1.0) | bad
        with pytest.raises(ValueError, match=match):
            check_knobs(**kw)


def test_unmasking_orders_rank_as_documented():
    """entropy: the most certain row first; margin: the largest top-1 minus top-2 gap, which can
    differ from max_prob's ranking."""
    probs = torch.tensor([[0.9, 0.05, 0.05, 0.0], [0.4, 0.3, 0.3, 0.0]])
    chosen = probs.argmax(-1)
    e = order_scores(probs, chosen, "entropy")
    assert e[0] > e[1]
    probs = torch.tensor([[0.5, 0.49, 0.01, 0.0], [0.4, 0.2, 0.2, 0.2]])
    chosen = probs.argmax(-1)
    assert order_scores(probs, chosen, "max_prob")[0] > order_scores(probs, chosen, "max_prob")[1]
    m = order_scores(probs, chosen, "margin")
    assert m[1] > m[0] and torch.allclose(m, torch.tensor([0.01, 0.2]))
