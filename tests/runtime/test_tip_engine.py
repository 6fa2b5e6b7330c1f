"""The `tip` engine on a tiny random model driven by a script (so it emits the register tags we
choose): eviction frees real pages that later tokens reuse, freeing changes memory and not
logits, the engine's visibility is exactly the training mask, baselines keep their budgets."""

from __future__ import annotations

import pytest
import torch

from runtime.engines import GenerationConfig, Request, drain
from runtime.engines.tip import TipEngine
from runtime.lang.tip import DEFAULT_REGISTERS, annotate, tip_visibility
from runtime.server import serve
from runtime.tasks import get_task


def var_example():
    return get_task("var_tracking").examples("test", 1)[0]


def scripted_engine(tiny_model, tok, text: str, page_size: int = 4, **knobs):
    """A TIP engine on a real TinyLM forward whose logits are forced to `text` (then <eos>); the
    wrapper keeps the model's own last-row logits of every pass in `own_logits`."""
    from runtime.structure_replay import ForcedLogits

    script = tok.encode(text) + [tok.eos_id]
    model = ForcedLogits(tiny_model, tok.eos_id, script=script, keep_logits=True)
    return TipEngine(model, tok, GenerationConfig(max_tokens=len(script), page_size=page_size), **knobs), model


def run_steps(engine, prompt: str):
    return drain(engine.run(Request(0, prompt)))


def annotated(ex, registers: int = DEFAULT_REGISTERS) -> str:
    return annotate(ex.meta["steps"], ex.meta["deps"], registers, ex.meta["final"]).text


def test_register_reuse_frees_pages_and_pages_are_reused(tiny_model, tok):
    ex = var_example()
    eng, _ = scripted_engine(tiny_model, tok, annotated(ex), page_size=4)
    steps, c = run_steps(eng, ex.prompt)
    assert c.status == "ok" and get_task("var_tracking").score(ex, c.text) == 1.0
    first = next(i for i, s in enumerate(steps) if s.evicted_tokens)
    assert "kills step 1" in steps[first].note
    freeing = [s for s in steps if s.freed_kv_bytes]
    assert freeing, "no page was ever released"
    for s in freeing:  # bytes held drop at the step that frees
        prev = steps[s.step_index - 1]
        assert s.kv_bytes_allocated < prev.kv_bytes_allocated + eng.model.kv_bytes_per_token * 4
    evicted_slots = {t.kv_slot for t in c.tokens if t.evicted_at_step >= 0}
    later = [t for t in c.tokens if t.kv_slot in evicted_slots and t.evicted_at_step < 0]
    assert later, "freed slots were never handed to later tokens"
    assert max(s.live_kv_tokens for s in steps) < c.prompt_tokens + len(c.output_ids) * 0.6
    # every evicted token belongs to a step that was declared dead, never to the prompt or a live step
    dead_streams = {n["stream"] for n in c.graph["nodes"] if n.get("dead_at_step", -1) >= 0}
    assert {t.stream for t in c.tokens if t.evicted_at_step >= 0} <= dead_streams


def test_page_size_one_physical_equals_logical(tiny_model, tok):
    ex = var_example()
    eng, _ = scripted_engine(tiny_model, tok, annotated(ex), page_size=1)
    steps, _ = run_steps(eng, ex.prompt)
    bpt = eng.model.kv_bytes_per_token
    assert all(s.freed_kv_bytes == s.evicted_tokens * bpt for s in steps)
    assert sum(s.evicted_tokens for s in steps) > 0


def test_freed_and_masked_give_identical_logits(tiny_model, tok):
    ex = var_example()
    text = annotated(ex)
    freed_eng, freed = scripted_engine(tiny_model, tok, text, free_pages=True)
    masked_eng, masked = scripted_engine(tiny_model, tok, text, free_pages=False)
    fs, fc = run_steps(freed_eng, ex.prompt)
    ms, mc = run_steps(masked_eng, ex.prompt)
    assert len(freed.own_logits) == len(masked.own_logits) > 10
    for a, b in zip(freed.own_logits, masked.own_logits):
        assert torch.allclose(a, b, atol=1e-5)
    assert [s.live_kv_tokens for s in fs] == [s.live_kv_tokens for s in ms]
    assert fs[-1].kv_bytes_allocated < ms[-1].kv_bytes_allocated
    assert sum(s.freed_kv_bytes for s in ms) == 0


