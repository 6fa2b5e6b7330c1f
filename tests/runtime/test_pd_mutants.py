"""Mutation round on runtime/engines/planned_diffusion.py: the facts the tests of test_pd_engine.py
and test_pd_mask.py left open (each test names the mutants it kills; see the commit message)."""

from __future__ import annotations

import json

import pytest

from runtime.engines.base import GenerationConfig, Request, drain
from runtime.engines.planned_diffusion import PlannedDiffusionEngine
from runtime.kv import RequestKV
from runtime.lang.planned_diffusion import entry_text
from tests.runtime.test_pd_mask import Spy


def pd(tok, model, max_tokens=64, **kw):
    return PlannedDiffusionEngine(model, tok, GenerationConfig(max_tokens=max_tokens), **kw)


# two rounds: spans a, b side by side, then span c after the first <sync/>
TWO_ROUNDS = entry_text("a", 1) + entry_text("b", 1) + "<sync/>" + entry_text("c", 1) + "<sync/>xy<eos>"


def test_text_sampled_after_a_round_is_the_same_cached_or_recomputed(tok, tiny_model):
    """The plan forced up to its `<sync/>`, then sampled: the cached run equals the
    recompute-everything run token for token (kills: an AR pass sampling from its first row, not
    its last; test_cache_equals_recompute forces the text after the `<sync/>`, so it saw no
    sampled AR token after a round. A dropped refresh of the round's last spans did not change
    this random model's greedy tokens: test_each_pass_reports_the_rows_and_kv_it_computed
    checks those rows)."""
    plan = entry_text("a", 1) + entry_text("b", 2) + "<sync/>"
    runs = [
        pd(tok, tiny_model, max_tokens=16, forced_plan=plan, length_scale=3, recompute_all=r).generate(
            Request(0, "hello")
        )
        for r in (False, True)
    ]
    n_forced = len(tok.encode(plan))
    sampled = [t for t in runs[0].tokens if t.stream == 0][n_forced:]
    assert sampled  # some of the text after the round was sampled, not forced
    assert runs[0].output_ids == runs[1].output_ids


def test_each_pass_reports_the_rows_and_kv_it_computed(tok, tiny_model):
    """Every step's query_tokens and kv_tokens_read are the rows of the forward pass it stands for
    and the slots those rows saw, AR passes and denoising passes alike; the pass after a round
    refreshes the spans that finished in its last pass (kills: an AR step's query_tokens one short;
    the finished spans' refresh rows dropped after the round)."""
    spy = Spy(tiny_model)
    steps, c = drain(pd(tok, spy, forced_plan=TWO_ROUNDS, length_scale=2).run(Request(0, "hi")))
    assert len(steps) == len(spy.calls) and {s.phase for s in steps} == {"prefill", "plan", "denoise", "sync"}
    for s, (positions, _, vis) in zip(steps, spy.calls):
        assert s.query_tokens == len(positions) and s.kv_tokens_read == int(vis.sum()), s
    assert steps[0].query_tokens == c.prompt_tokens
    assert all(s.query_tokens == 1 for s in steps if s.phase == "plan")
    # the <sync/> pass after a round recomputes the spans that finished in the round's last pass
    # (their K/V still hold the [MASK]s committed there): round 0's two spans, then round 1's one
    span_rows = {sid: sorted(t.position_id for t in c.tokens if t.stream == sid) for sid in (1, 2, 3)}
    syncs = [positions for s, (positions, _, _) in zip(steps, spy.calls) if s.phase == "sync"]
    assert [sorted(p[:-1]) for p in syncs] == [span_rows[1] + span_rows[2], span_rows[3]]


