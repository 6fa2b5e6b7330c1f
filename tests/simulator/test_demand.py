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


def test_a_chunk_one_row_short_of_the_pass_is_not_its_end():
    """7 of the second turn's 8 rows: a chunk, emitting nothing; the 8th row is the pass's end."""
    d = next_demand(_state(ptr=2), [0], limit=[7])
    assert (d.query[0], d.final[0], d.emits[0]) == (7, False, 0)
    state = _state(ptr=2)
    state.chunk_done = np.array([7])
    d = next_demand(state, [0], limit=[7])
    assert (d.query[0], d.final[0], d.emits[0]) == (1, True, 1)


def test_a_chunk_reads_its_causal_share_of_the_kv_rounded_to_nearest():
    """3 of 8 rows from the start: c(3) / c(8) = 6 / 36 of the pass's 124 reads, 20.7 -> 21."""
    d = next_demand(_state(ptr=2), [0], limit=[3])
    assert d.kv_read[0] == round(124 * 6 / 36) == 21


def test_a_later_chunk_of_a_re_prefill_rebuilds_only_its_own_lost_tokens():
    """Preempted before its decode, 5 of the 11 rows (10 re-prefill + 1) already run: a chunk of
    the next 5 recomputes 5 lost tokens; one of the last 6 recomputes the other 5 and runs the
    pass's own row, which is new (not rebuild)."""
    state = _state(ptr=1, recompute=True)
    state.chunk_done = np.array([5])
    assert next_demand(state, [0], limit=[5]).rebuild[0] == 5
    last = next_demand(state, [0], limit=[6])
    assert (last.query[0], last.rebuild[0], last.final[0]) == (6, 5, True)


def test_a_re_prefill_recomputes_the_live_kv_not_the_pages_held():
    """A request holding 10 live tokens in pages reserved for 12 re-prefills the 10."""
    state = _state(ptr=1, recompute=True)
    state.w.alloc_kv_tokens = np.array([12, 12, 19])
    whole = next_demand(state, [0])
    assert (whole.query[0], whole.rebuild[0]) == (11, 10)


def test_a_re_prefill_of_a_pass_without_rows_runs_one_stream_and_one_logit():
    state = _state(ptr=1, recompute=True)
    state.w.query_tokens = np.array([10, 0, 8])
    state.w.query_groups = np.array([1, 0, 1])
    state.w.logit_tokens = np.array([1, 0, 1])
    whole = next_demand(state, [0])
    assert (whole.query[0], whole.groups[0], whole.logits[0], whole.final[0]) == (10, 1, 1, True)


def test_a_budget_below_zero_runs_no_row():
    """A prefill asked about with an overdrawn budget runs nothing: no row, no KV read, no token."""
    d = next_demand(_state(ptr=2), [0], limit=[-3])
    assert (d.query[0], d.kv_read[0], d.final[0], d.emits[0]) == (0, 0, False, 0)