@pytest.mark.parametrize("task", ["var_tracking", "nested_arith", "tree_reduce"])
def test_engine_visibility_is_the_training_mask(tiny_model, tok, task):
    ex = get_task(task).examples("test", 1)[0]
    text = annotated(ex)
    eng, model = scripted_engine(tiny_model, tok, text, page_size=4)
    _, c = run_steps(eng, ex.prompt)
    ids = eng.prompt_ids(Request(0, ex.prompt))
    n = len(ids)
    ids = ids + c.output_ids[:-1]  # the final <eos> is never fed
    mask, streams = tip_visibility(ids, n, tok)
    assert not mask.all(), "the script should kill some steps"
    dense = tiny_model.forward_dense(torch.tensor([ids]), torch.arange(len(ids))[None], mask[None])[0]
    engine_logits = torch.stack(model.own_logits)  # pass i predicts token n + i
    assert torch.allclose(engine_logits, dense[n - 1 :], atol=1e-4)
    assert [t.stream for t in c.tokens[:-1]] == streams[n:]


@pytest.mark.parametrize("policy,budget", [("window", 20), ("streaming", 20), ("h2o", 20), ("h2o", 9)])
def test_budget_policies_hold_their_budget(tiny_model, tok, policy, budget):
    ex = var_example()
    eng, _ = scripted_engine(tiny_model, tok, annotated(ex), policy=policy, budget_tokens=budget)
    steps, c = run_steps(eng, ex.prompt)
    assert all(s.live_kv_tokens <= budget - 1 for s in steps)
    assert c.peak_live_kv_tokens <= max(budget, c.prompt_tokens)  # a longer prompt is prefilled whole, then cut
    # the peaks are over the whole run (a pass's holdings before it evicts), not the last pass
    assert c.peak_live_kv_tokens == max(s.live_kv_tokens + s.evicted_tokens for s in steps)
    assert c.peak_kv_bytes == max(s.kv_bytes_allocated + s.freed_kv_bytes for s in steps)
    assert sum(s.evicted_tokens for s in steps) == c.prompt_tokens + len(c.output_ids) - 1 - steps[-1].live_kv_tokens
    if policy == "streaming":  # the sinks (first tokens of the prompt) are never evicted
        assert steps[-1].live_kv_tokens == budget - 1


def test_full_policy_never_evicts(tiny_model, tok):
    ex = var_example()
    eng, _ = scripted_engine(tiny_model, tok, annotated(ex), policy="full")
    steps, c = run_steps(eng, ex.prompt)
    assert sum(s.evicted_tokens for s in steps) == 0
    assert steps[-1].live_kv_tokens == c.prompt_tokens + len(c.output_ids) - 1


def test_bad_policy_settings_are_clear_errors(tiny_model, tok):
    with pytest.raises(KeyError, match="valid policies"):
        TipEngine(tiny_model, tok, policy="lru")
    with pytest.raises(ValueError, match="needs a KV budget"):
        TipEngine(tiny_model, tok, policy="h2o")
    with pytest.raises(ValueError, match="takes no budget"):
        TipEngine(tiny_model, tok, policy="full", budget_tokens=10)
    with pytest.raises(ValueError, match="registers"):
        TipEngine(tiny_model, tok, registers=17)


def test_serving_batches_requests_and_matches_single_runs(tiny_model, tok):
    prompts = [e.prompt for e in get_task("var_tracking").examples("test", 5)]
    eng = TipEngine(tiny_model, tok, GenerationConfig(max_tokens=24, page_size=4))
    single = [eng.generate(Request(i, p)).output_ids for i, p in enumerate(prompts)]
    roomy = serve(eng, prompts, pool_bytes=200 * 4 * tiny_model.kv_bytes_per_token)
    assert roomy["max_concurrency"] == 5 and roomy["preemptions"] == 0
    tight = serve(eng, prompts, pool_bytes=16 * 4 * tiny_model.kv_bytes_per_token)
    # admitted by what their next pass needs (vLLM), so a tight pool preempts; readmission re-prefills
    assert tight["requests"] == 5 and tight["preemptions"] > 0 and tight["recomputes"] > 0
    for r in (roomy, tight):
        for c, ids in zip(r["completions"], single):
            assert c.output_ids == ids


def test_max_tokens_cuts_at_exactly_max_tokens(tiny_model, tok):
    """A script that never stops: the answer is exactly `max_tokens` long, reported truncated."""
    from runtime.structure_replay import ForcedLogits

    model = ForcedLogits(tiny_model, tok.encode("a")[0], script=tok.encode("a b c " * 10))
    c = TipEngine(model, tok, GenerationConfig(max_tokens=7, page_size=4)).generate(Request(0, "hi"))
    assert len(c.output_ids) == 7 and c.stop_reason == "max_tokens" and c.status == "truncated"


def test_max_positions_stops_at_the_models_last_position(tok):
    """A model with few positions: generation stops when the sequence fills them, whatever
    `max_tokens` allows, and says why."""
    import dataclasses

    from runtime.model import ModelConfig, TinyLM
    from runtime.structure_replay import ForcedLogits

    cfg = dataclasses.replace(ModelConfig.from_name("tiny-2l"), max_positions=16)
    model = ForcedLogits(TinyLM(cfg, seed=1).eval(), tok.encode("a")[0])
    eng = TipEngine(model, tok, GenerationConfig(max_tokens=100, page_size=4))
    n = len(eng.prompt_ids(Request(0, "hi")))
    c = eng.generate(Request(0, "hi"))
    assert n + len(c.output_ids) == 16 and c.stop_reason == "max_positions" and c.status == "truncated"