def test_spans_see_older_rounds_never_their_siblings_and_rounds_are_recorded_apart(tok, tiny_model):
    """PD-SA: a span token sees the prompt, the AR stream, every span of earlier rounds and its own
    span, never a sibling of its round. Each round's event lists its own spans only, and a span's
    two tags belong to its round's first denoising pass (where they are first fed), its content to
    the pass that unmasked it (kills: older rounds' spans left out of the visible streams; the
    round's first span counted as older; a round denoising every span laid out so far; tags
    stamped one pass late)."""
    steps, c = drain(pd(tok, tiny_model, forced_plan=TWO_ROUNDS, length_scale=2).run(Request(0, "hi")))
    vis = {t.stream: set() for t in c.tokens if t.stream > 0}
    for t in c.tokens:
        if t.stream > 0:
            vis[t.stream].add(t.visible_streams)
    assert vis == {1: {(-1, 0, 1)}, 2: {(-1, 0, 2)}, 3: {(-1, 0, 1, 2, 3)}}
    rounds = [e for e in c.events if e["event"] == "round"]
    assert [r["span_lengths"] for r in rounds] == [[2, 2], [2]]
    assert [r["finished_at"] for r in rounds] == [[2, 2], [2]] and [r["denoise_steps"] for r in rounds] == [2, 2]
    denoise = {}  # round -> its denoising steps' indices
    for s in steps:
        if s.phase == "denoise":
            denoise.setdefault(json.loads(s.note)["round"], []).append(s.step_index)
    assert [len(v) for v in denoise.values()] == [2, 2]
    for sid, rnd in ((1, 0), (2, 0), (3, 1)):
        toks = [t for t in c.tokens if t.stream == sid]
        assert [t.step_index for t in toks if t.kind == "tag"] == [denoise[rnd][0]] * 2
        assert sorted(t.step_index for t in toks if t.kind != "tag") == denoise[rnd]  # one a pass


def test_a_run_without_spans_has_no_round_and_no_span_verdict(tok, tiny_model):
    """A model that writes its answer without a plan: no round, and `spans_finish_at_length` is
    None (no spans to judge), not True (kills: the verdict of no spans True)."""
    c = pd(tok, tiny_model, forced_plan="xy<eos>").generate(Request(0, "hi"))
    ev = next(e for e in c.events if e["event"] == "pd")
    assert (ev["rounds"], ev["spans"], ev["denoise_passes"]) == (0, 0, 0)
    assert ev["spans_finish_at_length"] is None and c.text == "xy" and c.status == "ok"
    assert [n["id"] for n in c.graph["nodes"]] == ["prompt", "plan:0"]


def test_the_unfed_last_token_has_no_slot_and_every_fed_token_its_own(tok, tiny_model):
    """A run stopped at max_tokens: its last token was sampled but never fed, so kv_slot -1; every
    other token has its own slot (kills: the unfed token given slot 0, the prompt's first)."""
    c = pd(tok, tiny_model, max_tokens=5, forced_plan="x" * 40).generate(Request(0, "hi"))
    assert c.stop_reason == "max_tokens" and len(c.output_ids) == 5
    slots = [t.kv_slot for t in c.tokens]
    assert slots[-1] == -1 and min(slots[:-1]) >= 0 and len(set(slots[:-1])) == 4


def test_the_kv_reservation_bounds_a_run_at_its_guards(tok, tiny_model):
    """`max_kv_tokens` (what a server reserves) holds the KV of a run that reaches every guard at
    once: the plan uses up max_tokens with max_spans entries of max_span_tokens each (kills: each
    span reserved one tag short)."""
    L, max_spans = 4, 3
    plan = "".join(entry_text(c, 1) for c in "abc") + "<sync/>"
    eng = pd(
        tok,
        tiny_model,
        max_tokens=len(tok.encode(plan)),
        forced_plan=plan,
        length_scale=L,
        max_spans=max_spans,
        max_span_tokens=L,
        max_rounds=1,
    )
    st = eng.start(Request(0, "hi"), RequestKV(eng.new_store(), 0))
    peak = 0
    while not st.done:
        inp = st.inputs()
        logits, _ = eng.forward([inp], st.kv.store)
        peak = max(peak, st.after(logits, None).live_kv_tokens)
    c = st.completion()
    assert c.stop_reason == "max_rounds" and [n["length"] for n in c.graph["nodes"] if n["kind"] == "span"] == [L] * 3
    assert peak == c.prompt_tokens + len(tok.encode(plan)) - 1 + max_spans * (L + 2)  # all but the last <sync/>
    assert peak <= st.max_kv_tokens()


