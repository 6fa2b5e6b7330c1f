"""simulator/load_calibration.py: tests that kill the mutants a mutation round found the rest of the
suite let through (each test names the mutant it kills: the code as it would be, mutated)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulator.cost import CostModel
from simulator.hardware import get_hardware, host_cpu_spec
from simulator.load_calibration import HostCost, calibrate_batch1, pass_overhead_s, size_medians
from simulator.measured_forward import LineForward, SweepForward
from simulator.models import ModelSpec
from tests.simulator.test_load_validation import (
    _forward_s,
    _sweep,
    batch1_trace,
)  # 1 ms + 0.1 ms a row; a rows sweep of it
from tests.simulator.toy_traces import MODEL_META

MODEL = ModelSpec.from_trace_meta(MODEL_META)
HW = host_cpu_spec(2)


def _trace(rows, forward=None, host_s=0.0001, device="cpu", sweep=None):
    """One request's batch-1 passes of `rows` rows (one stream each, 10 keys a row): forward
    `forward` (default `_forward_s`; NaN: not timed apart), `host_s` of host work (NaN: not
    recorded), the pass 0.2 ms longer than both, 0.05 ms between passes, 0.55 ms queued."""
    rows = np.asarray(rows, float)
    forward = _forward_s(rows) if forward is None else np.asarray(forward, float)
    true_forward = np.where(np.isfinite(forward), forward, _forward_s(rows))
    duration = true_forward + np.nan_to_num(host_s) + 0.0002
    return batch1_trace(rows, np.ones(len(rows)), duration, host_s, forward, device, sweep)


ROWS = [8, 1, 2, 3, 4, 1, 1, 16, 2, 6]  # 7 pass sizes


class _HeadForward:
    """A forward whose time is 1 s + 1 s per logit row (all query rows unless told)."""

    def step_time_s(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        return 1.0 + (query_tokens if logit_tokens is None else logit_tokens)


def test_a_pass_is_costed_on_the_logit_rows_it_is_given():
    """The replay costs a pass on its logit rows (`step_time_s(..., logit_tokens)`): the forward
    gets them (kills L18: `forward_s` dropping `logit_tokens`, every row costed as a logit row)."""
    cost = HostCost(_HeadForward(), per_pass_s=0.5, per_stream_s=0.0)
    assert cost.forward_s(16, 0, 1, 2) == 3.0 and cost.forward_s(16, 0, 1) == 17.0
    assert cost.step_time_s(16, 0, 1, 2) == 3.5


def test_pass_sizes_of_the_same_rows_and_kv_apart_in_streams_stay_apart():
    """4 rows of one stream (a prefill) and 4 rows of 4 streams (4 decodes) are two sizes (kills
    L20: the streams left out of a size's key, the two merged into one median)."""
    steps = np.array([[4, 40, 0.001, 1], [4, 40, 0.001, 1], [4, 40, 0.003, 4], [1, 10, 0.0005, 1]], float)
    sizes = size_medians(steps)
    assert sorted(map(tuple, sizes.tolist())) == [(1, 10, 0.0005, 1), (4, 40, 0.001, 1), (4, 40, 0.003, 4)]


def test_a_trace_with_one_pass_not_timed_apart_is_calibrated_as_untimed():
    """One pass's forward not timed apart (NaN): the forward is the pass less its host work, as
    in an untimed trace, and there is no admission term (kills L25: any() for all(), the NaN
    forward fitted and the timed path taken)."""
    forward = _forward_s(ROWS)
    forward[3] = np.nan
    cost = calibrate_batch1(_trace(ROWS, forward=forward), HW, MODEL, rows_sweep=False)
    assert isinstance(cost.forward, LineForward) and cost.admission_s == 0.0
    q = np.array([1.0, 4.0, 16.0])
    assert np.allclose(cost.forward_s(q, 10 * q, 1), _forward_s(q) + 0.0002, rtol=1e-3)  # the pass less host work


def test_four_pass_sizes_are_enough_to_fit_each_size_once():
    """Exactly 4 sizes (1, 2, 4, 8 rows), the 1-row one 21 times, 9 of those held to 4 ms: the
    line is fitted on the 4 sizes' medians, the true forward (kills L29: `> 4` for `>= 4`, every
    pass fitted and the stalls pulling the line)."""
    rows = [1] * 21 + [2, 4, 8]
    forward = _forward_s(rows)
    forward[:9] = 0.004
    cost = calibrate_batch1(_trace(rows, forward=forward), HW, MODEL, rows_sweep=False)
    q = np.array([1.0, 2.0, 4.0, 8.0])
    assert isinstance(cost.forward, LineForward)
    assert np.allclose(cost.forward_s(q, 10 * q, 1), _forward_s(q), rtol=1e-4)


def test_auto_gives_a_gpu_part_the_roofline_even_from_a_cpu_trace_with_a_sweep():
    """auto measures the forward only where both the trace and the part are CPUs: a CPU trace
    with a rows sweep predicted on an H100 gets the roofline (kills L31: the part's kind left
    unchecked, the CPU's sweep taken for the GPU)."""
    trace = _trace(ROWS, sweep=_sweep([1, 4, 16]))
    assert isinstance(calibrate_batch1(trace, HW, MODEL).forward, SweepForward)  # the same trace on the CPU
    assert isinstance(calibrate_batch1(trace, get_hardware("h100-sxm"), MODEL).forward, CostModel)


def test_a_sweep_is_not_rescaled_by_passes_that_hold_host_work():
    """A trace that records no host work (schema minor < 2): its passes hold it, so they do not
    set the sweep's scales; the forward is the sweep as measured (kills L33: the passes given to
    `SweepForward.fit` anyway, every pass scaled up by its host work)."""
    cost = calibrate_batch1(_trace(ROWS, host_s=np.nan, sweep=_sweep([1, 4, 16])), HW, MODEL, forward_fit="sweep")
    assert isinstance(cost.forward, SweepForward)
    assert (cost.forward.scale, cost.forward.prefill_scale) == (1.0, 1.0)
    assert cost.forward_s(4, 4 * 256, 4) == pytest.approx(float(_forward_s(4)) + 1e-7 * 4 * 256)


def test_the_servers_own_work_per_pass_is_never_negative():
    """Passes that start before the last one's forward and host work would end (clocks that
    disagree): no negative work per pass (kills L47: the floor at 0 dropped)."""
    steps = pd.DataFrame(
        {
            "request_id": 0,
            "step_index": range(4),
            "query_tokens": 1,
            "start_s": [0.0, 0.001, 0.002, 0.003],
            "forward_s": 0.002,
            "host_s": 0.0001,
        }
    )
    assert pass_overhead_s(type("T", (), {"steps": steps})()) == 0.0


def test_auto_measures_the_forward_of_a_gpu_trace_predicted_on_its_own_part():
    """auto: a GPU trace predicted on the part it ran on gets the measured forward (the line
    through its passes), as a CPU trace on a CPU does; on another part, or from a GPU the catalog
    does not know, the roofline."""
    trace = _trace(ROWS, device="cpu")
    trace.meta["device"] = {"type": "cuda", "name": "NVIDIA H200", "memory_bytes": 141 * 2**30}
    assert isinstance(calibrate_batch1(trace, get_hardware("h200"), MODEL).forward, LineForward)
    assert isinstance(calibrate_batch1(trace, get_hardware("h100-sxm"), MODEL).forward, CostModel)
    assert isinstance(calibrate_batch1(trace, HW, MODEL).forward, CostModel)  # a GPU trace on a CPU part
    assert isinstance(calibrate_batch1(trace, get_hardware("h200"), MODEL, forward_fit="roofline").forward, CostModel)
    trace.meta["device"] = {"type": "cuda", "name": "Some Future GPU"}
    assert isinstance(calibrate_batch1(trace, get_hardware("h200"), MODEL).forward, CostModel)