def test_kv_read_counts_what_each_pass_reads(tiny_model, tok):
    """Prefill reads the causal triangle; a decode pass reads every live slot (its own included);
    a prompt cut in chunks reads, chunk by chunk, exactly the rows of that chunk's triangle."""
    from runtime.kv import RequestKV

    ex = var_example()
    eng, _ = scripted_engine(tiny_model, tok, annotated(ex), policy="full")
    steps, c = run_steps(eng, ex.prompt)
    n = c.prompt_tokens
    assert steps[0].phase == "prefill" and steps[0].kv_tokens_read == n * (n + 1) // 2
    assert all(s.kv_tokens_read == s.live_kv_tokens for s in steps[1:])  # nothing evicted: live = read
    st = eng.start(Request(1, ex.prompt), RequestKV(eng.new_store(), 1))
    reads = []
    for k in (3, 4, n - 7):
        st.prompt_chunk(k)
        reads.append(st.kv_read)
    assert reads == [1 + 2 + 3, 4 + 5 + 6 + 7, sum(range(8, n + 1))]


def test_evictions_and_graph_agree_with_the_steps(tiny_model, tok):
    """Each token records the pass that evicted it; the graph's nodes count every generated token
    once, a step's `dead_at_step` is the pass whose note says it was killed, and no step is its
    own parent."""
    import re

    ex = var_example()
    eng, _ = scripted_engine(tiny_model, tok, "so " + annotated(ex), page_size=4)  # "so ": main-stream text
    steps, c = run_steps(eng, ex.prompt)
    by_step: dict[int, int] = {}
    for t in c.tokens:
        if t.evicted_at_step >= 0:
            by_step[t.evicted_at_step] = by_step.get(t.evicted_at_step, 0) + 1
    assert by_step and by_step == {s.step_index: s.evicted_tokens for s in steps if s.evicted_tokens}
    links = c.graph["links"]
    assert links and all(link["source"] != link["target"] for link in links)
    nodes = {n["id"]: n for n in c.graph["nodes"]}
    assert nodes.pop("prompt")["tokens"] == c.prompt_tokens
    assert sum(n["tokens"] for n in nodes.values()) == len(c.output_ids)
    # the main stream (0) is `main:0`, as in every engine's graph; step k is `step:k`
    assert nodes["main:0"]["stream"] == 0 and nodes["main:0"]["kind"] == "main"
    assert all(i == f"step:{n['stream']}" for i, n in nodes.items() if n["stream"] > 0)
    assert c.steps == len(steps)
    # peaks are taken before a pass evicts: what a step holds after it, plus what it let go
    assert c.peak_kv_bytes == max(s.kv_bytes_allocated + s.freed_kv_bytes for s in steps)
    assert c.peak_live_kv_tokens == max(s.live_kv_tokens + s.evicted_tokens for s in steps)
    assert c.critical_path_tokens == len(c.output_ids)  # one stream of passes: every token is on it
    kills = {int(m.group(1)): s.step_index for s in steps if (m := re.search(r"kills step (\d+)", s.note))}
    assert kills and {n["stream"]: n["dead_at_step"] for n in nodes.values() if n["dead_at_step"] >= 0} == kills


@pytest.mark.parametrize(
    "knobs", [{"policy": "h2o", "budget_tokens": 16}, {"policy": "window", "budget_tokens": 16, "free_pages": False}]
)
def test_preempted_requests_match_single_runs(tiny_model, tok, knobs):
    """Preemption and re-prefill change nothing a request generates, whatever the policy (H2O's
    per-slot scores follow the slots); in masked mode (`free_pages=False`) nothing is freed, so a
    preempted request holds, pass by pass, exactly what it held running alone, replay included."""
    from runtime.server import Server

    prompts = [e.prompt for e in get_task("var_tracking").examples("test", 3)]
    eng = TipEngine(tiny_model, tok, GenerationConfig(max_tokens=24, page_size=4), **knobs)
    single = [drain(eng.run(Request(i, p))) for i, p in enumerate(prompts)]
    out = Server(eng, max_pages=12).serve([(0.0, p) for p in prompts])
    assert out["preemptions"] > 0
    assert [t.completion.output_ids for t in out["requests"]] == [c.output_ids for _, c in single]
    if not eng.free_pages:
        for rid, (steps, _) in enumerate(single):
            held = [
                e.step.kv_bytes_allocated for p in out["passes"] for e in p.entries if e.request_id == rid and e.step
            ]
            assert held == [s.kv_bytes_allocated for s in steps]
