"""Calibration for validation under load: the cost of a serving pass, from a batch-1 trace alone.

What: `calibrate_batch1(trace, hw, model)` returns a `HostCost`: the forward (on a CPU as the
capture's rows sweep measured it, `simulator.measured_forward`; else the cost model's roofline
rescaled, `fit_cost_params_to_steps`), the requests' host work per request, row and stream
(`host_terms`), the server's own work per pass (`pass_overhead_s`), its work to take in an
arrival (`admission_s`) and, opt-in, how much slower a pass runs after the server idled
(`wake_factors`). `simulator.load_validation` replays serving traces with it; docs/serving.md,
section 4, says why each term is there and what it did to the figures.

    from simulator.load_calibration import calibrate_batch1
    cost = calibrate_batch1(read_trace("runs/seq-cal"), hw, model)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from profiler.errors import UsageError
from profiler.reader import Trace
from simulator.calibrate import fit_cost_params_to_steps
from simulator.cost import CostModel
from simulator.hardware import HardwareSpec
from simulator.measured_forward import LineForward, SweepForward
from simulator.models import ModelSpec
from simulator.validation import PASS_COLUMNS, pass_frame, pass_table, trace_hardware


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


def pass_host_s(frame) -> np.ndarray | None:
    """Per forward pass of `frame` (`simulator.validation.pass_frame`), the engine's own host work
    (`steps.host_s`: building rows, sampling, bookkeeping), or None where the trace does not record
    it (schema_minor < 2)."""
    host = frame["host_s"].to_numpy(float)
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
        return t + self.per_pass_s + self.host_work_s(query_tokens, groups)

    def host_work_s(self, query_tokens, query_groups, requests=0):
        """The requests' own host work in a pass of these rows and streams: the per-row and per-stream
        terms, plus the per-request one for `requests` (the replay adds that one itself: 0)."""
        return self.per_stream_s * query_groups + self.per_row_s * query_tokens + self.per_request_s * requests

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
    "roofline" rescales the cost model's priors (`fit_cost_params_to_steps`); "auto", where the
    trace was captured on the part predicted (`captured_on`), the sweep where there is one and the
    line otherwise, else the roofline.
    `idle_sweep` True also slows the first pass after the server idled by what the capture's idle
    sweep measured (off by default: on the dev captures it helped the full run's TTFT and hurt the
    quick run's, docs/serving.md)."""
    if forward_fit not in FORWARD_FITS:
        raise UsageError(f"forward fit {forward_fit!r}: choose one of {', '.join(FORWARD_FITS)}")
    frame = pass_frame(trace.steps)
    steps = frame[PASS_COLUMNS].to_numpy(float)[:, :4]
    if len(steps) < 4:
        raise UsageError(f"{trace.path}: the calibration trace has {len(steps)} forward passes; need >= 4")
    host = pass_host_s(frame)
    forward = frame["forward_s"].to_numpy(float)
    timed = host is not None and np.isfinite(forward).all()  # minor 3: each pass's forward timed apart
    per_request = per_row = host_per_stream = 0.0
    if host is not None:  # the forward is fitted on the pass without its request's host work
        steps[:, 2] = forward if timed else np.maximum(steps[:, 2] - host, 0.5 * steps[:, 2])
        per_request, per_row, host_per_stream = host_terms(steps[:, 0], np.maximum(steps[:, 3], 1), host)
    sizes = size_medians(steps)
    sweep = sweep_passes(trace.meta) if rows_sweep else np.zeros((0, 4))
    fit = np.vstack([sizes if len(sizes) >= 4 else steps, sweep])
    if forward_fit == "auto" and captured_on(trace, hw):
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


def captured_on(trace: Trace, hw: HardwareSpec) -> bool:
    """Whether `hw` is the device the calibration trace ran on: any CPU part for a CPU trace, the
    catalog part its GPU's name resolves to for a GPU trace. There its passes measure this runtime
    on this machine, so a measured forward (sweep, line) predicts its serving passes; the roofline
    rescaled is for another part. (On a GPU the runtime's eager passes are host time: the H200's
    batch-1 8B pass takes 21 ms where its kernels take about 5, and a rescaled roofline charged
    more rows as more of that time: traces/gpu-h200/README.md.)"""
    device = (trace.meta.get("device") or {}).get("type")
    if device == "cpu" or hw.kind == "cpu":
        return device == "cpu" and hw.kind == "cpu"
    try:
        return trace_hardware(trace.meta).name == hw.name
    except KeyError:  # a GPU the catalog does not know: not the part predicted
        return False


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


def sweep_passes(meta: dict) -> np.ndarray:
    """The rows sweep a calibration capture recorded (`solm capture --rows-sweep`, runtime/rows_sweep.py)
    as fit rows: query tokens, keys scored, forward seconds, streams (one per row: R requests' decodes);
    none (0 rows) where the trace has none."""
    passes = (meta.get("rows_sweep") or {}).get("passes") or []
    return np.array([[p["rows"], p["keys"], p["duration_s"], p["rows"]] for p in passes], dtype=float).reshape(-1, 4)
