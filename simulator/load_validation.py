"""Validation under load: predict a measured serving run from a batch-1 calibration alone.

What: `validate_load(serving_traces, calibrate_from)` takes one or more serving traces (`solm
capture --rate R | --concurrency C`: many requests batched into each pass over one KV pool) and a
batch-1 trace of the same system and model (`solm capture`: one request at a time). Nothing is
fitted to the serving traces. From the batch-1 trace only (`simulator.load_calibration`):

1. the forward cost, fitted on its passes (the forward alone where the trace times it,
   `steps.forward_s`; else the pass less its host work, `steps.host_s`), whose sizes differ:
   sequential prefills of 10-40 rows next to 1-row decodes, PASTA passes of 1-5 thread rows,
   Planned Diffusion denoise passes of up to ~160 rows; and, where its capture recorded a rows
   sweep (`solm capture --rows-sweep`, `runtime/rows_sweep.py`: batched decode passes of 1-32
   rows over pools of 64-1024 slots), on those (`sweep_passes`). That is how a pass's time grows
   with its rows (and its KV reads, streams). On the part the trace ran on (a CPU, or its GPU)
   the forward is taken as measured (`simulator.measured_forward`: the sweep's grid carried by
   the trace's own passes, or a line through them); on another part the cost model's roofline
   rescaled (`fit_cost_params_to_steps`),
   each pass size counting once (`size_medians`) so the few large passes are not outvoted by the
   many small ones. A pass's KV read is the keys its attention scored
   (`steps.attention_kv_tokens`: with the runtime's mask attention, rows x the pool's span);
2. the host work: per request and pass, `host_s` (the engine's own `inputs()` and `after()`) as
   a fixed part, a part per row and a part per stream (`host_terms`, each size once), which a
   batched pass pays once per request in it (`HostCost.per_request_s`, `per_row_s`,
   `per_stream_s`); the server's own work per pass, what is left of a pass after both
   (`pass_overhead_s`; before trace minor 3, a line over the gaps between passes, `host_line`).

Each serving trace is then replayed with its own arrivals and its own batch settings (max
sequences, batched tokens, KV pool, scheduler, chunked prefill, attention: read from its meta,
see `serving_config`), and every request's TTFT, TPOT and E2E latency and the run's throughput are
compared with what was measured. Per load level (one serving trace each): the error of the median
and p99 and the per-request mean absolute percentage error.

Passes are grouped by `batch_index` wherever a trace has one (`pass_arrays`): a batched pass of 8
requests is one pass of their summed rows, not 8 passes.

    from simulator.load_validation import validate_load
    validate_load(["runs/seq-r4"], "traces/sequential-reverse_words")["levels"][0]["errors"]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from profiler.errors import TraceError, UsageError, parse_json
from profiler.reader import Trace
from profiler.summary import attention_strategy
from profiler.validate import read_valid_trace
from simulator.hardware import HardwareSpec, get_hardware
from simulator.load_calibration import HostCost, calibrate_batch1, pass_arrays, sweep_passes
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, replay
from simulator.simtrace import ReplayResult
from simulator.slo import goodput
from simulator.validation import PASS_COLUMNS, pass_frame, trace_hardware
from simulator.workload import from_trace

MIB = 1 << 20
# the serving runtime's attention (runtime.server.ATTENTION_MODES) -> what the replay costs (ReplayConfig.attention)
RUNTIME_ATTENTION = {"mask": "pool", "gather": "visible"}
# serving settings a serving trace's meta may carry (meta["serving"], else meta["knobs"]) -> ReplayConfig field
SERVING_KEYS = {
    "max_seqs": "max_seqs",
    "max_batch_tokens": "max_batch_tokens",
    "scheduler": "scheduler",
    "chunked_prefill": "chunked_prefill",
    "page_size": "block_size",
    "reserve": "reserve",
}


def serving_attention(meta: dict) -> str | None:
    """What a trace's attention scored, as `ReplayConfig.attention`: "pool" for the serving runtime's
    mask attention, "visible" for its per-request gathers; None for a trace of no serving run."""
    knobs = {**(meta.get("knobs") or {}), **(meta.get("serving") or {})}
    return RUNTIME_ATTENTION.get(knobs["attention"]) if knobs.get("attention") is not None else None


def serving_config(meta: dict, model: ModelSpec, **overrides) -> ReplayConfig:
    """The batch settings a serving trace ran with, as a replay of its own arrivals."""
    knobs = {**(meta.get("knobs") or {}), **(meta.get("serving") or {})}
    fields = {field: knobs[key] for key, field in SERVING_KEYS.items() if knobs.get(key) is not None}
    if knobs.get("kv_budget_mib") is not None:
        fields["kv_capacity_bytes"] = int(float(knobs["kv_budget_mib"]) * MIB)
    if knobs.get("pool_bytes") is not None:
        fields["kv_capacity_bytes"] = int(knobs["pool_bytes"])
    fields.setdefault("kv_capacity_bytes", 1 << 40)  # no pool recorded: unbounded
    attention = serving_attention(meta)
    if attention is not None:  # the runtime's attention: mask over the pool, or per-request gathers
        fields["attention"] = attention
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return ReplayConfig(memory_utilization=1.0, **fields)


def _figures(arrival, ttft, e2e, out_tokens) -> dict:
    """Per-request TTFT, TPOT, E2E (s) and the run's throughput, vLLM's definitions."""
    ok = np.isfinite(e2e)
    multi = ok & (out_tokens > 1) & np.isfinite(ttft)
    tpot = np.full(len(e2e), np.nan)
    tpot[multi] = (e2e[multi] - ttft[multi]) / (out_tokens[multi] - 1)
    duration = float(np.nanmax(arrival + e2e) - np.nanmin(arrival)) if ok.any() else 0.0
    return {
        "ttft": ttft,
        "tpot": tpot,
        "e2e": e2e,
        "output_throughput": float(out_tokens[ok].sum() / duration) if duration > 0 else float("nan"),
        "request_throughput": float(ok.sum() / duration) if duration > 0 else float("nan"),
    }


def summarize_run(arrival, ttft, e2e, out_tokens, slo_ttft_ms=None, slo_tpot_ms=None) -> dict:
    """Median and p99 TTFT, TPOT, E2E (ms), throughputs and goodput of one run's requests (NaN e2e: failed)."""
    arrival, ttft, e2e = (np.asarray(x, float) for x in (arrival, ttft, e2e))
    fig = _figures(arrival, ttft, e2e, np.asarray(out_tokens, np.int64))
    out = {}
    for name in ("ttft", "tpot", "e2e"):
        v = fig[name][np.isfinite(fig[name])]
        out[f"{name}_p50_ms"] = float(np.median(v) * 1e3) if len(v) else None
        out[f"{name}_p99_ms"] = float(np.percentile(v, 99) * 1e3) if len(v) else None
    ok = np.isfinite(e2e)
    duration = float(np.nanmax(arrival + e2e) - np.nanmin(arrival)) if ok.any() else 0.0
    g = goodput(fig["ttft"], fig["tpot"], ok, duration, slo_ttft_ms, slo_tpot_ms)
    return {
        **out,
        "output_throughput": fig["output_throughput"],
        "request_throughput": fig["request_throughput"],
        "request_goodput": g["request_goodput"],
        "slo_attained_percent": g["slo_attained_percent"],
    }


