"""Validation: replay a measured trace on its own hardware and model, and report the error.

What: the cost model is calibrated (`simulator.calibrate.fit_cost_params_to_steps`) on the
measured steps of half of the trace's requests (even positions) and checked on the other half:
- `step_time_mape_percent`: mean absolute percentage error of each held-out forward pass's
  predicted time against its measured `duration_s`;
- `request_latency_mape_percent`: the held-out requests replayed as they were captured (`solm
  capture` runs one request at a time: a closed loop of one client, batches of one) against their
  measured end-to-end latency (`e2e_s`), and the same for TTFT.

Two facts of the capturing runtime are mirrored, each measured on the calibration half only: the
runtime computes logits for every query row (vLLM only for the last row of each sequence), and
the host spends a little time between passes (the recorder's bookkeeping), added per pass.

    from simulator.validation import validate
    validate("traces/sequential-tiny")["request_latency_mape_percent"]

Why "its own hardware": the trace's `meta.json` names the device; a CPU capture is the CPU it
recorded at capture (`device.cpu`: model, cores, clock; `simulator.hardware.cpu_spec`; a trace
older than that record falls back on this machine's CPU and says so in `hardware_source`), a GPU
capture the catalog part of that name.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from profiler.errors import TraceError, UnknownName, UsageError
from profiler.reader import Trace
from profiler.validate import read_valid_trace
from simulator.calibrate import fit_cost_params_to_steps
from simulator.cost import CostModel
from simulator.hardware import (
    HARDWARE,
    HardwareSpec,
    cpu_spec,
    get_hardware,
    host_cpu_spec,
)
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, replay
from simulator.workload import from_trace

# Substrings of CUDA device names -> catalog parts, most specific first.
_CUDA_NAMES: tuple[tuple[str, str], ...] = (
    ("H100 PCIe", "h100-pcie"),
    ("H100", "h100-sxm"),
    ("H200", "h200"),
    ("B200", "b200"),
    ("L40S", "l40s"),
    ("L4", "l4"),
    ("A100", "a100"),
    ("A10", "a10"),
    ("A40", "a40"),
    ("MI300X", "mi300x"),
)


def trace_hardware(meta: dict) -> HardwareSpec:
    """The catalog part (or this host's CPU spec) a measured trace ran on; KeyError if none matches."""
    device = meta.get("device") or {}
    if device.get("type") == "cpu":  # the CPU the trace recorded at capture; this machine's only for older traces
        cores = _recorded_cores(device, meta)
        if isinstance(device.get("cpu"), dict):
            return cpu_spec(device["cpu"], cores, origin="recorded at capture")
        spec = host_cpu_spec(cores)
        return dataclasses.replace(
            spec,
            source=f"the trace records no CPU (captured before solm recorded one), so "
            f"{spec.source.replace('this host', 'this machine now')}",
        )
    name = str(device.get("name", ""))
    for needle, part in _CUDA_NAMES:
        if needle.lower() in name.lower():
            if part == "a100":
                part = "a100-80g" if int(device.get("memory_bytes") or 80 * 2**30) > 48 * 2**30 else "a100-40g"
            return get_hardware(part)
    raise UnknownName(f"trace device {name!r} matches no catalog part ({', '.join(sorted(HARDWARE))}); pass --hardware")


def _recorded_cores(device: dict, meta: dict) -> int | None:
    """The cores a CPU trace ran on (device.threads, else host.cores; None when neither says); a
    value that is not a whole number >= 1 is a TraceError (was: int('two'), an internal error)."""
    cores = device.get("threads") or (meta.get("host") or {}).get("cores")
    if not cores:
        return None
    if (
        isinstance(cores, bool)
        or not isinstance(cores, (int, float))
        or not math.isfinite(cores)
        or cores != int(cores)
        or cores < 1
    ):
        raise TraceError(f"meta.json: device.threads (or host.cores) must be a whole number of cores, got {cores!r}")
    return int(cores)


PASS_COLUMNS = ["query_tokens", "kv_tokens_read", "duration_s", "active_streams", "requests"]


def pass_frame(steps) -> pd.DataFrame:
    """One row per forward pass, in pass order: `PASS_COLUMNS`, its `start_s`, the engines' `host_s`
    and the forward alone, `forward_s` (each NaN where a trace does not record it).

    Rows that share a `batch_index` >= 0 are one batched pass (a serving trace): its rows are every
    row it computed (`batch_query_tokens`: re-prefill and prefill-chunk rows included), its KV read
    the keys its attention actually scored (`attention_kv_tokens`: with the runtime's mask attention
    every row times the pool's slots; a batch-1 trace copies `kv_tokens_read` there), its duration
    once; a trace is read so when a pass holds several rows or a row is a chunk (a serving trace at
    one request a pass). Otherwise (a batch-1 trace) every row with query tokens is its own pass."""
    frame = _pass_frame(steps)
    bad = np.flatnonzero(~(np.isfinite(frame["duration_s"].to_numpy(float)) & (frame["duration_s"] > 0)))
    if len(bad):  # was: a fit to them ended in scipy's ValueError, an internal error
        raise TraceError(
            f"steps.parquet: pass {bad[0]} took {float(frame['duration_s'].iloc[bad[0]]):g} s; a measured pass takes a "
            f"finite time > 0 (solm inspect --validate lists the trace's problems)"
        )
    return frame


def _pass_frame(steps) -> pd.DataFrame:
    b = steps["batch_index"].to_numpy(np.int64) if len(steps) else np.zeros(0, np.int64)
    chunk = steps["chunk"].astype(bool) if "chunk" in steps else pd.Series(False, index=steps.index)
    # a serving trace: a pass holds several rows, or a chunk row (only a server writes one) is a pass of
    # its own (was: one request a pass, a low load, read as batch-1 and its chunk passes dropped)
    if len(b) and (b >= 0).all() and (len(np.unique(b)) < len(b) or chunk.any()):
        # a chunk row computes one stream's rows and samples nothing (its host_s is NaN)
        g = steps.assign(
            host_s=steps["host_s"].where(~chunk, 0.0), active_streams=steps["active_streams"] + chunk
        ).groupby("batch_index", sort=True)
        return pd.DataFrame(
            {
                "query_tokens": np.maximum(g["query_tokens"].sum(), g["batch_query_tokens"].max()),
                "kv_tokens_read": g["attention_kv_tokens"].sum(),
                "duration_s": g["duration_s"].max(),
                "active_streams": g["active_streams"].sum(),
                "requests": g.size(),
                "start_s": g["start_s"].min(),
                "host_s": g["host_s"].sum(min_count=1),
                "forward_s": g["forward_s"].max() if "forward_s" in steps else np.nan,
            }
        ).astype(float)
    s = steps[steps["query_tokens"] > 0]
    kv = s["attention_kv_tokens"] if "attention_kv_tokens" in s else s["kv_tokens_read"]
    out = s[["query_tokens", "duration_s", "active_streams", "start_s"]].astype(float)
    return out.assign(
        kv_tokens_read=kv.astype(float).to_numpy(),
        requests=1.0,
        host_s=s["host_s"].astype(float).to_numpy() if "host_s" in s else np.nan,
        forward_s=s["forward_s"].astype(float).to_numpy() if "forward_s" in s else np.nan,
    ).reset_index(drop=True)


def pass_table(steps) -> np.ndarray:
    """`pass_frame`'s `PASS_COLUMNS` as an array: query_tokens, kv_tokens_read, duration_s, active_streams, requests."""
    f = pass_frame(steps)
    return f[PASS_COLUMNS].to_numpy(float) if len(f) else np.zeros((0, 5))


def step_arrays(trace: Trace, request_ids=None) -> np.ndarray:
    """Measured passes (of `request_ids`, default all) as the rows `fit_cost_params_to_steps` takes:
    query_tokens, kv_tokens_read, duration_s, active_streams (a batched pass is one row)."""
    s = trace.steps
    if request_ids is not None:
        s = s[s["request_id"].isin(request_ids)]
    return pass_table(s)[:, :4]


def _host_gap_s(trace: Trace, request_ids) -> float:
    """Median time between the end of one pass and the start of the next within a request."""
    s = trace.steps[trace.steps["request_id"].isin(request_ids)].sort_values(["request_id", "step_index"])
    end = (s["start_s"] + s["duration_s"]).to_numpy()
    start, rid = s["start_s"].to_numpy(), s["request_id"].to_numpy()
    same = rid[1:] == rid[:-1]
    gaps = (start[1:] - end[:-1])[same]
    return float(max(np.median(gaps), 0.0)) if len(gaps) else 0.0


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    ok = measured > 0
    return float(np.mean(np.abs(predicted[ok] / measured[ok] - 1)) * 100) if ok.any() else float("nan")


def _replay_as_captured(w, hw: HardwareSpec, model: ModelSpec, cost: CostModel):
    """`solm capture` runs one request at a time and computes every query row's logits."""
    w = dataclasses.replace(w, logit_tokens=w.query_tokens.copy())
    return replay(w, hw, model, ReplayConfig(concurrency=1, max_seqs=1, memory_utilization=1.0), cost=cost)


def validate(path: str | Path | Trace, hardware: HardwareSpec | str | None = None) -> dict:
    """Calibrate on even requests, check on odd ones; figures as a dict (see the module doc)."""
    trace = path if isinstance(path, Trace) else read_valid_trace(path)  # a Trace: e.g. profiler.runs.single_run's view
    if trace.kind != "measured":
        raise UsageError(f"{trace.path}: validate needs a measured trace, this one is {trace.kind}")
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware or trace_hardware(trace.meta)
    model = ModelSpec.from_trace_meta(trace.meta)
    req = trace.requests.sort_values("request_id").reset_index(drop=True)
    usable = req[(req["status"] != "error") & (req["steps"] > 0)]
    if len(usable) < 2:
        raise UsageError(
            f"{trace.path}: validation needs at least 2 requests with forward passes "
            f"(one to calibrate on, one to check), found {len(usable)}"
        )
    calib_ids = usable["request_id"].to_numpy()[0::2]
    check_ids = usable["request_id"].to_numpy()[1::2]
    calib = step_arrays(trace, calib_ids)
    if len(calib) < 4:
        raise UsageError(f"{trace.path}: the calibration half has {len(calib)} forward passes; need >= 4")
    params = fit_cost_params_to_steps(hw, model, calib)
    gap_s = _host_gap_s(trace, calib_ids)
    cost = CostModel(hw, model, params)

    check = step_arrays(trace, check_ids)
    predicted = np.asarray(cost.step_time_s(check[:, 0], check[:, 1], check[:, 3]), float)
    step_mape = _mape(predicted, check[:, 2])

    w = from_trace(trace)
    positions = np.flatnonzero(np.isin(w.request_ids, check_ids))
    per_pass = dataclasses.replace(params, step_overhead_s=params.step_overhead_s + gap_s)
    res = _replay_as_captured(w.take(positions), hw, model, CostModel(hw, model, per_pass))
    measured = req.set_index("request_id").loc[check_ids]
    sim = res.requests
    return {
        "trace": str(trace.path),
        "system": trace.system,
        "hardware": hw.name,
        "hardware_source": hw.source,
        "model": model.name,
        "calibration_requests": int(len(calib_ids)),
        "check_requests": int(len(check_ids)),
        "calibration_steps": int(len(calib)),
        "check_steps": int(len(check)),
        "step_time_mape_percent": step_mape,
        "step_time_median_ape_percent": float(np.median(np.abs(predicted / check[:, 2] - 1)) * 100),
        "request_latency_mape_percent": _mape(sim["e2e_s"].to_numpy(), measured["e2e_s"].to_numpy()),
        "ttft_mape_percent": _mape(sim["ttft_s"].to_numpy(), measured["ttft_s"].to_numpy()),
        "measured_e2e_s_mean": float(measured["e2e_s"].mean()),
        "simulated_e2e_s_mean": float(sim["e2e_s"].mean()),
        "host_gap_s": gap_s,
        "step_overhead_s": float(params.step_overhead_s),
        "cost_params": params.source,
    }


def cross_check(path: str | Path, hardware: HardwareSpec | str | None = None) -> dict:
    """Predict a measured trace from its structure and a catalog part alone, then compare.

    Unlike `validate`, nothing is fitted to the trace: the cost model is the part's default
    (the catalog spec with the A100-calibrated efficiencies for GPUs, priors for CPUs), the
    workload is the trace's structure (`from_trace`), replayed one request at a time as captured.
    On a GPU trace this is the tie-in the real-scale issue asks for: what the simulator would have
    said about that GPU before anyone measured it."""
    trace = read_valid_trace(path)
    if trace.kind != "measured":
        raise UsageError(f"{trace.path}: cross_check needs a measured trace, this one is {trace.kind}")
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware or trace_hardware(trace.meta)
    model = ModelSpec.from_trace_meta(trace.meta)
    cost = CostModel(hw, model)
    res = _replay_as_captured(from_trace(trace), hw, model, cost)
    req = trace.requests.set_index("request_id")
    sim = res.requests.set_index("request_id")
    ids = [i for i in sim.index if i in req.index and req.loc[i, "steps"] > 0]
    steps = step_arrays(trace, ids)
    predicted = np.asarray(cost.step_time_s(steps[:, 0], steps[:, 1], steps[:, 3]), float)
    return {
        "trace": str(trace.path),
        "system": trace.system,
        "hardware": hw.name,
        "hardware_source": hw.source,
        "model": model.name,
        "requests": len(ids),
        "cost_params": cost.params.source,
        "step_time_mape_percent": _mape(predicted, steps[:, 2]),
        "request_latency_mape_percent": _mape(sim.loc[ids, "e2e_s"].to_numpy(), req.loc[ids, "e2e_s"].to_numpy()),
        "measured_e2e_s_mean": float(req.loc[ids, "e2e_s"].mean()),
        "simulated_e2e_s_mean": float(sim.loc[ids, "e2e_s"].mean()),
    }
