"""simulator/workload.py, simulator/slo.py, simulator/demand.py: what tests/simulator/test_workload.py,
test_goodput.py and test_demand.py left unpinned (a mutation round: 57 mutants, 29 killed by those
three files, 2 equivalent, 26 killed here; chasing the recompute clamps in `own_passes` found a bug,
fixed with test_workload.py::test_a_runtime_capture_recompute_is_not_taken_out_of_its_own_rows).

Equivalent: `drop_duplicates(keep="first")` for "last" in `own_passes` (the rows it keeps, every
whole pass's row and a request's trailing chunk, never share a pass id: it drops nothing);
dropping `pos >= len(ids)` in `_pass_offsets` (a request id past the last one is caught by the id
comparison at `min(pos, len(ids) - 1)`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from profiler.reader import TraceError, read_trace
from simulator.demand import next_demand
from simulator.slo import goodput
from simulator.workload import MAX_CONTEXT_TOKENS, from_trace, own_passes, uniform
from tests.simulator.test_demand import _state
from tests.simulator.toy_traces import seq, write_toy_trace


@pytest.fixture
def two(tmp_path):
    """Two sequential requests (prompt 4: 3 passes; prompt 6: 5 passes), read back as a Trace."""
    return read_trace(write_toy_trace(tmp_path / "t", [seq(4, 3), seq(6, 5)], [4, 6], arrivals=[5.0, 7.5]))


def _with_steps(trace, **columns):
    steps = trace.steps.copy()
    for name, values in columns.items():
        steps[name] = values
    return dataclasses.replace(trace, steps=steps)


# ---- workload: take, cycle, per-request maxima ------------------------------------------
def test_a_cycled_workload_indexes_its_shared_passes_and_counts_each_repeat(two):
    """`cycle` shares the source's pass arrays: request r's passes sit at `pass_starts[r]`, and the
    total counts every repeat (kills pass_starts ignoring `starts`, cycle passing no starts, and
    total_passes as the length of the shared arrays)."""
    w = from_trace(two)
    c = w.cycle([1, 0, 1])
    assert c.passes(0) == w.passes(1) and c.passes(1) == w.passes(0) and c.passes(2) == w.passes(1)
    assert c.total_passes() == 5 + 3 + 5 and len(c.query_tokens) == 8
    assert c.peak_alloc_tokens().tolist() == [16, 16, 16]


def test_a_request_without_passes_peaks_at_nothing(two):
    """A request with no steps rows (one that failed before its first pass) holds no KV (kills
    `n_passes >= 0` in per_request_max: reduceat of an empty range reads its neighbour's value)."""
    trace = dataclasses.replace(two, steps=two.steps[two.steps["request_id"] != 0], tokens=two.tokens.iloc[:0])
    w = from_trace(trace)
    assert w.n_passes.tolist() == [0, 5] and w.peak_alloc_tokens().tolist() == [0, 16]


def test_take_refuses_a_negative_position_and_a_take_of_a_take_names_the_source(two):
    w = from_trace(two)
    with pytest.raises(ValueError, match="positions must index 0..1"):
        w.take([-1])
    assert w.take([1, 0]).take([0, 0]).source_ids().tolist() == [1, 1]


def test_quality_mean_skips_nan_and_is_nan_when_none_scored():
    w = uniform(3, 4, 2)
    assert np.isnan(w.quality_mean)
    assert dataclasses.replace(w, quality_score=np.array([0.5, np.nan, 1.0])).quality_mean == 0.75


# ---- workload: from_trace ---------------------------------------------------------------
def test_unsorted_tables_read_as_sorted_ones(two):
    """requests.parquet and steps.parquet in any row order give the same workload (kills dropping
    either sort in from_trace)."""
    w = from_trace(two)
    shuffled = dataclasses.replace(
        two, requests=two.requests.iloc[::-1], steps=two.steps.sample(frac=1.0, random_state=0)
    )
    back = from_trace(shuffled)
    assert back.request_ids.tolist() == [0, 1] and back.prompt_tokens.tolist() == [4, 6]
    assert back.passes(0) == w.passes(0) and back.passes(1) == w.passes(1)


def test_streams_are_capped_at_the_pass_rows(two):
    """A pass of 1 row cannot have 3 query groups (kills dropping the clip's upper bound)."""
    w = from_trace(_with_steps(two, active_streams=[1, 3, 1, 1, 1, 1, 1, 1]))
    assert w.query_groups.tolist() == [1, 1, 1, 1, 1, 1, 1, 1]


def test_allocation_rounds_bytes_up_to_tokens_and_holds_at_least_the_live_kv(two):
    """512 bytes a token: 5 * 512 + 1 bytes hold 6 tokens (ceil); an unknown allocation (-1, a
    serving capture's chunk row) or 0 still holds the live tokens."""
    w = from_trace(_with_steps(two, kv_bytes_allocated=[5 * 512 + 1, -1, 0, 512, 512, 512, 512, 512]))
    assert w.alloc_kv_tokens.tolist()[:3] == [6, 5, 6]  # live 4, 5, 6


def test_a_pass_over_a_context_and_negative_kv_reads_are_trace_errors(two):
    q = two.steps["query_tokens"].to_numpy().copy()
    q[0] = MAX_CONTEXT_TOKENS + 1
    with pytest.raises(TraceError, match="more than a 1048576-token"):
        from_trace(_with_steps(two, query_tokens=q))
    q[0] = MAX_CONTEXT_TOKENS  # a full context is allowed
    assert from_trace(_with_steps(two, query_tokens=q)).query_tokens[0] == MAX_CONTEXT_TOKENS
    kv = two.steps["kv_tokens_read"].to_numpy().copy()
    kv[3] = -1
    with pytest.raises(TraceError, match="negative query_tokens or kv_tokens_read"):
        from_trace(_with_steps(two, kv_tokens_read=kv))


def test_arrivals_count_from_the_first_and_an_unknown_one_is_zero(two):
    assert from_trace(two).arrival_s.tolist() == [0.0, 2.5]
    req = two.requests.copy()
    req["arrival_s"] = [np.nan, 7.5]
    assert from_trace(dataclasses.replace(two, requests=req)).arrival_s.tolist() == [0.0, 0.0]


def test_token_rows_past_a_request_pass_are_not_counted_and_requests_without_rows_keep_their_column(two):
    """A token row whose step_index is past its request's passes is dropped, not counted into the
    next request's first pass; a request with no token rows keeps steps.emitted_tokens."""
    toks = two.tokens.copy()
    toks.loc[toks.index[0], "step_index"] = 3  # request 0 has passes 0..2
    w = from_trace(dataclasses.replace(two, tokens=toks))
    assert w.emits.tolist() == [0, 1, 1, 1, 1, 1, 1, 1]
    only_first = dataclasses.replace(two, tokens=two.tokens[two.tokens["request_id"] == 0])
    steps = two.steps.copy()
    steps.loc[steps["request_id"] == 1, "emitted_tokens"] = 2
    assert from_trace(dataclasses.replace(only_first, steps=steps)).emits.tolist() == [1, 1, 1, 2, 2, 2, 2, 2]


def test_a_kv_bytes_per_token_of_zero_counts_live_tokens(two):
    w = from_trace(dataclasses.replace(two, meta={**two.meta, "model": {**two.meta["model"], "kv_bytes_per_token": 0}}))
    assert w.alloc_kv_tokens.tolist() == w.live_kv_tokens.tolist()


def test_own_passes_takes_out_at_most_the_rows_a_pass_has():
    """A recompute count larger than the pass's rows leaves it no rows and reads less by the
    causal reads of its rows only (kills dropping the clamps `max(q - rc, 0)`, `min(rc, q)`)."""
    cols = ["request_id", "step_index", "query_tokens", "kv_tokens_read", "live_kv_tokens", "emitted_tokens", "note"]
    steps = pd.DataFrame([(0, 0, 1, 10, 10, 1, "recompute after preemption (9 tokens)")], columns=cols)
    out, _ = own_passes(steps, pd.DataFrame({"request_id": [], "step_index": []}))
    assert out[["query_tokens", "kv_tokens_read"]].values.tolist() == [[0, 9]]


def test_uniform_needs_an_output_token():
    with pytest.raises(ValueError, match="output_tokens >= 1"):
        uniform(1, 4, 0)


# ---- slo ----------------------------------------------------------------------------------
def test_goodput_echoes_each_objective_it_was_given():
    g = goodput([0.1], [0.01], [True], 1.0, slo_ttft_ms=200)
    assert (g["slo_ttft_ms"], g["slo_tpot_ms"]) == (200, None)
    g = goodput([0.1], [0.01], [True], 1.0, slo_tpot_ms=50)
    assert (g["slo_ttft_ms"], g["slo_tpot_ms"]) == (None, 50)


# ---- demand -------------------------------------------------------------------------------
def test_a_pass_that_fits_the_budget_exactly_is_the_recorded_pass():
    """A sync pass of no rows asked about with a budget of 0 is the workload's own (no stream, no
    logit), not a re-prefill's one-group stand-in (kills `>` for `>=` on the fast path)."""
    state = _state(ptr=1)
    state.w.query_tokens = np.array([10, 0, 8])
    state.w.query_groups = np.array([1, 0, 1])
    state.w.logit_tokens = np.array([1, 0, 1])
    d = next_demand(state, [0], limit=[0])
    assert (d.query[0], d.groups[0], d.logits[0], d.final[0]) == (0, 0, 0, True)


def test_a_chunk_grows_the_live_kv_from_the_live_kv_not_the_pages_held():
    """Held before the second turn: 11 live tokens in pages for 16; half of its 8 rows: 11 + 4 = 15
    live tokens, pages for 16 + 2 = 18 tokens (5 pages of 4) (kills growing live KV from the pages)."""
    state = _state(ptr=2)
    state.w.live_kv_tokens = np.array([10, 11, 19])
    state.w.alloc_kv_tokens = np.array([12, 16, 20])
    d = next_demand(state, [0], limit=[4])
    assert (d.live[0], d.blocks[0], d.final[0]) == (15, 5, False)


def test_a_later_chunk_holds_the_share_of_every_row_run_so_far():
    """2 of the second turn's 8 rows done, 4 more now: 6 of 8 reached, 11 + 6 = 17 live tokens,
    pages for 17 (5 of 4) (kills the share counting only this chunk's rows: 15, 4 pages)."""
    state = _state(ptr=2)
    state.chunk_done = np.array([2])
    d = next_demand(state, [0], limit=[4])
    assert (d.query[0], d.live[0], d.blocks[0], d.final[0]) == (4, 17, 5, False)