def _ape(sim: float, meas: float) -> float:
    return float(abs(sim / meas - 1) * 100) if meas > 0 and np.isfinite(sim) else float("nan")


def _compare(meas: dict, sim: dict) -> tuple[dict, dict, dict]:
    summary: dict[str, dict] = {}
    errors: dict[str, float] = {}
    for name in ("ttft", "tpot", "e2e"):
        m, s = meas[name], sim[name]
        both = np.isfinite(m) & np.isfinite(s) & (m > 0)
        for which, fig in (("measured", meas), ("simulated", sim)):
            v = fig[name][both]
            summary.setdefault(which, {}).update(
                {
                    f"{name}_p50_ms": float(np.median(v) * 1e3) if len(v) else None,
                    f"{name}_p99_ms": float(np.percentile(v, 99) * 1e3) if len(v) else None,
                }
            )
        if both.any():
            errors[f"{name}_p50_ape_percent"] = _ape(np.median(s[both]), np.median(m[both]))
            errors[f"{name}_p99_ape_percent"] = _ape(np.percentile(s[both], 99), np.percentile(m[both], 99))
            errors[f"{name}_mape_percent"] = float(np.mean(np.abs(s[both] / m[both] - 1)) * 100)
    for key in ("output_throughput", "request_throughput"):
        summary["measured"][key], summary["simulated"][key] = meas[key], sim[key]
    errors["throughput_ape_percent"] = _ape(sim["output_throughput"], meas["output_throughput"])
    return summary["measured"], summary["simulated"], errors


