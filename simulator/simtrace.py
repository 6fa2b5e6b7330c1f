"""What a replay produced: per-request figures, `vllm bench serve` metrics, a simulated trace.

What: `collect` turns a finished `Replay` into a `ReplayResult` (vectorised over every
(pass, request) row: 500,000 rows in well under a second); `write_simulated_trace` writes it in
trace format v1 with `profiler.writer.write_trace`, so `inspect`, `diff` and the dashboard read
it like a measured run.

Metric names and definitions follow vLLM's `benchmarks/benchmark_serving.py`: TTFT from arrival
to the end of the first pass that emits a token; TPOT = (E2EL - TTFT) / (output tokens - 1) for
requests of more than one token; ITL = the gaps between a request's token-emitting passes (a pass
that emits several tokens, e.g. PASTA threads or a denoise step, is one chunk, as a streamed chunk
is in vLLM); E2EL from arrival to the end of the last pass; throughputs over the run's duration
(first arrival at t = 0 to the last finish); percentiles by `np.percentile` (linear).
Quality is copied from the source trace, never invented: NaN stays NaN.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from profiler.schema import CHUNK_NOTE, PHASES, TABLES, empty_graph
from profiler.writer import ROW_GROUP_ROWS, TableSlices, write_trace
from simulator.hardware import HardwareSpec
from simulator.models import ModelSpec
from simulator.passrows import PassRows
from simulator.passrows import build as build_rows
from simulator.replay import ReplayConfig
from simulator.slo import goodput
from simulator.workload import RECOMPUTE_NOTE, Workload


@dataclass
class ReplayResult:
    metrics: dict
    requests: pd.DataFrame  # one row per simulated request
    rows: PassRows  # one entry per (pass, request), sorted by request then pass (columns built on access)
    events: list[tuple[int, str, float]]  # (request id, event, time) in simulated order
    workload: Workload
    config: ReplayConfig
    hardware: HardwareSpec
    model: ModelSpec
    kv_capacity_bytes: int
    bytes_per_block: int
    cost_source: str = ""
    extra: dict = field(default_factory=dict)

    def timeline(self) -> list[tuple[int, str, float]]:
        """(request id, event, time) of arrive / admit / first_token / preempt / finish / error, by time."""
        ids = self.requests["request_id"].to_numpy()
        ev = [(int(ids[r]), name, t) for r, name, t in self.events]
        ttft = self.requests["ttft_s"].to_numpy() + self.requests["arrival_s"].to_numpy()
        ev += [(int(ids[r]), "first_token", float(t)) for r, t in enumerate(ttft) if t == t]
        # at one instant: the pass that ends (tokens, finishes), then arrivals, then the scheduler
        rank = {"first_token": 0, "finish": 1, "arrive": 2, "error": 3, "preempt": 4, "admit": 5}
        return sorted(ev, key=lambda e: (e[2], rank[e[1]], e[0]))


def _stats(name: str, values_s: np.ndarray, scratch: bool = False) -> dict:
    """Mean, median and p99 in ms. `scratch`: `values_s` (float) may be scaled and reordered in place
    (the ITLs of 100k requests: 21 million values, no copy of them)."""
    v = np.asarray(values_s, float)
    if scratch:
        v *= 1e3
    else:
        v = v * 1e3
    if not len(v):
        return {f"mean_{name}_ms": None, f"median_{name}_ms": None, f"p99_{name}_ms": None}
    mean = float(v.mean())  # before the median reorders v
    return {
        f"mean_{name}_ms": mean,
        f"median_{name}_ms": float(np.median(v, overwrite_input=scratch)),
        f"p99_{name}_ms": float(np.percentile(v, 99, overwrite_input=scratch)),
    }


@dataclass
class _Latencies:
    """Per-request latencies in seconds (NaN where a request has none) and who counts for which."""

    errored: np.ndarray  # bool: the request got an error row
    ok: np.ndarray  # bool: it completed
    ttft: np.ndarray
    itl: np.ndarray  # the gaps between token-emitting passes, all requests together
    e2e: np.ndarray
    tpot: np.ndarray
    multi: np.ndarray  # bool: completed with more than one output token and a first token (has a TPOT)


def _latencies(sim, w: Workload, rows: PassRows) -> _Latencies:
    n = w.n_requests
    arrival = sim.arrival_s
    errored = np.array([r in sim.error for r in range(n)], bool)
    ok = ~errored
    ttft, itl = _token_times(rows, arrival)
    e2e = np.where(ok, sim.finish_s - arrival, np.nan)
    out_tokens = w.output_tokens
    multi = ok & (out_tokens > 1) & ~np.isnan(ttft)
    tpot = np.full(n, np.nan)
    tpot[multi] = (e2e[multi] - ttft[multi]) / (out_tokens[multi] - 1)
    return _Latencies(errored, ok, ttft, itl, e2e, tpot, multi)


def _metrics(sim, w: Workload, rows: PassRows, lat: _Latencies) -> dict:
    """The run's `vllm bench serve` metrics (the ITLs in `lat` are reordered in place)."""
    ok, ttft, tpot = lat.ok, lat.ttft, lat.tpot
    bpb = sim.pool.bytes_per_block
    duration = float(np.nanmax(sim.finish_s[ok])) if ok.any() else 0.0
    completed = int(ok.sum())
    total_out = int(w.output_tokens[ok].sum())
    total_in = int(w.prompt_tokens[ok].sum())
    per_s = lambda x: x / duration if duration > 0 else None  # noqa: E731
    q = w.quality_score[ok & ~np.isnan(w.quality_score)]
    return {
        "completed": completed,
        "failed": int(lat.errored.sum()),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "duration_s": duration,
        "request_throughput": per_s(completed),
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        **_stats("ttft", ttft[ok & ~np.isnan(ttft)]),
        **_stats("tpot", tpot[lat.multi]),
        **_stats("itl", lat.itl, scratch=True),
        **_stats("e2el", lat.e2e[ok]),
        "peak_kv_bytes": int(sim.pool.peak_blocks * bpb),
        "kv_capacity_bytes": int(sim.pool.capacity_blocks * bpb),
        "passes": int(sim.n_pass),
        "mean_batch_requests": float(rows.n / sim.n_pass) if sim.n_pass else None,
        "preemptions": int(sim.preemptions.sum()),
        "recomputed_tokens": int(rows.own["rebuild"].sum()),
        "prefill_chunks": int((~rows.own["final"]).sum()),
        "device_busy_s": float(sim.device.busy_s),
        "quality_mean": float(q.mean()) if len(q) else None,
        **goodput(ttft, tpot, ok, duration, sim.config.slo_ttft_ms, sim.config.slo_tpot_ms),
    }


