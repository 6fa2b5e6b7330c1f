"""Validation: calibrate on half a measured trace, check on the other half."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simulator.cost import CostModel, CostParams
from simulator.hardware import host_cpu_spec
from simulator.models import ModelSpec
from simulator.validation import cross_check, trace_hardware, validate
from tests.simulator.toy_traces import MODEL_META, seq, write_toy_trace


def test_recovers_a_trace_timed_by_a_known_cost_model(tmp_path):
    hw = host_cpu_spec(2)
    model = ModelSpec.from_trace_meta(MODEL_META)
    prior = CostParams.prior(hw)
    truth = CostModel(hw, model, dataclasses.replace(prior, step_overhead_s=0.002))
    reqs = [seq(6 + 3 * i, 8 + i) for i in range(6)]
    trace = write_toy_trace(tmp_path / "t", reqs, [6 + 3 * i for i in range(6)], timed_by=truth)
    v = validate(trace)
    assert v["calibration_requests"] == 3 and v["check_requests"] == 3 and v["hardware"] == "host-cpu-2c"
    assert v["step_time_mape_percent"] < 1.0 and v["request_latency_mape_percent"] < 1.0


def test_real_capture(small_trace):
    v = validate(small_trace)
    for key in ("step_time_mape_percent", "request_latency_mape_percent", "ttft_mape_percent"):
        assert math.isfinite(v[key]) and v[key] >= 0
    assert v["calibration_requests"] == 2 and v["check_requests"] == 1 and v["model"] == "tiny-2l"


def test_refuses_simulated_trace(tmp_path, small_trace):
    from simulator.hardware import get_hardware
    from simulator.models import get_model
    from simulator.replay import replay
    from simulator.simtrace import write_simulated_trace
    from simulator.workload import load_workload

    res = replay(load_workload(small_trace), get_hardware("a100-80g"), get_model("llama-3-8b"))
    out = write_simulated_trace(res, tmp_path / "sim")
    with pytest.raises(ValueError, match="needs a measured trace"):
        validate(out)


def test_trace_hardware():
    assert trace_hardware({"device": {"type": "cpu", "threads": 2}}).name == "host-cpu-2c"
    assert trace_hardware({"device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}}).name == "h100-sxm"
    assert trace_hardware({"device": {"type": "cuda", "name": "NVIDIA H100 PCIe"}}).name == "h100-pcie"
    assert trace_hardware({"device": {"type": "cuda", "name": "NVIDIA A100-SXM4-40GB",
                                      "memory_bytes": 40 * 2**30}}).name == "a100-40g"
    assert trace_hardware({"device": {"type": "cuda", "name": "NVIDIA L40S"}}).name == "l40s"
    with pytest.raises(KeyError, match="matches no catalog part"):
        trace_hardware({"device": {"type": "cuda", "name": "Tesla K80"}})


def test_cross_check_predicts_a_gpu_trace_from_the_catalog_alone(tmp_path):
    """A trace whose passes took what the catalog H200's default cost model says is predicted
    exactly without fitting anything to it; a slower device shows up as the error it is."""
    from simulator.hardware import get_hardware

    model = ModelSpec.from_trace_meta(MODEL_META)
    h200 = get_hardware("h200")
    reqs, prompts = [seq(8, 6), seq(20, 10)], [8, 20]
    gpu = {"name": "NVIDIA H200", "type": "cuda", "memory_bytes": 141 * 2**30}
    exact = write_toy_trace(tmp_path / "exact", reqs, prompts, timed_by=CostModel(h200, model), device=gpu)
    c = cross_check(exact)
    assert c["hardware"] == "h200" and c["requests"] == 2 and c["cost_params"] == CostModel(h200, model).params.source
    assert c["step_time_mape_percent"] < 0.5 and c["request_latency_mape_percent"] < 0.5
    slow = CostModel(h200, model, dataclasses.replace(CostModel(h200, model).params, step_overhead_s=0.01))
    off = cross_check(write_toy_trace(tmp_path / "slow", reqs, prompts, timed_by=slow, device=gpu))
    assert off["request_latency_mape_percent"] > 10 and off["measured_e2e_s_mean"] > off["simulated_e2e_s_mean"]
