"""The CPU forward as measured: the rows sweep's grid carried by the calibration's own passes, or a line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from profiler.errors import UsageError
from profiler.reader import read_trace
from simulator.cost import CostModel
from simulator.load_calibration import calibrate_batch1
from simulator.measured_forward import LineForward, SweepForward
from tests.simulator.test_load_validation import HW, MODEL, TRUTH, _requests
from tests.simulator.toy_traces import write_toy_trace

ROWS, SLOTS = (1, 2, 4, 8), (64, 256, 1024)


def truth(rows, span):
    """A forward that steps from 1 to 2 rows (a GEMV becomes a GEMM) and grows per slot more with rows."""
    rows = np.asarray(rows, float)
    return 0.002 + np.where(rows > 1, 0.0003, 0.0) + 1e-5 * rows + (2e-7 + 5e-8 * rows) * span


def sweep(rows=ROWS, slots=SLOTS):
    return np.array([[r, r * s, truth(r, s), r] for r in rows for s in slots], float)


def test_the_grid_is_exact_on_its_rows_and_linear_between_them():
    f = SweepForward.fit(sweep())
    for r in ROWS:
        for s in (100, 700):
            assert f.step_time_s(r, r * s, r) == pytest.approx(truth(r, s), rel=1e-6)
    # 6 rows lie halfway between 4 and 8: both the fixed part and the per-slot part are averaged
    assert f.step_time_s(6, 6 * 300, 6) == pytest.approx((truth(4, 300) + truth(8, 300)) / 2, rel=1e-6)
    # the same as arrays
    q = np.array([1.0, 6.0, 8.0])
    assert np.allclose(f.step_time_s(q, q * 300, q), [f.step_time_s(x, x * 300, x) for x in q])


def test_beyond_the_grid_it_extrapolates_along_the_last_two_and_never_falls():
    f = SweepForward.fit(sweep())
    at8, at16 = f.step_time_s(8, 8 * 256, 8), f.step_time_s(16, 16 * 256, 16)
    assert at16 == pytest.approx(truth(16, 256), rel=1e-6)  # the truth is linear above 2 rows
    dip = sweep()
    dip[dip[:, 0] == 8, 2] = truth(4, dip[dip[:, 0] == 8, 1] / 8)  # 8 rows timed as fast as 4 (a quiet moment)
    g = SweepForward.fit(dip)
    times = [g.step_time_s(r, r * 256, r) for r in (1, 2, 4, 6, 8, 12, 32)]
    assert all(b >= a for a, b in zip(times, times[1:])) and at16 > at8


def test_the_calibrations_own_passes_carry_the_grid_per_kind_of_pass():
    decode = np.array([[1, 64, 1.1 * truth(1, 64), 1], [2, 512, 1.1 * truth(2, 256), 2]])
    prefill = np.array([[24, 24 * 30, 1.3 * truth(24, 30), 1]])
    f = SweepForward.fit(sweep(rows=(1, 2, 4, 8, 16, 32)), np.vstack([decode, prefill]))
    assert f.scale == pytest.approx(1.1, rel=1e-6) and f.prefill_scale == pytest.approx(1.3, rel=1e-6)
    assert f.step_time_s(4, 4 * 100, 4) == pytest.approx(1.1 * truth(4, 100), rel=1e-6)  # a row per stream
    assert f.step_time_s(12, 12 * 100, 3) == pytest.approx(1.3 * truth(12, 100), rel=1e-6)  # a multi-row stream
    only_decode = SweepForward.fit(sweep(), decode)
    assert only_decode.prefill_scale == pytest.approx(1.1, rel=1e-6)  # no multi-row pass: the decode factor


def test_a_line_recovers_its_coefficients_and_ignores_one_spike():
    rng = np.random.default_rng(0)
    q = rng.integers(1, 40, 60).astype(float)
    kv = q * rng.integers(16, 1024, 60)
    t = 0.002 + 3e-5 * q + 4e-7 * kv / q + 3e-8 * kv
    exact = LineForward.fit(np.column_stack([q, kv, t, q]))
    assert (exact.fixed_s, exact.per_row_s, exact.per_span_s, exact.per_key_s) == pytest.approx(
        (0.002, 3e-5, 4e-7, 3e-8), rel=1e-4
    )
    spiked = t.copy()
    spiked[5] *= 3  # another process took the core
    f = LineForward.fit(np.column_stack([q, kv, spiked, q]))
    clean = np.arange(60) != 5
    assert np.abs(f.step_time_s(q, kv)[clean] / t[clean] - 1).max() < 0.01
    with pytest.raises(UsageError):
        LineForward.fit(np.column_stack([q, kv, t, q])[:3])
    with pytest.raises(UsageError):
        SweepForward.fit(sweep(rows=(4,)))


def _with_sweep(tmp_path, passes):
    reqs, prompts = _requests(12, "seq")
    path = write_toy_trace(tmp_path / "b1", reqs, prompts, timed_by=TRUTH, system="seq")
    meta = json.loads((path / "meta.json").read_text())
    rows = [{"rows": int(r), "slots": int(k / r), "keys": int(k), "duration_s": float(d)} for r, k, d, _ in passes]
    (path / "meta.json").write_text(json.dumps({**meta, "rows_sweep": {"passes": rows}}))
    return read_trace(path)


def test_the_calibration_takes_the_measured_forward_on_a_cpu_trace(tmp_path):
    trace = _with_sweep(tmp_path, sweep())
    assert trace.meta["device"]["type"] == "cpu"
    assert isinstance(calibrate_batch1(trace, HW, MODEL).forward, SweepForward)
    assert isinstance(calibrate_batch1(trace, HW, MODEL, rows_sweep=False).forward, LineForward)
    assert isinstance(calibrate_batch1(trace, HW, MODEL, forward_fit="roofline").forward, CostModel)
    assert "row counts 1-8" in calibrate_batch1(trace, HW, MODEL).source
    with pytest.raises(UsageError, match="forward fit"):
        calibrate_batch1(trace, HW, MODEL, forward_fit="guess")