def _requests_frame(sim, w: Workload, rows: PassRows, lat: _Latencies) -> pd.DataFrame:
    """One row per simulated request: its times, passes, tokens, KV peak, quality and status."""
    n = w.n_requests
    peak_blocks = -(-w.peak_alloc_tokens() // sim.config.block_size)
    return pd.DataFrame(
        {
            "request_id": w.request_ids,
            "source_request_id": w.source_ids(),
            "arrival_s": sim.arrival_s,
            "start_s": sim.start_s,
            "ttft_s": lat.ttft,
            "tpot_s": lat.tpot,
            "e2e_s": lat.e2e,
            "steps": rows.counts,
            "preemptions": sim.preemptions,
            "prompt_tokens": w.prompt_tokens,
            "output_tokens": w.output_tokens,
            "peak_live_kv_tokens": w.per_request_max(w.live_kv_tokens),
            "peak_kv_bytes": peak_blocks * sim.pool.bytes_per_block,
            "quality_score": w.quality_score,
            "status": [("error" if lat.errored[r] else w.status[r]) for r in range(n)],
            "error": [sim.error.get(r, "") for r in range(n)],
        }
    )


def collect(sim) -> ReplayResult:
    """Flatten a finished `simulator.replay.Replay` into rows, per-request figures and metrics."""
    w: Workload = sim.w
    rows = build_rows(sim)
    lat = _latencies(sim, w, rows)
    return ReplayResult(
        _metrics(sim, w, rows, lat),
        _requests_frame(sim, w, rows, lat),
        rows,
        list(sim.events),
        w,
        sim.config,
        sim.hardware,
        sim.model,
        int(sim.capacity_bytes),
        sim.pool.bytes_per_block,
        getattr(getattr(sim.cost, "params", None), "source", ""),
    )


# ---- the simulated trace --------------------------------------------------------------------
def _token_times(rows: PassRows, arrival: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT of each request, NaN without a token; the gaps between each request's token-emitting
    passes), from the rows (sorted by request, then pass), freeing each temporary as it goes."""
    em = rows["emits"] > 0
    er, eb = rows.request[em], rows.batch[em]
    del em
    eend = rows.pass_start_s[eb]
    eend += rows.pass_duration_s[eb]  # each emitting row's pass end
    del eb
    ttft = np.full(len(arrival), np.nan)
    first = np.flatnonzero(np.r_[True, er[1:] != er[:-1]]) if len(er) else np.zeros(0, np.int64)
    ttft[er[first]] = eend[first] - arrival[er[first]]
    same = er[1:] == er[:-1]
    del er
    itl = np.diff(eend)[same] if len(eend) > 1 else np.zeros(0)
    return ttft, itl


def _strings(codes: np.ndarray, values) -> pa.Array:
    """A string column from small codes into a few values, built in Arrow (a numpy or object
    array of 21 million short strings takes gigabytes; this takes the offsets and the bytes)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(list(values), pa.string())).cast(pa.string())


