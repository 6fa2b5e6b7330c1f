"""Validation under load: predict a measured serving run from a batch-1 calibration alone.

What: `validate_load(serving_traces, calibrate_from)` takes one or more serving traces (`solm
capture --rate R | --concurrency C`: many requests batched into each pass over one KV pool) and a
batch-1 trace of the same system and model (`solm capture`: one request at a time). Nothing is
fitted to the serving traces. From the batch-1 trace only:

1. the forward cost, fitted on its passes (the forward alone where the trace times it,
   `steps.forward_s`; else the pass less its host work, `steps.host_s`), whose sizes differ:
   sequential prefills of 10-40 rows next to 1-row decodes, PASTA passes of 1-5 thread rows,
   Planned Diffusion denoise passes of up to ~160 rows; and, where its capture recorded a rows
   sweep (`solm capture --rows-sweep`, `runtime/rows_sweep.py`: batched decode passes of 1-32
   rows over pools of 64-1024 slots), on those (`sweep_passes`). That is how a pass's time grows
   with its rows (and its KV reads, streams). On a CPU the forward is taken as measured
   (`simulator.measured_forward`: the sweep's grid carried by the trace's own passes, or a line
   through them); otherwise the cost model's roofline rescaled (`fit_cost_params_to_steps`),
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
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from profiler.errors import UsageError
from profiler.reader import Trace, read_trace
from simulator.calibrate import fit_cost_params_to_steps
from simulator.cost import CostModel
from simulator.hardware import HardwareSpec, get_hardware
from simulator.measured_forward import LineForward, SweepForward
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, replay
from simulator.slo import goodput
from simulator.validation import PASS_COLUMNS, pass_frame, pass_table, trace_hardware
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


def pass_arrays(trace: Trace) -> np.ndarray:
    """One row per forward pass: query_tokens, kv_tokens_read, duration_s, active_streams, requests
    (`simulator.validation.pass_table`: a batched pass is one row)."""
    return pass_table(trace.steps)


def host_line(trace: Trace) -> tuple[float, float]:
    """(per-pass s, per-stream s) of the host time between a request's consecutive passes (batch 1)."""
    s = trace.steps.sort_values(["request_id", "step_index"])
    end = (s["start_s"] + s["duration_s"]).to_numpy()
    start, rid = s["start_s"].to_numpy(), s["request_id"].to_numpy()
    streams = np.maximum(s["active_streams"].to_numpy(float), 1)
    same = rid[1:] == rid[:-1]
    return _line(streams[:-1][same], np.maximum(start[1:] - end[:-1], 0)[same])


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of y over x, both >= 0; one x value (or a negative fit): all of y is slope."""
    if not len(y):
        return 0.0, 0.0
    if np.ptp(x) > 0:
        slope, icept = np.polyfit(x, y, 1)
        if slope >= 0 and icept >= 0:
            return float(icept), float(slope)
    return 0.0, float(np.median(y) / np.median(x))


def pass_host_s(trace: Trace) -> np.ndarray | None:
    """Per forward pass (the rows of `pass_arrays`), the engine's own host work (`steps.host_s`: building
    rows, sampling, bookkeeping), or None where the trace does not record it (schema_minor < 2)."""
    host = pass_frame(trace.steps)["host_s"].to_numpy(float)
    return host if len(host) and np.isfinite(host).all() else None


@dataclasses.dataclass(frozen=True)
class HostCost:
    """A forward cost model plus host work: `per_pass_s` once per pass, `per_stream_s` per stream in it,
    `per_row_s` per query row in it, `per_request_s` per request in it (the replay adds that term: it
    knows a pass's requests)."""

    forward: CostModel | LineForward | SweepForward
    per_pass_s: float
    per_stream_s: float
    per_request_s: float = 0.0
    per_row_s: float = 0.0
    admission_s: float = 0.0  # the server's work to take in an arrival, before the next pass (the replay adds it)
    wake_idle_s: tuple[float, ...] = ()  # idle times the rows sweep slept before a pass (`wake_factor`)
    wake_factor: tuple[float, ...] = ()  # that pass's time over the same pass back to back

    def after_idle(self, idle_s: float) -> float:
        """How much slower the first pass after `idle_s` of idle runs: 1 with no sweep of it, else
        linear between the slept times (1 at no idle), the longest's beyond it."""
        if not self.wake_idle_s or idle_s <= 0:
            return 1.0
        return float(np.interp(idle_s, (0.0, *self.wake_idle_s), (1.0, *self.wake_factor)))

    @property
    def source(self) -> str:
        """Where the forward's cost comes from (the fitted params' source, or the line it fitted)."""
        f = self.forward
        return f.params.source if isinstance(f, CostModel) else f"{f.source}: {f.describe()}"

    def step_time_s(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        t = self.forward_s(query_tokens, kv_tokens_read, query_groups, logit_tokens)
        groups = np.asarray(query_groups, float) if isinstance(t, np.ndarray) else float(query_groups)
        return t + self.per_pass_s + self.per_stream_s * groups + self.per_row_s * query_tokens

    def forward_s(self, query_tokens, kv_tokens_read, query_groups, logit_tokens=None):
        """The forward pass alone (no host work)."""
        return self.forward.step_time_s(query_tokens, kv_tokens_read, query_groups, logit_tokens)


def size_medians(steps: np.ndarray) -> np.ndarray:
    """One row per pass size (query tokens, streams, KV read within a factor of 2): its median KV read
    and median duration. Every size counts once in the fit: a batch-1 trace has hundreds of 1-row
    decodes and a handful of large prefills, and only the latter show how a pass grows with its rows
    (a fit over every pass, robust loss and all, treats those few as outliers). The median also
    drops one-sided timing spikes (another process taking the core) within a size."""
    key = np.column_stack([steps[:, 0], steps[:, 3], np.floor(np.log2(steps[:, 1] + 1))])
    _, group = np.unique(key, axis=0, return_inverse=True)
    group = group.ravel()
    return np.array(
        [
            [steps[m, 0][0], np.median(steps[m, 1]), np.median(steps[m, 2]), steps[m, 3][0]]
            for m in (group == g for g in range(group.max() + 1))
        ]
    )


FORWARD_FITS = ("auto", "sweep", "line", "roofline")


def calibrate_batch1(
    trace: Trace,
    hw: HardwareSpec,
    model: ModelSpec,
    rows_sweep: bool = True,
    forward_fit: str = "auto",
    idle_sweep: bool = False,
) -> HostCost:
    """The cost of a pass, fitted on a batch-1 trace only (see the module docstring); with the rows
    sweep its capture recorded unless `rows_sweep` is False. `forward_fit` (`simulator.measured_forward`):
    "sweep" interpolates the rows sweep's grid, "line" fits a line in rows, span and keys,
    "roofline" rescales the cost model's priors (`fit_cost_params_to_steps`); "auto", for a trace
    captured on a CPU, the sweep where there is one and the line otherwise, else the roofline.
    `idle_sweep` True also slows the first pass after the server idled by what the capture's idle
    sweep measured (off by default: on the dev captures it helped the full run's TTFT and hurt the
    quick run's, docs/serving.md)."""
    if forward_fit not in FORWARD_FITS:
        raise UsageError(f"forward fit {forward_fit!r}: choose one of {', '.join(FORWARD_FITS)}")
    frame = pass_frame(trace.steps)
    steps = frame[PASS_COLUMNS].to_numpy(float)[:, :4]
    if len(steps) < 4:
        raise UsageError(f"{trace.path}: the calibration trace has {len(steps)} forward passes; need >= 4")
    host = pass_host_s(trace)
    forward = frame["forward_s"].to_numpy(float)
    timed = host is not None and np.isfinite(forward).all()  # minor 3: each pass's forward timed apart
    per_request = per_row = host_per_stream = 0.0
    if host is not None:  # the forward is fitted on the pass without its request's host work
        steps[:, 2] = forward if timed else np.maximum(steps[:, 2] - host, 0.5 * steps[:, 2])
        per_request, per_row, host_per_stream = host_terms(steps[:, 0], np.maximum(steps[:, 3], 1), host)
    sizes = size_medians(steps)
    sweep = sweep_passes(trace.meta) if rows_sweep else np.zeros((0, 4))
    fit = np.vstack([sizes if len(sizes) >= 4 else steps, sweep])
    if forward_fit == "auto" and hw.kind == "cpu" and (trace.meta.get("device") or {}).get("type") == "cpu":
        forward_fit = "sweep" if len(np.unique(sweep[:, 0])) >= 2 else "line"
    cost: CostModel | LineForward | SweepForward
    if forward_fit == "sweep":
        cost = SweepForward.fit(sweep, steps if host is not None else None)  # every pass: a median of many
    elif forward_fit == "line":
        cost = LineForward.fit(fit, f"line fitted to {len(fit)} pass sizes")
    else:
        cost = CostModel(hw, model, fit_cost_params_to_steps(hw, model, fit))
    per_pass, per_stream = (pass_overhead_s(trace), 0.0) if timed else host_line(trace)
    admission = admission_s(trace, per_pass) if timed else 0.0
    idle, factor = wake_factors(trace.meta) if idle_sweep else ((), ())
    return HostCost(cost, per_pass, per_stream + host_per_stream, per_request, per_row, admission, idle, factor)


def wake_factors(meta: dict) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """From a calibration's idle sweep (`runtime.rows_sweep.idle_sweep`, `meta["rows_sweep"]
    ["after_idle"]`): per slept time, the median over its shapes of a pass right after the sleep
    over the same pass back to back, at least 1 and never falling with the time slept; () where
    the capture has none."""
    rows = (meta.get("rows_sweep") or {}).get("after_idle") or []
    sleeps = sorted({float(r["idle_s"]) for r in rows})
    factors = [
        float(np.median([r["after_idle_s"] / r["busy_s"] for r in rows if float(r["idle_s"]) == s])) for s in sleeps
    ]
    return tuple(sleeps), tuple(np.maximum.accumulate(np.maximum(factors, 1.0)).tolist()) if factors else ()


def admission_s(trace: Trace, per_pass_s: float) -> float:
    """The server's work to take in an arrival (tokenising its prompt, building its state), from a
    serving calibration at concurrency 1: a request arrives as the one before finishes and waits
    (`requests.queue_s`) for that work and the server's own work of one pass; the median, less
    the latter. 0 where the trace records no queue (an engine capture)."""
    queue = trace.requests["queue_s"].to_numpy(float) if "queue_s" in trace.requests else np.zeros(0)
    queue = queue[np.isfinite(queue)]
    return float(max(np.median(queue) - per_pass_s, 0.0)) if len(queue) else 0.0


def pass_overhead_s(trace: Trace) -> float:
    """The server's own work per pass (scheduling, bookkeeping, the loop) on a trace that times each
    pass's forward (`steps.forward_s`) and its request's host work (`steps.host_s`): the median over a
    request's consecutive passes of the time from one pass's start to the next's, less both."""
    s = trace.steps[trace.steps["query_tokens"] > 0].sort_values(["request_id", "step_index"])
    start, rid = s["start_s"].to_numpy(float), s["request_id"].to_numpy()
    other = start[1:] - start[:-1] - s["forward_s"].to_numpy(float)[:-1] - s["host_s"].to_numpy(float)[:-1]
    other = other[rid[1:] == rid[:-1]]
    return float(max(np.median(other), 0.0)) if len(other) else 0.0


def host_terms(rows: np.ndarray, streams: np.ndarray, host: np.ndarray) -> tuple[float, float, float]:
    """(per request, per row, per stream) seconds of a request's host work in a pass, each >= 0, by
    least squares over its pass sizes: building and reading back its rows (`inputs()`, `after()`)
    costs a fixed part and a part per row (its ids, positions, visibility, sampled logits), and
    where streams vary apart from rows (PASTA's threads, parsed one by one) a part per stream. Each
    size (rows, streams) counts once, at its median: a pass that another process or a garbage
    collection held for 30 ms is one of hundreds of 1-row decodes, and a mean would carry it."""
    from scipy.optimize import nnls

    key = np.column_stack([rows, streams]).astype(float)
    sizes, group = np.unique(key, axis=0, return_inverse=True)
    group = group.ravel()
    med = np.array([np.median(np.asarray(host, float)[group == g]) for g in range(len(sizes))])
    x, _ = nnls(np.column_stack([np.ones(len(sizes)), sizes[:, 0], sizes[:, 1]]), med)
    return float(x[0]), float(x[1]), float(x[2])


def serving_attention(meta: dict) -> str | None:
    """What a trace's attention scored, as `ReplayConfig.attention`: "pool" for the serving runtime's
    mask attention, "visible" for its per-request gathers; None for a trace of no serving run."""
    knobs = {**(meta.get("knobs") or {}), **(meta.get("serving") or {})}
    return RUNTIME_ATTENTION.get(knobs["attention"]) if knobs.get("attention") is not None else None


def sweep_passes(meta: dict) -> np.ndarray:
    """The rows sweep a calibration capture recorded (`solm capture --rows-sweep`, runtime/rows_sweep.py)
    as fit rows: query tokens, keys scored, forward seconds, streams (one per row: R requests' decodes);
    none (0 rows) where the trace has none."""
    passes = (meta.get("rows_sweep") or {}).get("passes") or []
    return np.array([[p["rows"], p["keys"], p["duration_s"], p["rows"]] for p in passes], dtype=float).reshape(-1, 4)


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
    out_tokens = req["output_tokens"].to_numpy(np.int64)
    meas = _figures(
        arrival,
        np.where(good, req["ttft_s"].to_numpy(float), np.nan),
        np.where(good, req["e2e_s"].to_numpy(float), np.nan),
        out_tokens,
    )
    r = res.requests
    sim = _figures(
        r["arrival_s"].to_numpy(float),
        r["ttft_s"].to_numpy(float),
        r["e2e_s"].to_numpy(float),
        r["output_tokens"].to_numpy(np.int64),
    )
    measured, simulated, errors = _compare(meas, sim)
    for which, fig, ok in (("measured", meas, good), ("simulated", sim, np.isfinite(sim["e2e"]))):
        duration = (
            float(np.nanmax(arrival + meas["e2e"]) - np.nanmin(arrival))
            if which == "measured"
            else float(res.metrics["duration_s"])
        )
        g = goodput(fig["ttft"], fig["tpot"], ok, duration, config.slo_ttft_ms, config.slo_tpot_ms)
        (measured if which == "measured" else simulated).update(
            request_goodput=g["request_goodput"], slo_attained_percent=g["slo_attained_percent"]
        )
    frame = pass_frame(trace.steps)
    passes = frame[PASS_COLUMNS].to_numpy(float)
    forward = frame["forward_s"].to_numpy(float)  # the forward alone where timed (minor 3), else the whole pass
    measured_s = np.where(np.isfinite(forward), forward, passes[:, 2]) if len(passes) else np.zeros(0)
    predicted = (
        np.asarray(cost.forward_s(passes[:, 0], passes[:, 1], passes[:, 3]), float) if len(passes) else np.zeros(0)
    )
    errors["pass_time_mape_percent"] = (
        float(np.mean(np.abs(predicted / measured_s - 1)) * 100) if len(passes) else float("nan")
    )
    level = (
        load_level(trace.meta)
        if config.arrival == "trace"
        else {"rate": config.rate, "concurrency": config.concurrency}
    )
    return {
        "trace": str(trace.path),
        "system": trace.system,
        **level,
        "requests": int(len(w.request_ids)),
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
    pred = np.asarray(cost.step_time_s(p[:, 0], p[:, 1], p[:, 3]), float) + cost.per_request_s * p[:, 4]
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
    host_pred = cost.per_stream_s * p[:, 3] + cost.per_row_s * p[:, 0] + cost.per_request_s * p[:, 4]
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
    ev = trace.requests["events"] if "events" in trace.requests else []
    return counted or int(sum(sum(e.get("event") == "preempted" for e in json.loads(x or "[]")) for x in ev))


def validate_load(
    serving: Sequence[str | Path],
    calibrate_from: str | Path,
    hardware: HardwareSpec | str | None = None,
    forward_fit: str = "auto",
    **overrides,
) -> dict:
    """Calibrate on the batch-1 trace, predict every serving trace (see the module docstring);
    `forward_fit` as `calibrate_batch1` takes it."""
    calib = read_trace(calibrate_from)
    traces = [read_trace(p) for p in serving]
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
        "levels": levels,
    }
