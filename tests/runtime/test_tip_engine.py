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