def _steps_table(res: ReplayResult) -> TableSlices:
    """steps.parquet, made a row group at a time from the compact rows (`simulator.passrows`)."""
    rows = res.rows
    batch_requests = rows.pass_totals().astype(np.int64)
    batch_query = _sliced_pass_totals(rows, "query")
    # the keys each row's attention scored: its visible KV, or (attention="pool", the runtime's mask)
    # the pool's span, the high-water mark of the passes' pages, as the replay costed it
    span = (
        np.maximum.accumulate(_sliced_pass_totals(rows, "blocks")) * res.config.block_size
        if res.config.attention == "pool"
        else None
    )

    def make(columns: list[str], lo: int, hi: int) -> pa.Table:
        got: dict[str, np.ndarray] = {}

        def get(key: str) -> np.ndarray:
            if key not in got:
                got[key] = rows.column(key, lo, hi)
            return got[key]

        makers = _step_makers(res, get, lo, hi, batch_requests, batch_query, span)
        schema = pa.schema([TABLES["steps"].field(c) for c in columns])
        return pa.table({c: makers[c]() for c in columns}, schema=schema)

    return TableSlices(TABLES["steps"], rows.n, make)


def _step_makers(
    res: ReplayResult,
    get: Callable[[str], np.ndarray],
    lo: int,
    hi: int,
    batch_requests: np.ndarray,
    batch_query: np.ndarray,
    span: np.ndarray | None,
) -> dict[str, Callable[[], Any]]:
    """steps.parquet's columns for rows lo..hi, each made only when asked for, from the compact
    rows' columns (`get`, read once each) and the per-pass totals of `_steps_table`."""
    w, rows, bpb = res.workload, res.rows, res.bytes_per_block
    n = hi - lo

    def evicted() -> np.ndarray:
        return np.where(get("final"), w.evicted_tokens[get("flat")], 0)

    return {
        "request_id": lambda: w.request_ids[get("request")],
        "step_index": lambda: get("step_index"),
        "batch_index": lambda: get("batch_index"),
        # a recompute or a prefill chunk is a prefill pass; its note says what it re-prefilled
        "phase": lambda: _strings(np.where(get("final"), w.phase[get("flat")], PHASES.index("prefill")), PHASES),
        "start_s": lambda: get("start_s"),
        "duration_s": lambda: get("duration_s"),
        "streams": lambda: w.streams[get("flat")] if w.streams is not None else _strings(np.zeros(n, np.int8), ["0"]),
        "active_streams": lambda: get("groups"),
        "query_tokens": lambda: get("query"),
        "kv_tokens_read": lambda: get("kv_read"),
        "live_kv_tokens": lambda: get("live"),
        "kv_bytes_allocated": lambda: get("blocks") * bpb,
        "emitted_tokens": lambda: get("emits"),
        "evicted_tokens": evicted,
        "freed_kv_bytes": lambda: np.where(
            evicted() > 0, np.maximum(_previous_blocks(rows, lo, hi) - get("blocks"), 0) * bpb, 0
        ),
        "device_memory_bytes": lambda: np.full(n, -1, np.int64),
        "note": lambda: _notes(get("rebuild"), get("final")),
        # the schema_minor step columns (profiler.schema.MINOR_COLUMNS) of the replayed passes
        "batch_requests": lambda: batch_requests[get("batch_index")],
        "batch_query_tokens": lambda: batch_query[get("batch_index")],
        "recompute_tokens": lambda: get("rebuild"),
        "preempted_requests": lambda: np.zeros(n, np.int64),
        "attention_kv_tokens": lambda: get("kv_read") if span is None else get("query") * span[get("batch_index")],
        "chunk": lambda: ~get("final"),
        "host_s": lambda: np.full(n, np.nan),  # a replay does not split a pass's host work from its forward
        "forward_s": lambda: np.full(n, np.nan),
    }