def load_level(meta: dict) -> dict:
    knobs = {**(meta.get("knobs") or {}), **(meta.get("serving") or {})}
    rate = knobs.get("rate") if knobs.get("rate") is not None else knobs.get("rate_per_s")  # the runtime: rate_per_s
    return {"rate": rate, "concurrency": knobs.get("concurrency")}


def validate_one(trace: Trace, cost: HostCost, hw: HardwareSpec, model: ModelSpec, **overrides) -> dict:
    """One serving trace replayed with its own arrivals; measured vs simulated figures and errors."""
    w = from_trace(trace)
    w = dataclasses.replace(w, logit_tokens=w.query_tokens.copy())  # the runtime computes every row's logits
    config = serving_config(trace.meta, model, **overrides)
    res = replay(w, hw, model, config, cost=cost)
    req = trace.requests.set_index("request_id").loc[w.request_ids]
    arrival = req["arrival_s"].to_numpy(float)
    good = (req["status"] != "error").to_numpy()
    meas = _figures(
        arrival,
        np.where(good, req["ttft_s"].to_numpy(float), np.nan),
        np.where(good, req["e2e_s"].to_numpy(float), np.nan),
        req["output_tokens"].to_numpy(np.int64),
    )
    r = res.requests
    sim = _figures(
        r["arrival_s"].to_numpy(float),
        r["ttft_s"].to_numpy(float),
        r["e2e_s"].to_numpy(float),
        r["output_tokens"].to_numpy(np.int64),
    )
    measured, simulated, errors = _compare(meas, sim)
    sim_ok = np.isfinite(sim["e2e"])
    _add_goodput(measured, meas, good, float(np.nanmax(arrival + meas["e2e"]) - np.nanmin(arrival)), config)
    _add_goodput(simulated, sim, sim_ok, float(res.metrics["duration_s"]), config)
    passes, errors["pass_time_mape_percent"] = _pass_time_mape(trace, cost)
    return _level_report(trace, config, res, int(len(w.request_ids)), passes, measured, simulated, errors)


def _add_goodput(into: dict, fig: dict, ok: np.ndarray, duration: float, config: ReplayConfig) -> None:
    """Adds a run's request goodput and SLO attainment (`simulator.slo.goodput`) to its figures."""
    g = goodput(fig["ttft"], fig["tpot"], ok, duration, config.slo_ttft_ms, config.slo_tpot_ms)
    into.update(request_goodput=g["request_goodput"], slo_attained_percent=g["slo_attained_percent"])


def _pass_time_mape(trace: Trace, cost: HostCost) -> tuple[np.ndarray, float]:
    """The trace's passes (`pass_frame`, as PASS_COLUMNS) and the mean absolute percentage error of
    the calibrated forward against each pass's measured time (nan for a trace without passes)."""
    frame = pass_frame(trace.steps)
    passes = frame[PASS_COLUMNS].to_numpy(float)
    forward = frame["forward_s"].to_numpy(float)  # the forward alone where timed (minor 3), else the whole pass
    measured_s = np.where(np.isfinite(forward), forward, passes[:, 2]) if len(passes) else np.zeros(0)
    predicted = (
        np.asarray(cost.forward_s(passes[:, 0], passes[:, 1], passes[:, 3]), float) if len(passes) else np.zeros(0)
    )
    mape = float(np.mean(np.abs(predicted / measured_s - 1)) * 100) if len(passes) else float("nan")
    return passes, mape


