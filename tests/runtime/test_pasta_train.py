"""PASTA preference stage: the structure of a candidate, the structural sampler, and the reward
that lets two lambdas choose different structures."""

from __future__ import annotations

import torch

from runtime.engines import GenerationConfig, Request
from runtime.lang.pasta import PROMISE_OPEN, SYNC, promise_close
from runtime.train.pasta import StructureSampler, rank_candidates, structure_of
from tests.runtime.test_pasta_engine import Scripted


def promise(tok, topic: str) -> list[int]:
    return tok.encode(PROMISE_OPEN + topic + promise_close(10))


def test_structure_of_candidates(tiny_model, tok):
    sync = tok.token_id(SYNC)
    three = [*promise(tok, "a"), *promise(tok, "b"), *promise(tok, "c")]
    scripts = {
        "all": [*three, sync, *b"ok"],
        "all+eager": [*three, *b"ok", sync],
        "some": [*promise(tok, "a"), *promise(tok, "b"), sync, *b"ok"],
        "none": list(b"plain answer"),
    }
    for want, script in scripts.items():
        eng = Scripted(tiny_model, tok, GenerationConfig(max_tokens=64), script=script, chunk=4)
        c = eng.generate(Request(0, "facts: ab,cd,ef"))
        assert c.status == "ok", (want, c.events)
        assert structure_of(c, 3, sync) == want


def test_structure_sampler_samples_only_between_structures(tiny_model, tok):
    fused_a, fused_b, sync = tok.token_id(PROMISE_OPEN + "a"), tok.token_id(PROMISE_OPEN + "b"), tok.token_id(SYNC)
    V = tiny_model.cfg.vocab_size

    def row(first: int, second: int) -> torch.Tensor:
        x = torch.full((V,), -10.0)
        x[first], x[second] = 1.0, 0.9
        return x

    logits = torch.stack([row(97, 98), row(fused_a, fused_b), row(97, fused_a), row(sync, 97)])
    picks = [
        StructureSampler(tiny_model, tok, GenerationConfig(), 2.0, seed).choose(None, [], logits, None)
        for seed in range(40)
    ]
    # two bytes, or two topics of a promise: greedy; a promise or <sync/> against text: sampled
    assert {p[0] for p in picks} == {97} and {p[1] for p in picks} == {fused_a}
    assert {p[2] for p in picks} == {97, fused_a} and {p[3] for p in picks} == {sync, 97}


def test_reward_lets_a_high_lambda_drop_a_structure_that_is_right_by_luck():
    # map_numbers-like: writing the closing part before <sync/> (eager) is faster but right only on
    # some prompts; on prompt 0 it happens to be right.
    def cand(structure, q, speedup):
        return {"structure": structure, "q": q, "speedup": speedup}

    per_prompt = [
        ("map", None, [cand("all", 1.0, 2.5), cand("all+eager", 1.0, 2.9), cand("none", 1.0, 1.0)]),
        ("map", None, [cand("all", 1.0, 2.5), cand("all+eager", 0.85, 2.9), cand("none", 1.0, 1.0)]),
        ("map", None, [cand("all", 1.0, 2.5), cand("all+eager", 0.85, 2.9)]),
        ("stats", None, [cand("all", 1.0, 2.5), cand("all+eager", 1.0, 2.9)]),
    ]
    fast, expected, counts = rank_candidates(per_prompt, lam=0.5, structure_weight=0.5)
    assert expected[("map", "all+eager")] == (1.0 + 0.85 + 0.85) / 3 and counts[("map", "all")] == 3
    assert [per_prompt[i][2][b]["structure"] for i, (b, _) in enumerate(fast)] == ["all+eager"] * 4
    quality, _, _ = rank_candidates(per_prompt, lam=50, structure_weight=0.5)
    assert [per_prompt[i][2][b]["structure"] for i, (b, _) in enumerate(quality)] == ["all", "all", "all", "all+eager"]
    # the candidate's own quality alone (weight 0): a lucky eager answer wins at any lambda
    own, _, _ = rank_candidates(per_prompt, lam=50, structure_weight=0.0)
    assert per_prompt[0][2][own[0][0]]["structure"] == "all+eager"
    # nothing to learn from a prompt whose candidates all score the same
    assert rank_candidates([("map", None, [cand("all", 1.0, 2.5)] * 2)], 1.0, 0.5)[0] == [None]
