"""The hybrid attention pattern: its rules, and the engine running with exactly the training mask."""

from __future__ import annotations

import pytest
import torch

from runtime.engines.base import GenerationConfig, Request
from runtime.engines.diffusion_common import Seg, hybrid_mask
from runtime.engines.planned_diffusion import PlannedDiffusionEngine
from runtime.lang.planned_diffusion import Round, Span, entry_text
from runtime.train.planned_diffusion import lay_out

# prompt(2) plan(2) | span A (3) | span B (3) | sync | text(2)
SEGS = [Seg("ar", 4), Seg("span", 3), Seg("span", 3), Seg("sync", 1), Seg("ar", 2)]


def test_rules_block_sparse():
    m = hybrid_mask(SEGS, block_sparse=True).int()
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # prompt/plan: causal
            [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # span A: itself + before its round
            [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0],  # span B: blind to its sibling
            [1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0],  # <sync/> sees both spans
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        ]
    )
    assert torch.equal(m, expected)


def test_rules_dense_and_no_sync():
    dense = hybrid_mask(SEGS, block_sparse=False)
    assert dense[4:10, 4:10].all()  # siblings see each other
    assert torch.equal(dense[10:], hybrid_mask(SEGS, True)[10:])  # AR rows do not change
    ends = hybrid_mask([Seg("ar", 2), Seg("span", 3), Seg("ar", 1)])
    assert not ends[5, 2:5].any()  # a token after spans with no <sync/> does not see them
    rows = hybrid_mask(SEGS, True, rows=[3, 8, 11])
    assert torch.equal(rows, hybrid_mask(SEGS, True)[[3, 8, 11]])


class Spy:
    """Wraps a model; records (positions, slots, visibility) of every forward pass."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, tokens, positions, slots, visibility, kv, **kw):
        self.calls.append((positions.tolist(), slots.tolist(), visibility.clone()))
        return self.model(tokens, positions, slots, visibility, kv, **kw)


PLAN = entry_text("a", 1) + entry_text("b", 2) + "<sync/>xy<eos>"


@pytest.mark.parametrize("block_sparse", [True, False])
def test_engine_visibility_equals_training_mask(tok, tiny_model, block_sparse):
    spy = Spy(tiny_model)
    eng = PlannedDiffusionEngine(
        spy, tok, GenerationConfig(max_tokens=64), forced_plan=PLAN, length_scale=3, block_sparse=block_sparse
    )
    eng.generate(Request(0, "hi"))
    rounds = [Round((), (Span("a", 1, ()), Span("b", 2, ())), "sync"), Round(tuple(tok.encode("xy")), (), "eos")]
    ids, segs = lay_out(tok, "hi", rounds, unit=3)
    train = hybrid_mask(segs, block_sparse)
    pos_of = {}
    for positions, slots, _ in spy.calls:
        pos_of.update(zip(slots, positions))
    assert sorted(pos_of.values()) == list(range(len(ids) - 1))  # every token but the final <eos> was computed
    rows_checked = 0
    for positions, _slots, vis in spy.calls:
        for r, p in enumerate(positions):
            seen = sorted(pos_of[s] for s in vis[r].nonzero().flatten().tolist())
            assert seen == train[p].nonzero().flatten().tolist(), f"row at position {p}"
            rows_checked += 1
    assert rows_checked > len(ids)


# PD-SA only: there a span's K/V depend on nothing but its own tokens and the prefix, so caching a
# finished span is exact. Under the dense mask (PD) a finished span's K/V would change with its
# still-active siblings; the engine caches them anyway, as the official code does.
@pytest.mark.parametrize("block_sparse", [True])
@pytest.mark.parametrize(
    "kw", [{}, {"steps_ratio": 0.5, "order": "margin"}, {"confidence_threshold": 0.002, "order": "max_prob"}]
)
def test_cache_equals_recompute(tok, tiny_model, block_sparse, kw):
    runs = []
    for recompute in (False, True):
        eng = PlannedDiffusionEngine(
            tiny_model,
            tok,
            GenerationConfig(max_tokens=64),
            forced_plan=PLAN,
            length_scale=4,
            block_sparse=block_sparse,
            recompute_all=recompute,
            **kw,
        )
        runs.append(eng.generate(Request(0, "hello")))
    assert runs[0].output_ids == runs[1].output_ids