def _level_report(
    trace: Trace,
    config: ReplayConfig,
    res: ReplayResult,
    n_requests: int,
    passes: np.ndarray,
    measured: dict,
    simulated: dict,
    errors: dict,
) -> dict:
    """`validate_one`'s result: the load level, the run's shape measured and simulated, the figures."""
    level = (
        load_level(trace.meta)
        if config.arrival == "trace"
        else {"rate": config.rate, "concurrency": config.concurrency}
    )
    return {
        "trace": str(trace.path),
        "system": trace.system,
        **level,
        "requests": n_requests,
        "passes_measured": int(len(passes)),
        "passes_simulated": int(res.metrics["passes"]),
        "mean_batch_measured": float(passes[:, 4].mean()) if len(passes) else None,
        "mean_batch_simulated": res.metrics["mean_batch_requests"],
        "preemptions_measured": _preemptions(trace),
        "preemptions_simulated": int(res.metrics["preemptions"]),
        "config": {
            k: v
            for k, v in config.describe().items()
            if k in ("max_seqs", "max_batch_tokens", "scheduler", "chunked_prefill", "kv_capacity_bytes")
        },
        "measured": measured,
        "simulated": simulated,
        "errors": errors,
    }


def _back_to_back(trace: Trace, cost: HostCost):
    """The trace's passes (`pass_frame`), the time from each pass's start to the next's, and which
    passes the next one followed at once (no idle wait for an arrival); None for a trace with a
    pass not batched (a batch-1 engine capture)."""
    if not len(trace.steps) or (trace.steps["batch_index"] < 0).any():
        return None
    f = pass_frame(trace.steps)
    start, dur = f["start_s"].to_numpy(float), f["duration_s"].to_numpy(float)
    total = np.r_[start[1:] - start[:-1], np.nan]
    idle = np.r_[start[1:] - (start[:-1] + dur[:-1]), np.nan] > 10 * max(cost.per_pass_s + cost.per_stream_s, 1e-4)
    return f, total, np.isfinite(total) & ~idle


def pass_time_ratios(trace: Trace, cost: HostCost) -> np.ndarray:
    """(requests in the pass, measured / predicted time) of every pass the next one followed at once
    (no idle wait for an arrival): the pass plus the host work before the next, against the cost's
    forward plus its host terms. Flat over the batch size when the cost grows with the batch as the
    runtime does; another process on the machine scales every size alike, so the shape survives it."""
    timed = _back_to_back(trace, cost)
    if timed is None:
        return np.zeros((0, 2))
    f, total, ok = timed
    p = f[PASS_COLUMNS].to_numpy(float)
    # the cost's forward and host terms (`HostCost.step_time_s`) plus the requests' own, as the replay adds
    pred = np.asarray(cost.step_time_s(p[:, 0], p[:, 1], p[:, 3]), float) + cost.host_work_s(0, 0, p[:, 4])
    return np.column_stack([p[ok, 4], total[ok] / pred[ok]])


BREAKDOWN_COLUMNS = ("requests", "forward", "forward_pred", "host", "host_pred", "other", "other_pred", "multi_row")