def _small_model(max_positions):
    import dataclasses

    from runtime.model import ModelConfig, TinyLM

    return TinyLM(dataclasses.replace(ModelConfig.from_name("tiny-2l"), max_positions=max_positions), seed=1).eval()


@pytest.mark.parametrize(
    "plan,knobs,max_positions,stop",
    [
        (entry_text("a", 1) + entry_text("b", 2) + "<sync/>xy<eos>", {}, 64, "stop_token"),
        ("x" * 40, {}, 64, "max_tokens"),
        (entry_text("a", 1) + "<sync/>" + entry_text("b", 1) + "<sync/>", {"max_rounds": 1}, 64, "max_rounds"),
        (entry_text("a", 1) + "<sync/>xy<eos>", {}, 12, "max_positions"),  # the round's spans would not fit
    ],
)
def test_every_token_a_pass_emits_is_in_the_output_at_that_pass(tok, tiny_model, plan, knobs, max_positions, stop):
    """Whatever stops the run, each token a pass emits is in the output, stamped with that pass
    (span tags aside: laid out, not sampled), and the output fills the positions after the prompt
    (was: the `<sync/>` sampled when max_rounds stops the run, or the end token of a round whose
    spans would not fit, left out of the output though its pass emitted it)."""
    model = tiny_model if max_positions == 64 else _small_model(max_positions)
    eng = pd(tok, model, max_tokens=8 if stop == "max_tokens" else 64, forced_plan=plan, length_scale=4, **knobs)
    steps, c = drain(eng.run(Request(0, "hi")))
    assert c.stop_reason == stop
    for s in steps:
        got = [
            t.token_id for t in c.tokens if t.step_index == s.step_index and (s.phase != "denoise" or t.kind != "tag")
        ]
        assert sorted(got) == sorted(s.emitted), s
    assert sorted(t.position_id for t in c.tokens) == list(range(c.prompt_tokens, c.prompt_tokens + len(c.tokens)))
    last_ar = [s for s in steps if s.phase != "denoise"][-1]
    assert c.tokens[-1].token_id == last_ar.emitted[0] and c.tokens[-1].kv_slot == -1  # sampled, never fed


@pytest.mark.parametrize("block_sparse", [True, False])
def test_preempted_mid_round_replays_all_but_the_round_and_matches_alone(tok, tiny_model, block_sparse):
    """Preempted after a denoising pass of the second round: the readmission re-prefills every
    token laid out before the round (the prompt, the plan, round 0's spans, the text between), not
    the round's span rows, which its next pass computes anyway; the text and every step's notes
    and live KV are the run alone's. Was: the replay re-fed the round's spans too."""
    from runtime.server import FakeClock, Server
    from tests.runtime.test_tip_mutants import PreemptOnce

    def engine():
        return pd(tok, tiny_model, forced_plan=TWO_ROUNDS, length_scale=2, block_sparse=block_sparse)

    alone_steps, alone = drain(engine().run(Request(0, "hi")))
    notes = [json.loads(s.note) for s in alone_steps]
    # the second round's first denoising pass; the preemption comes before the pass after it
    first = next(i for i, (s, n) in enumerate(zip(alone_steps, notes)) if s.phase == "denoise" and n["round"] == 1)
    out = Server(engine(), scheduler=PreemptOnce(first + 2, chunk=None), clock=FakeClock(), max_pages=4096).serve(
        [(0.0, "hi")]
    )
    assert out["preemptions"] == 1 and out["recomputes"] == 1
    c = out["requests"][0].completion
    assert c.output_ids == alone.output_ids
    served = [e.step for p in out["passes"] for e in p.entries if e.step]
    assert [s.note for s in served] == [s.note for s in alone_steps]
    assert [s.live_kv_tokens for s in served] == [s.live_kv_tokens for s in alone_steps]
    round1 = [t.position_id for t in c.tokens if t.stream == 3]  # span c with its tags, the second round's
    assert out["recompute_tokens"] == min(round1)  # every laid-out token before span c's opening tag