def _sliced_pass_totals(rows: PassRows, key: str) -> np.ndarray:
    """Per pass: the sum of column `key` over its rows (whole numbers: exact in any order), a row
    group of the column at a time."""
    total = np.zeros(len(rows.pass_start_s))
    for lo in range(0, rows.n, ROW_GROUP_ROWS):
        hi = min(lo + ROW_GROUP_ROWS, rows.n)
        total += np.bincount(rows.batch[lo:hi], weights=rows.column(key, lo, hi), minlength=len(total))
    return total.astype(np.int64)


def _previous_blocks(rows: PassRows, lo: int, hi: int) -> np.ndarray:
    """Per row lo..hi: the pages its request held after its previous pass (0 for its first)."""
    a = max(lo - 1, 0)
    blocks, req = rows.column("blocks", a, hi), rows.request[a:hi]
    prev = np.where(np.r_[True, req[1:] != req[:-1]], 0, np.r_[0, blocks[:-1]])
    return prev[lo - a :]


def _notes(rebuild: np.ndarray, final: np.ndarray) -> pa.Array:
    """steps.note: what a recompute re-prefilled, and whether the row is a prefill chunk; "" for the
    rest (strings built for those rows only)."""
    at = np.flatnonzero((rebuild != 0) | ~final)
    text = [
        (f"{RECOMPUTE_NOTE} ({n} tokens)" if n else "") + ("" if f else ("; " if n else "") + CHUNK_NOTE)
        for n, f in zip(rebuild[at].tolist(), final[at].tolist())
    ]
    codes = np.zeros(len(rebuild), np.int64)
    codes[at] = np.arange(1, len(at) + 1)
    return _strings(codes, ["", *text])


def _tokens_table(res: ReplayResult, source) -> pa.Table | TableSlices:
    if source is not None and len(source.tokens):
        return _source_tokens(res, source)
    return _generated_tokens(res)