def pass_breakdown(trace: Trace, cost: HostCost) -> np.ndarray:
    """Where a pass's time goes, measured beside predicted (seconds; `BREAKDOWN_COLUMNS`), for every
    pass the next one followed at once, on a trace that times the forward alone (minor 3; else no
    rows): the forward (`forward_s`), the requests' host work (the sum of their `host_s`) and the
    server's own work (the rest, start to next start); `multi_row` 1 for a pass with a multi-row
    stream (a prefill, a denoise span)."""
    timed = _back_to_back(trace, cost)
    if timed is None:
        return np.zeros((0, len(BREAKDOWN_COLUMNS)))
    f, total, ok = timed
    forward, host = f["forward_s"].to_numpy(float), f["host_s"].to_numpy(float)
    ok &= np.isfinite(forward) & np.isfinite(host)
    p = f[PASS_COLUMNS].to_numpy(float)[ok]
    forward_pred = np.asarray(cost.forward_s(p[:, 0], p[:, 1], p[:, 3]), float)
    host_pred = cost.host_work_s(p[:, 0], p[:, 3], p[:, 4])
    other = total[ok] - forward[ok] - host[ok]
    return np.column_stack(
        [
            p[:, 4],
            forward[ok],
            forward_pred,
            host[ok],
            host_pred,
            other,
            np.full(len(p), cost.per_pass_s),
            p[:, 0] > p[:, 3],
        ]
    )


def _preemptions(trace: Trace) -> int:
    """Preemptions of the run: the requests' `preemptions` column (schema minor 1, what the runtime
    writes), or where that is all zero (its default) the `preempted` events a replay writes."""
    counted = int(trace.requests["preemptions"].sum()) if "preemptions" in trace.requests else 0
    if counted or "events" not in trace.requests:
        return counted
    ids = trace.requests["request_id"] if "request_id" in trace.requests else range(len(trace.requests))
    n = 0
    for rid, x in zip(ids, trace.requests["events"], strict=True):
        what = f"{trace.path}: requests.events of request {rid}"  # (was: a traceback, exit 1)
        events = parse_json(x or "[]", what, TraceError)
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            raise TraceError(f"{what}: not a JSON list of event objects")
        n += sum(e.get("event") == "preempted" for e in events)
    return n


def validate_load(
    serving: Sequence[str | Path],
    calibrate_from: str | Path,
    hardware: HardwareSpec | str | None = None,
    forward_fit: str = "auto",
    **overrides,
) -> dict:
    """Calibrate on the batch-1 trace, predict every serving trace (see the module docstring);
    `forward_fit` as `calibrate_batch1` takes it."""
    calib = read_valid_trace(calibrate_from)
    traces = [read_valid_trace(p) for p in serving]
    for t in [calib, *traces]:
        if t.kind != "measured":
            raise UsageError(f"{t.path}: validate needs measured traces, this one is {t.kind}")
    model = ModelSpec.from_trace_meta(calib.meta)
    for t in traces:
        if t.system != calib.system or (t.meta.get("model") or {}).get("name") != model.name:
            raise UsageError(
                f"{t.path}: {t.system} with {(t.meta.get('model') or {}).get('name')} cannot be "
                f"predicted from a calibration of {calib.system} with {model.name} ({calib.path})"
            )
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware or trace_hardware(calib.meta)
    cost = calibrate_batch1(calib, hw, model, forward_fit=forward_fit)
    levels = [validate_one(t, cost, hw, model, **overrides) for t in traces]
    calib_sdpa, warnings = attention_strategy(calib.meta), []
    for t, level in zip(traces, levels):
        level["sdpa"] = attention_strategy(t.meta)
        if level["sdpa"] != calib_sdpa:
            warnings.append(
                f"{t.path} ran attention as {level['sdpa']!r}, the calibration as {calib_sdpa!r} "
                "(SOLM_SDPA, runtime/attention.py): its passes cost what the calibration's did not measure"
            )
    return {
        "calibrate_from": str(calib.path),
        "system": calib.system,
        "model": model.name,
        "hardware": hw.name,
        "calibration_passes": int(len(pass_arrays(calib))),
        "host_per_pass_s": cost.per_pass_s,
        "host_per_stream_s": cost.per_stream_s,
        "host_per_request_s": cost.per_request_s,
        "host_per_row_s": cost.per_row_s,
        "rows_sweep_passes": int(len(sweep_passes(calib.meta))),
        "cost_params": cost.source,
        "sdpa": calib_sdpa,
        "levels": levels,
        "warnings": warnings,
    }
