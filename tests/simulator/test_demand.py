"""`simulator.demand.next_demand` on a hand-made replay state: chunks of a prefill and of a re-prefill
after preemption, and the pages and live KV a chunk holds."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from simulator.demand import next_demand
from simulator.workload import PHASE_CODE

PREFILL, DECODE = PHASE_CODE["prefill"], PHASE_CODE["decode"]


def _state(ptr: int, recompute: bool = False) -> SimpleNamespace:
    """One request of three passes: a 10-token prefill, a 1-token decode, an 8-token prefill (a second
    turn); KV held after each 10, 11, 19 tokens; pages of 4 tokens; the request at pass `ptr`."""
    alloc = np.array([10, 11, 19])
    w = SimpleNamespace(
        query_tokens=np.array([10, 1, 8]),
        kv_tokens_read=np.array([55, 11, 124]),
        query_groups=np.array([1, 1, 1]),
        logit_tokens=np.array([1, 1, 1]),
        live_kv_tokens=alloc.copy(),
        alloc_kv_tokens=alloc,
        emits=np.array([1, 1, 1]),
        phase=np.array([PREFILL, DECODE, PREFILL]),
    )
    return SimpleNamespace(
        w=w,
        off=np.array([0]),
        ptr=np.array([ptr]),
        blocks=-(-alloc // 4),
        recompute=np.array([recompute]),
        chunk_done=np.array([0]),
        redo=np.array([10 if recompute else 0]),
        config=SimpleNamespace(block_size=4),
        all_usual=lambda rs: not recompute,
    )


def test_a_chunk_of_a_later_prefill_holds_what_the_last_pass_held_plus_its_share():
    """Half of the second turn's 8 rows: KV 11 + 4 = 15 tokens, 4 pages; no token emitted."""
    d = next_demand(_state(ptr=2), [0], limit=[4])
    assert (d.query[0], d.final[0], d.emits[0], d.live[0], d.blocks[0]) == (4, False, 0, 15, 4)


def test_a_re_prefill_after_preemption_is_chunked_from_an_empty_pool():
    """Preempted before its decode: the next pass re-prefills the 10 tokens it held on top of its 1
    row (11 rows, a prefill); a budget of 5 runs 5 of them as a chunk, counted as rebuild, holding
    5 of the 11 tokens from nothing (its KV was freed): 2 pages."""
    d = next_demand(_state(ptr=1, recompute=True), [0], limit=[5])
    assert (d.query[0], d.final[0], d.rebuild[0], d.emits[0]) == (5, False, 5, 0)
    assert (d.live[0], d.blocks[0]) == (5, 2)
    whole = next_demand(_state(ptr=1, recompute=True), [0])
    assert (whole.query[0], whole.final[0], whole.rebuild[0], whole.emits[0]) == (11, True, 10, 1)
    assert whole.kv_read[0] == 11 + 10 * 11 // 2  # its own pass's reads and the causal re-prefill's