def _source_tokens(res: ReplayResult, source) -> pa.Table:
    """The source trace's token rows of each request, on the simulated passes."""
    w, r = res.workload, res.rows
    # request r's pass p (at offsets[r] + p) -> step index in the simulation: its row that completes
    # the pass (and emits its tokens), flat index pass_starts[r] + p
    sim_step = np.full(w.total_passes(), -1, np.int64)
    final, req = r["final"], r["request"][r["final"]]
    sim_step[w.offsets[req] + r["flat"][final] - w.pass_starts[req]] = r["step_index"][final]
    sid = w.source_ids()
    toks = source.tokens.sort_values(["request_id", "token_index"], kind="stable").reset_index(drop=True)
    tid = toks["request_id"].to_numpy(np.int64)
    lo, hi = np.searchsorted(tid, sid, "left"), np.searchsorted(tid, sid, "right")
    take = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)]) if len(sid) else np.zeros(0, np.int64)
    owner = np.repeat(np.arange(len(sid)), hi - lo)
    out = toks.iloc[take].reset_index(drop=True)
    step = out["step_index"].to_numpy(np.int64)
    valid = (step >= 0) & (step < w.n_passes[owner])
    out["step_index"] = np.where(valid, sim_step[w.offsets[:-1][owner] + np.where(valid, step, 0)], step)
    out["request_id"] = w.request_ids[owner]
    return pa.Table.from_pandas(out, schema=TABLES["tokens"], preserve_index=False)


def _generated_tokens(res: ReplayResult) -> TableSlices:
    """One token row per token a pass emitted (no texts: a workload file's requests have none),
    made a row group at a time."""
    w, rows = res.workload, res.rows
    emits = rows["emits"]
    total = int(emits.sum())
    # tokens emitted up to each row's end (rows by request, then pass)
    ends = np.cumsum(emits, dtype=np.int32 if total < 2**31 else np.int64)
    del emits
    # each request's first token row: the tokens of the rows before its first
    first_token = np.zeros(w.n_requests, np.int64)
    if len(ends):
        first_token[rows.first_row > 0] = ends[rows.first_row[rows.first_row > 0] - 1]

    def make(columns: list[str], a: int, b: int) -> pa.Table:
        lo = int(np.searchsorted(ends, a, "right"))  # the rows whose tokens are a..b
        hi = int(np.searchsorted(ends, b, "left")) + 1
        em = rows.column("emits", lo, hi)
        cut = slice(a - int(ends[lo] - em[0]), b - int(ends[lo] - em[0]))
        owner = np.repeat(rows.request[lo:hi], em)[cut]
        k = b - a
        makers = {
            "request_id": lambda: w.request_ids[owner],
            "token_index": lambda: np.arange(a, b, dtype=np.int64) - first_token[owner],
            "token_id": lambda: np.full(k, -1, np.int64),
            "token_text": lambda: np.full(k, "", object),
            "stream": lambda: np.zeros(k, np.int64),
            "step_index": lambda: np.repeat(rows.column("step_index", lo, hi), em)[cut],
            "position_id": lambda: np.full(k, -1, np.int64),
            "kv_slot": lambda: np.full(k, -1, np.int64),
            "kind": lambda: np.full(k, "content", object),
            "visible_streams": lambda: pa.ListArray.from_arrays(np.zeros(k + 1, np.int32), pa.array([], pa.int64())),
            "evicted_at_step": lambda: np.full(k, -1, np.int64),
        }
        schema = pa.schema([TABLES["tokens"].field(c) for c in columns])
        return pa.table({c: makers[c]() for c in columns}, schema=schema)

    return TableSlices(TABLES["tokens"], total, make)


