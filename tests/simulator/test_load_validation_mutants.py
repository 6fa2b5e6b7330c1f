"""simulator/load_validation.py and simulator/measured_forward.py: tests that kill the mutants a
mutation round found the rest of the suite let through (each test names the mutant it kills: the
code as it would be, mutated; L: load_validation, F: measured_forward). Three survivors are
equivalent: L16, `rate_per_s` read before `rate` (no writer records both: the runtime writes
serving.rate_per_s, the simulator and the tests knobs.rate); F16, `q >= rows[-1]` for `>` (at the
last row count the extrapolation's step is 0, the interpolated value); F18, the extrapolation's
slope not floored at 0 (`fit`, the only constructor, makes both parts non-decreasing in rows)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from profiler.reader import read_trace
from simulator.load_calibration import HostCost
from simulator.load_validation import (
    _compare,
    pass_breakdown,
    pass_time_ratios,
    serving_config,
    summarize_run,
    validate_one,
)
from tests.simulator.test_load_validation import HW, MODEL, TRUTH, _FlatForward, _two_request_passes, serving_trace
from tests.simulator.toy_traces import LinearCost


def test_a_one_token_request_meets_any_tpot_objective():
    """vLLM counts a one-token request's TPOT as 0: it meets a TPOT SLO even where the server took
    a while after its token to finish it (kills L0: a TPOT of (E2E - TTFT) / 0, infinite, for it)."""
    s = summarize_run([0.0, 0.0], [0.1, 0.1], [0.12, 0.5], [1, 5], slo_tpot_ms=50.0)
    assert s["slo_attained_percent"] == pytest.approx(50.0)  # the 5-token one: 100 ms a token
    assert s["tpot_p50_ms"] == pytest.approx(100.0)  # the one-token request has no TPOT


def test_throughput_runs_from_the_first_arrival_even_a_failed_ones():
    """Requests arriving at 10, 11, 12 s, the first failed: the run still began at 10 s, so the
    duration is 4.2 s (kills L2: from the first arrival of a completed request, 3.2 s)."""
    s = summarize_run([10.0, 11.0, 12.0], [np.nan, 0.1, 0.2], [np.nan, 1.1, 2.2], [5, 11, 21])
    assert s["output_throughput"] == pytest.approx(32 / 4.2) and s["request_throughput"] == pytest.approx(2 / 4.2)


def test_summaries_are_medians_and_a_request_failed_after_its_first_token_is_not_good():
    """E2E 1, 2 and 6 s: the p50 is the median, 2 s (kills L6: the mean, 3 s). A request that got
    its first token in time but then failed (E2E NaN) did not complete: no goodput for it (kills
    L8: completion read from the TTFT)."""
    s = summarize_run([0.0, 0.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1], [1.0, 2.0, 6.0, np.nan], [2, 2, 2, 2])
    assert s["e2e_p50_ms"] == pytest.approx(2000.0)
    good = summarize_run([0.0, 0.0], [0.1, 0.1], [1.0, np.nan], [2, 2], slo_ttft_ms=1000.0)
    assert good["slo_attained_percent"] == pytest.approx(50.0) and good["request_goodput"] == pytest.approx(1.0)


def test_the_per_request_error_is_a_mean_and_throughput_error_is_on_output_tokens():
    """Three requests simulated 0 %, 0 % and 90 % off: the MAPE is 30 % (kills L13: the median, 0);
    the throughput error is the output tokens' (kills L15: the requests')."""

    def figures(e2e: list[float], tokens_per_s: float, requests_per_s: float) -> dict:
        v = np.array(e2e)
        return {"ttft": v, "tpot": v, "e2e": v, "output_throughput": tokens_per_s, "request_throughput": requests_per_s}

    _, _, errors = _compare(figures([1.0, 1.0, 1.0], 100.0, 10.0), figures([1.0, 1.0, 1.9], 110.0, 10.0))
    assert errors["e2e_mape_percent"] == pytest.approx(30.0)
    assert errors["throughput_ape_percent"] == pytest.approx(10.0)


def test_serving_config_keeps_the_traces_settings_where_an_override_is_none_and_serving_wins():
    """An override passed as None is no override (a Python caller's default), so the trace's own
    scheduler stays (kills L18: None written over it); meta["serving"]'s attention (the runtime's)
    over meta["knobs"]' (kills L19: the knobs first)."""
    c = serving_config({"knobs": {"scheduler": "sjf", "max_seqs": 3}}, MODEL, scheduler=None, max_seqs=None)
    assert (c.scheduler, c.max_seqs) == ("sjf", 3)
    both = {"knobs": {"attention": "gather"}, "serving": {"attention": "mask"}}
    assert serving_config(both, MODEL).attention == "pool"


