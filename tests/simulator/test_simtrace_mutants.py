"""The replay's figures (simulator/simtrace.py) on toy traces, each test killing mutants a mutation
round on its metrics left alive (named in the docstrings)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.replay import ReplayConfig
from simulator.simtrace import _stats
from simulator.workload import load_workload
from tests.simulator.test_replay import run
from tests.simulator.toy_traces import BLOCK_BYTES, seq, tip, write_toy_trace


@pytest.mark.parametrize("scratch", [False, True])
def test_stats_are_the_mean_median_and_p99_in_ms(scratch):
    """Skewed values tell the three apart. (Mutants: the median taken as the mean, the mean as the
    median.)"""
    values = np.array([1.0, 2.0, 3.0, 10.0])
    stats = _stats("x", values, scratch=scratch)
    assert stats["mean_x_ms"] == 4000.0 and stats["median_x_ms"] == 2500.0
    assert stats["p99_x_ms"] == pytest.approx(np.percentile([1000.0, 2000.0, 3000.0, 10000.0], 99))
    assert _stats("x", np.zeros(0)) == {"mean_x_ms": None, "median_x_ms": None, "p99_x_ms": None}


def test_a_request_that_fails_late_counts_in_no_completed_figure(tmp_path):
    """Two 4-token requests end at 2.0; a 40-token one, more than the 2-page pool, arrives at 10.0
    and fails at once. The run lasts until the last completed request (2.0 s), its input tokens
    are the completed ones' (8), and the failed request has no first-token event (no NaN time in
    the timeline). (Mutants: the duration to the failed request's end, 10.0; its 40 prompt tokens
    counted; a NaN first_token event.)"""
    w = load_workload(
        write_toy_trace(tmp_path / "t", [seq(4, 2), seq(4, 2), seq(40, 2)], [4, 4, 40], arrivals=[0.0, 0.0, 10.0])
    )
    res = run(w, ReplayConfig(kv_capacity_bytes=2 * BLOCK_BYTES))
    m = res.metrics
    assert (m["completed"], m["failed"]) == (2, 1)
    assert m["duration_s"] == 2.0 and m["total_input_tokens"] == 8
    assert m["request_throughput"] == 1.0
    timeline = res.timeline()
    assert not any(math.isnan(t) for _, _, t in timeline)
    assert [e for r, e, _ in timeline if r == 2] == ["arrive", "error"]


def test_peak_live_kv_is_the_live_tokens_not_the_pages_held(tmp_path):
    """TIP frees a dead step's KV: a request's peak live KV is the most tokens alive at once (from
    the trace's live column), below what its pages held. (Mutant: the peak of the allocated KV.)"""
    w = load_workload(write_toy_trace(tmp_path / "t", [tip(4, 4, 6)], [4]))
    res = run(w)
    live, alloc = int(w.live_kv_tokens.max()), int(w.alloc_kv_tokens.max())
    assert res.requests["peak_live_kv_tokens"].tolist() == [live]
    assert live < alloc