def _requests_table(res: ReplayResult, source) -> pa.Table:
    rq = res.requests
    n = len(rq)
    src = None
    if source is not None and len(source.requests):
        src = source.requests.set_index("request_id").reindex(rq["source_request_id"].to_numpy())
    text = lambda c: src[c].fillna("").astype(str).to_numpy(object) if src is not None else np.full(n, "", object)  # noqa: E731
    preempts: dict[int, list] = {}
    for r, name, t in res.events:
        if name == "preempt":
            preempts.setdefault(r, []).append({"event": "preempted", "t_s": t})
    out_tok = rq["output_tokens"].to_numpy(np.int64)
    crit = src["critical_path_tokens"].fillna(0).to_numpy(np.int64) if src is not None else out_tok
    return pa.table(
        {
            "request_id": rq["request_id"],
            "prompt": text("prompt"),
            "reference": text("reference"),
            "prompt_tokens": rq["prompt_tokens"],
            "output_tokens": out_tok,
            "output_text": text("output_text"),
            "quality_score": rq["quality_score"],
            "arrival_s": rq["arrival_s"],
            "start_s": rq["start_s"],
            "ttft_s": rq["ttft_s"],
            "e2e_s": rq["e2e_s"],
            "steps": rq["steps"],
            "critical_path_tokens": crit,
            "theoretical_speedup": (
                src["theoretical_speedup"].to_numpy(float)
                if src is not None
                else np.where(crit > 0, out_tok / np.maximum(crit, 1), np.nan)
            ),
            "peak_live_kv_tokens": rq["peak_live_kv_tokens"],
            "peak_kv_bytes": rq["peak_kv_bytes"],
            "status": rq["status"],
            "stop_reason": text("stop_reason"),
            "error": rq["error"],
            "events": [json.dumps(preempts.get(r, [])) for r in range(n)],
            "queue_s": rq["start_s"] - rq["arrival_s"],
            "preemptions": rq["preemptions"],
            "recompute_tokens": np.bincount(
                res.rows.request[res.rows.own_at], weights=res.rows.own["rebuild"], minlength=n
            ).astype(np.int64),
        },
        schema=TABLES["requests"],
    )


def simulated_meta(res: ReplayResult) -> dict:
    w, hw, model = res.workload, res.hardware, res.model
    src = w.source
    return {
        "kind": "simulated",
        "system": src.get("system", "?"),
        "knobs": src.get("knobs", {}),
        "task": src.get("task"),
        "split": None,
        "seed": res.config.seed,
        "model": {
            **asdict(model),
            "params": model.params,
            "dtype_bytes": model.dtype_bytes,
            "kv_bytes_per_token": model.kv_bytes_per_token,
            "weight_bytes": model.weight_bytes,
        },
        "device": {"name": hw.name, "type": "simulated", "spec": asdict(hw)},
        "host": {
            "hostname": platform.node(),
            "platform": platform.platform(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        "counters_source": "none",
        "nvml": False,
        "nvml_reason": "simulated trace: no counters",
        "timer": "simpy",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "simulation": {
            "source_trace": src.get("path", ""),
            "source_kind": src.get("kind"),
            "source_model": (src.get("model") or {}).get("name"),
            "source_device": (src.get("device") or {}).get("name"),
            "hardware": hw.name,
            "model": model.name,
            "batch": res.config.describe(),
            "arrival": res.config.arrival,
            "kv_capacity_bytes": res.kv_capacity_bytes,
            "cost_params": res.cost_source,
        },
        "quality": {"quality_mean": res.metrics.get("quality_mean"), "from": "copied from the source trace"},
        "metrics": res.metrics,
    }


def shared_graphs(request_ids, source_ids, graphs: dict) -> dict:
    """graph.json in the shared form: each distinct source structure once, and which one each
    request follows (a 100k-request replay of a 16-request trace stores 16 graphs, not 100,000).
    `profiler.reader.read_trace` expands it to a graph per request (shared objects, no copies)."""
    empty = empty_graph()
    sid = np.asarray(source_ids, np.int64)
    distinct = np.unique(sid)
    return {
        "format": "shared",
        "structures": {str(int(s)): graphs.get(int(s), empty) for s in distinct},
        "request_ids": [int(r) for r in request_ids],
        "structure_of": [int(s) for s in sid],
    }


def write_simulated_trace(res: ReplayResult, out: str | Path, source=None) -> Path:
    """Write the replay as a trace directory (format v1, kind "simulated"); `source`: the read source trace."""
    w = res.workload
    if source is None and w.source.get("path"):
        from profiler.reader import read_trace

        source = read_trace(w.source["path"])
    # a workload file's requests follow a source's structure, not its tokens or texts
    token_source = None if w.source.get("workload_file") else source
    tables = {
        "requests": _requests_table(res, token_source),
        "steps": _steps_table(res),
        "tokens": _tokens_table(res, token_source),
    }
    return write_trace(out, simulated_meta(res), tables, shared_graphs(w.request_ids, w.source_ids(), w.graphs))