@pytest.fixture(scope="module")
def errored(tmp_path_factory):
    """A serving run of 8 requests at 50 req/s replayed with the true cost, request 3 failed late."""
    out = serving_trace(tmp_path_factory.mktemp("lv") / "s", "seq", rate=50.0, n=8)
    df = pd.read_parquet(out / "requests.parquet")
    late = 50 * df["e2e_s"].max()
    df.loc[3, ["status", "stop_reason", "error", "ttft_s", "e2e_s"]] = ["error", "kv_pool", "no room", late, late]
    df.to_parquet(out / "requests.parquet", index=False)
    return read_trace(out), df


@pytest.mark.parametrize("system", ["seq", "pasta"])
def test_a_run_replayed_with_its_own_cost_is_reproduced_exactly(tmp_path, system):
    """A serving run simulated with the true cost and validated against that cost: every error is
    0, to rounding; the runtime computes every row's logits and so must the replay (kills L21: the
    replay's default, logits of the last row only, 0.01-0.09 % off). The mean batch is requests per
    pass, measured as simulated, not streams (kills L38: PASTA's threads counted as requests)."""
    out = serving_trace(tmp_path / "s", system, rate=200.0, n=8)
    trace = read_trace(out)
    lv = validate_one(trace, HostCost(TRUTH, 0.0, 0.0), HW, MODEL)
    assert lv["errors"] and all(v < 1e-9 for v in lv["errors"].values()), lv["errors"]
    per_pass = trace.steps.groupby("batch_index").size().mean()
    assert lv["mean_batch_measured"] == pytest.approx(per_pass) == lv["mean_batch_simulated"]
    assert lv["mean_batch_measured"] > 1


def test_goodput_counts_each_sides_own_completions_against_each_objective(errored):
    """Request 3 failed in the measured run, not in the replay: the simulated goodput counts it
    (kills L22: the measured run's completions for the simulated run's). A TTFT objective at the
    measured median: the attainment is the share of requests with TTFT under it, from the table
    (kills L23: the TTFT objective taken as the TPOT one, which every request meets)."""
    trace, df = errored
    lv = validate_one(trace, HostCost(TRUTH, 0.0, 0.0), HW, MODEL, slo_tpot_ms=1e6)
    assert lv["measured"]["slo_attained_percent"] == pytest.approx(87.5)
    assert lv["simulated"]["slo_attained_percent"] == pytest.approx(100.0)
    slo = float(df.loc[df["status"] != "error", "ttft_s"].median() * 1e3)
    lv = validate_one(trace, HostCost(TRUTH, 0.0, 0.0), HW, MODEL, slo_ttft_ms=slo)
    good = (df["status"] != "error") & (df["ttft_s"] * 1e3 <= slo)
    assert 0 < good.sum() < 7
    assert lv["measured"]["slo_attained_percent"] == pytest.approx(100 * good.sum() / 8)


def test_a_serving_trace_of_another_model_is_refused(tmp_path):
    """The same system with another model cannot be predicted from this calibration: one UsageError
    naming both (kills L37: only the system compared)."""
    import json

    from profiler.errors import UsageError
    from simulator.load_validation import validate_load
    from tests.simulator.test_load_validation import _requests
    from tests.simulator.toy_traces import write_toy_trace

    reqs, prompts = _requests(4, "seq")
    batch1 = write_toy_trace(tmp_path / "b1", reqs, prompts, timed_by=TRUTH, system="seq")
    other = serving_trace(tmp_path / "s", "seq", rate=50.0, n=4)
    meta = json.loads((other / "meta.json").read_text())
    meta["model"]["name"] = "another-model"
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UsageError, match="seq with another-model cannot be predicted from a calibration of seq"):
        validate_load([other], batch1)


