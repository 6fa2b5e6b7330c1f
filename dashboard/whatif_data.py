"""What-if data for the dashboard: a trace replayed on another part, model, batch settings and
deployment (no `st.*` here; `dashboard.views.whatif` caches and lays out).

Every function takes a trace (`profiler.reader.Trace`) and the page's settings and returns plain
dicts and DataFrames in the columns `dashboard.data.pareto_points` uses, so a what-if point sits
on the same Pareto chart as the measured traces.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from dashboard.data import knobs_label
from profiler.reader import Trace
from simulator.cluster.cli import parse_disaggregate
from simulator.cluster.parallel import Parallelism
from simulator.cluster.run import ClusterConfig, simulate
from simulator.cluster.workload_file import read_workload_file, stretch
from simulator.gemm_calibration import with_gemm_calibration
from simulator.hardware import HardwareSpec, get_hardware
from simulator.models import ModelSpec, get_model
from simulator.replay import ReplayConfig, replay
from simulator.simtrace import ReplayResult
from simulator.workload import from_trace


def whatif_part(hardware: str, gemm_calibration: str | None = None) -> HardwareSpec:
    """The catalog part, with a GEMM calibration (`solm calibrate`'s CAL.json) attached when one is
    given (ValueError, one line, for a bad file or another kernel family's)."""
    part = get_hardware(hardware)
    if gemm_calibration:
        part = with_gemm_calibration(part, gemm_calibration)
    return part


def whatif_point(trace: Trace, reqs: pd.DataFrame, hardware: str, model: str | None, label: str) -> dict:
    """One Pareto point of a what-if result (same columns as `pareto_points`)."""
    q = reqs["quality_score"].dropna()
    if q.empty:  # a structure replay has no quality of its own: the source trace's
        q = trace.requests["quality_score"].dropna()
    e2e = reqs["e2e_s"].dropna()
    tokens = reqs["output_tokens"].sum()
    return {
        "label": label,
        "trace": trace.name,
        "path": str(trace.path),
        "kind": "simulated",
        "system": trace.system,
        "knobs": knobs_label(trace.meta),
        "hardware": hardware,
        "quality": float(q.mean()) if len(q) else None,
        "e2e_ms_mean": float(e2e.mean() * 1e3) if len(e2e) else None,
        "e2e_ms_p50": float(e2e.median() * 1e3) if len(e2e) else None,
        "ttft_ms_p50": float(reqs["ttft_s"].median() * 1e3) if len(reqs) else None,
        "tokens_per_s": float(tokens / e2e.sum()) if e2e.sum() > 0 else None,
        "peak_kv_bytes": float(reqs["peak_kv_bytes"].max()) if len(reqs) else None,
        "mean_live_kv_tokens": None,
    }


def whatif_run(
    trace: Trace,
    hardware: str,
    model: str | None,
    max_seqs: int,
    max_batch_tokens: int,
    rate: float | None,
    deployment: dict | None = None,
    gemm_calibration: str | None = None,
) -> dict:
    """Simulate `trace` under the settings with the SimPy replay (batching across requests,
    arrivals at `rate` requests/s or the trace's own times, the KV pool). Returns requests
    (request_id, e2e_s, ttft_s, ...), its Pareto point, metrics and which engine ran.

    `deployment` (the what-if page's cluster controls; `whatif_deployment` reads them): TP, PP,
    replicas and router, disaggregation, a workload file, SLOs and a price. `gemm_calibration`: a
    CAL.json from `solm calibrate` for the part's GEMMs (None: the shipped A100 fit carried)."""
    label = f"{trace.system} on {hardware}" + (f" ({model})" if model else "")
    label += " (calibrated GEMMs)" if gemm_calibration else ""
    part = whatif_part(hardware, gemm_calibration)
    if deployment:
        return whatif_deployment(trace, hardware, model, max_seqs, max_batch_tokens, rate, deployment, label, part)
    spec = get_model(model) if model else ModelSpec.from_trace_meta(trace.meta)
    cfg = ReplayConfig(max_seqs=int(max_seqs), max_batch_tokens=int(max_batch_tokens), rate=rate)
    result = replay(from_trace(trace), part, spec, cfg)
    reqs = _replay_requests(result, trace)
    return _whatif_result(trace, reqs, result, hardware, model, label, "SimPy replay (continuous batching)")


def whatif_deployment(
    trace: Trace,
    hardware: str,
    model: str | None,
    max_seqs: int,
    max_batch_tokens: int,
    rate: float | None,
    d: dict,
    label: str,
    part=None,
) -> dict:
    """The cluster what-if (simulator.cluster.run): keys tp, pp, pp_schedule, replicas, router, disaggregate
    ("P:D" or ""), workload (a CSV path or ""), time_scale, num_requests, slo_ttft_ms, slo_tpot_ms,
    price_per_gpu_hour (0 or None: not set). `part`: the hardware spec to use (default: the catalog's
    `hardware`)."""
    spec, part, workload = _deployment_inputs(trace, hardware, model, d, part)
    cfg, cluster = _deployment_configs(max_seqs, max_batch_tokens, rate, d)
    result = simulate(workload, part, spec, cfg, cluster)
    if d.get("workload"):  # requests of the file, not of the trace: no quality to carry over
        reqs = result.requests.copy()
        reqs["quality_score"] = np.nan
    else:
        reqs = _replay_requests(result, trace)
    return _whatif_result(
        trace, reqs, result, hardware, model, label, "SimPy replay of the deployment (simulator.cluster)"
    )


def _whatif_result(
    trace: Trace, reqs: pd.DataFrame, result: ReplayResult, hardware: str, model: str | None, label: str, engine: str
) -> dict:
    """What the What-if page draws: the requests, their Pareto point, the replay's scalar metrics and
    which engine ran."""
    metrics = {k: v for k, v in result.metrics.items() if isinstance(v, (int, float, str)) or v is None}
    return {
        "requests": reqs,
        "point": whatif_point(trace, reqs, hardware, model, label),
        "metrics": metrics,
        "engine": engine,
    }


def _deployment_inputs(trace: Trace, hardware: str, model: str | None, d: dict, part=None) -> tuple:
    """(model spec, part, workload) of a cluster what-if: the page's price set on the part, the
    trace's requests stretched to `d["workload"]`'s lengths and arrivals when a file is given."""
    spec = get_model(model) if model else ModelSpec.from_trace_meta(trace.meta)
    part = get_hardware(hardware) if part is None else part
    if d.get("price_per_gpu_hour"):
        part = dataclasses.replace(part, price_per_gpu_hour=float(d["price_per_gpu_hour"]))
    workload = from_trace(trace)
    if d.get("workload"):
        workload = stretch(workload, read_workload_file(d["workload"], time_scale=float(d.get("time_scale") or 1.0)))
    return spec, part, workload


def _deployment_configs(max_seqs: int, max_batch_tokens: int, rate: float | None, d: dict) -> tuple:
    """(ReplayConfig, ClusterConfig) from the what-if page's batch settings and deployment keys `d`
    (missing keys: one GPU, one replica, round robin, no disaggregation, no SLO)."""
    cfg = ReplayConfig(
        max_seqs=int(max_seqs),
        max_batch_tokens=int(max_batch_tokens),
        rate=rate,
        num_requests=int(d["num_requests"]) if d.get("num_requests") else None,
    )
    cluster = ClusterConfig(
        Parallelism(int(d.get("tp", 1)), int(d.get("pp", 1)), schedule=d.get("pp_schedule", "drain")),
        replicas=int(d.get("replicas", 1)),
        router=d.get("router", "round_robin"),
        disaggregate=parse_disaggregate(d.get("disaggregate") or None),
        slo_ttft_ms=d.get("slo_ttft_ms") or None,
        slo_tpot_ms=d.get("slo_tpot_ms") or None,
    )
    return cfg, cluster


def _replay_requests(result: ReplayResult, trace: Trace) -> pd.DataFrame:
    """Per-request rows of a replay result, with the trace's quality and output tokens where the
    replay has none (the columns `whatif_point` reads)."""
    df = result.requests.copy()
    src = trace.requests.set_index("request_id")
    for col in ("quality_score", "output_tokens"):
        if col not in df:
            df[col] = df["request_id"].map(src[col])
    if "peak_kv_bytes" not in df:
        df["peak_kv_bytes"] = np.nan
    return df