class _PerStream:
    """A forward of 1 ms per stream in the pass."""

    def step_time_s(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        return 0.001 * np.asarray(query_groups, float)


def test_pass_time_error_costs_a_pass_by_its_streams():
    """Four batched passes of 2 requests with 2 streams each (4 streams), each forward timed at
    4 ms: a forward of 1 ms a stream is exact (kills L25: costed by the requests, 2 ms, 50 % off)."""
    from simulator.load_validation import _pass_time_mape

    steps = pd.DataFrame(_two_request_passes()).assign(active_streams=2, forward_s=0.004, step_index=0)
    _, mape = _pass_time_mape(type("T", (), {"steps": steps})(), HostCost(_PerStream(), 0.0, 0.0))
    assert mape == pytest.approx(0.0)


def test_back_to_back_passes_need_every_pass_batched_and_a_short_wait_is_no_idle():
    """One row not batched (batch_index -1) makes the trace no batched run: no ratios (kills L26,
    only a trace of no batched row refused); an idle wait of 5 ms, 10x over 0.1 ms, is one (kills
    L28: the threshold raised to 100 ms); the ratios are keyed by requests in the pass, not
    streams (kills L31)."""
    cost = HostCost(_FlatForward(), per_pass_s=5e-5, per_stream_s=0.0, per_request_s=1e-4)
    mixed = pd.DataFrame(_two_request_passes())
    mixed.loc[0, "batch_index"] = -1
    assert pass_time_ratios(type("T", (), {"steps": mixed})(), cost).shape == (0, 2)
    waited = pd.DataFrame(_two_request_passes()).assign(active_streams=3)
    waited.loc[waited["batch_index"] >= 2, "start_s"] += 0.005  # an idle wait before pass 2
    ratios = pass_time_ratios(type("T", (), {"steps": waited})(), cost)
    assert ratios.shape == (2, 2) and np.allclose(ratios[:, 0], 2)


def test_pass_breakdown_predicts_host_work_by_rows_and_streams_and_needs_the_host_time():
    """2 requests of 4 rows in 1 stream each: host work 1 ms a row and 10 ms a stream, 8 x 1 + 2 x 10
    = 28 ms a pass (kills L32: rows and streams swapped, 8 x 10 + 2 x 1 = 82 ms);
    a pass with no host time recorded is left out (kills L35: NaN rows kept)."""
    cost = HostCost(LinearCost(), per_pass_s=0.0, per_stream_s=0.01, per_row_s=0.001)
    rows = pd.DataFrame(_two_request_passes(query_tokens=4))
    b = pass_breakdown(type("T", (), {"steps": rows})(), cost)
    assert np.allclose(b[:, 4], 0.028)
    rows.loc[rows["batch_index"] == 1, "host_s"] = np.nan
    b = pass_breakdown(type("T", (), {"steps": rows})(), cost)
    assert b.shape[0] == 2 and np.isfinite(b).all()


# ---- simulator/measured_forward.py -------------------------------------------------------------

ROWS, SLOTS = (1, 2, 4, 8), (64, 256, 1024)


def _truth(rows, span):
    """2 ms + 0.3 ms from 2 rows on + 10 us a row, and per slot of the span 0.2 us + 0.05 us a row."""
    rows = np.asarray(rows, float)
    return 0.002 + np.where(rows > 1, 0.0003, 0.0) + 1e-5 * rows + (2e-7 + 5e-8 * rows) * span


def _sweep(rows=ROWS, slots=SLOTS, time=_truth):
    return np.array([[r, r * s, time(r, s), r] for r in rows for s in slots], float)


def test_a_sweep_of_two_spans_per_row_count_is_a_line_and_one_span_is_its_median():
    """Two spans per row count are enough for the line over the span (kills F8: three needed, else
    the median and no per-slot part); a row count timed at one span three times, once 3x slower,
    is the median of its three timings, the spike left out (kills F9: their mean)."""
    from simulator.measured_forward import SweepForward

    f = SweepForward.fit(_sweep(slots=(64, 1024)))
    assert f.step_time_s(4, 4 * 512, 4) == pytest.approx(_truth(4, 512), rel=1e-6)
    one = np.array([[r, r * 256, _truth(r, 256) * k, r] for r in (1, 2) for k in (1.0, 1.0, 3.0)])
    g = SweepForward.fit(one)
    assert g.per_slot_s == (0.0, 0.0) and g.fixed_s == pytest.approx((_truth(1, 256), _truth(2, 256)))


def test_a_row_count_timed_faster_than_a_smaller_one_is_raised_to_it():
    """8 rows timed 10 % faster than 4 rows, at every span (a quiet moment of the machine): the
    grid's fixed and per-slot parts never fall with the rows, so 8 rows cost what 4 do (kills F10,
    F11: either part left to fall; the suite's dip was exactly as fast as 4 rows, not faster)."""
    from simulator.measured_forward import SweepForward

    dip = _sweep()
    at8 = dip[:, 0] == 8
    dip[at8, 2] = 0.9 * _truth(4, dip[at8, 1] / 8)
    f = SweepForward.fit(dip)
    assert f.fixed_s[3] == pytest.approx(f.fixed_s[2]) and f.per_slot_s[3] == pytest.approx(f.per_slot_s[2])
    spans = (64, 1024, 4096)
    assert all(f.step_time_s(8, 8 * s, 8) >= f.step_time_s(4, 4 * s, 4) * (1 - 1e-9) for s in spans)


def test_the_calibrations_own_passes_carry_the_grid_by_their_median():
    """Three decode passes run 1.0, 1.1 and 1.6 times the grid: the decode factor is their median,
    1.1 (kills F14: the mean, 1.23)."""
    from simulator.measured_forward import SweepForward

    own = np.array([[1, 64, k * _truth(1, 64), 1] for k in (1.0, 1.1, 1.6)])
    assert SweepForward.fit(_sweep(), own).scale == pytest.approx(1.1, rel=1e-6)


def test_untimed_passes_and_passes_of_no_rows_are_left_out_of_a_fit():
    """A line fitted on passes plus one of 0 rows and one timed at 0 s is the line fitted without
    them (kills F0: a pass of no rows kept, its span a division by 0; F1: a pass of 0 s kept, its
    relative error a division by 0)."""
    from simulator.measured_forward import LineForward

    rng = np.random.default_rng(1)
    q = rng.integers(1, 40, 30).astype(float)
    kv = q * rng.integers(16, 1024, 30)
    p = np.column_stack([q, kv, 0.002 + 3e-5 * q + 4e-7 * kv / q + 3e-8 * kv, q])
    want = LineForward.fit(p)
    got = LineForward.fit(np.vstack([p, [[0, 0, 0.002, 1], [4, 400, 0.0, 1]]]))
    assert (got.fixed_s, got.per_row_s, got.per_span_s, got.per_key_s) == pytest.approx(
        (want.fixed_s, want.per_row_s, want.per_span_s, want.per_key_s), rel=1e-6
    )


def test_a_pass_of_no_rows_costs_the_fixed_part():
    """A pass of no query rows (a chunk row's share, a pass costed before its rows) reads its span as
    of one row: finite, the fixed part plus its keys (kills F4, F5: arrays and scalars divided by 0
    rows; F20: the sweep's rows not floored at 1)."""
    from simulator.measured_forward import LineForward, SweepForward

    line = LineForward(0.002, 1e-5, 1e-7, 1e-8)
    assert line.step_time_s(0, 0) == pytest.approx(0.002) and line.step_time_s(0, 100) == pytest.approx(0.002 + 1.1e-5)
    assert np.allclose(line.step_time_s(np.array([0.0, 0.0]), np.array([0.0, 100.0])), [0.002, 0.002 + 1.1e-5])
    grid = SweepForward.fit(_sweep())
    assert grid.step_time_s(0, 0, 0) == pytest.approx(grid.step_time_s(1, 0, 1))
    assert np.allclose(
        grid.step_time_s(np.zeros(2), np.array([0.0, 64.0]), 0), grid.step_time_s(np.ones(2), np.array([0.0, 64.0]), 1)
    )


def test_a_fit_never_takes_a_negative_part():
    """A row count whose time falls as its span grows (the cache warmer at larger pools) gets no
    per-slot part, not a negative one that would price a long span below an empty one (kills F24:
    the fit unbounded)."""
    from simulator.measured_forward import SweepForward

    falling = _sweep(rows=(1, 2), time=lambda r, s: 0.003 - 5e-7 * s + 1e-4 * r)
    f = SweepForward.fit(falling)
    assert min(f.per_slot_s) >= 0 and min(f.fixed_s) > 0
    assert f.step_time_s(2, 2 * 4096, 2) >= f.step_time_s(2, 0, 2)
