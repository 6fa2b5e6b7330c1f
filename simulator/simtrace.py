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
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from profiler.schema import PHASES, TABLES
from profiler.writer import write_trace
from simulator.hardware import HardwareSpec
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig
from simulator.slo import goodput
from simulator.workload import CHUNK_NOTE, RECOMPUTE_NOTE, Workload


@dataclass
class ReplayResult:
    metrics: dict
    requests: pd.DataFrame  # one row per simulated request
    rows: dict[str, np.ndarray]  # one entry per (pass, request), sorted by request then pass
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


def _stats(name: str, values_s: np.ndarray) -> dict:
    v = np.asarray(values_s, float) * 1e3
    if not len(v):
        return {f"mean_{name}_ms": None, f"median_{name}_ms": None, f"p99_{name}_ms": None}
    return {
        f"mean_{name}_ms": float(v.mean()),
        f"median_{name}_ms": float(np.median(v)),
        f"p99_{name}_ms": float(np.percentile(v, 99)),
    }


def collect(sim) -> ReplayResult:
    """Flatten a finished `simulator.replay.Replay` into rows, per-request figures and metrics."""
    w: Workload = sim.w
    n = w.n_requests
    cols = (
        "req",
        "flat",
        "start",
        "dur",
        "batch",
        "query",
        "kv",
        "groups",
        "blocks",
        "live",
        "emits",
        "rebuild",
        "final",
    )
    plain = [s for s in sim.stretches if s.demand is None]
    parts = [_stretch_rows(sim, s) for s in sim.stretches if s.demand is not None]
    if plain:
        parts.append(_plain_rows(sim, plain))
    c = {}
    for k in cols:  # a column at a time, each part's copy freed as it goes (21 million rows at 100k requests)
        c[k] = (
            np.concatenate([p.pop(k) for p in parts])
            if parts
            else np.zeros(0, bool if k == "final" else float if k in ("start", "dur") else np.int64)
        )
    del parts
    order = np.lexsort((c["batch"], c["req"]))
    for k in cols:
        c[k] = c[k][order]
    del order
    req, flat, start, dur, batch = c["req"], c["flat"], c["start"], c["dur"], c["batch"]
    end = start + dur
    emits = c["emits"]
    counts = np.bincount(req, minlength=n)
    step_index = np.arange(len(req)) - np.repeat(np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)

    arrival = sim.arrival_s
    errored = np.array([r in sim.error for r in range(n)], bool)
    ok = ~errored
    em = emits > 0
    er, eend = req[em], end[em]
    ttft = np.full(n, np.nan)
    first_rows = np.unique(er, return_index=True)
    ttft[first_rows[0]] = eend[first_rows[1]] - arrival[first_rows[0]]
    e2e = np.where(ok, sim.finish_s - arrival, np.nan)
    out_tokens = w.output_tokens
    multi = ok & (out_tokens > 1) & ~np.isnan(ttft)
    tpot = np.full(n, np.nan)
    tpot[multi] = (e2e[multi] - ttft[multi]) / (out_tokens[multi] - 1)
    same = er[1:] == er[:-1]
    itl = np.diff(eend)[same] if len(eend) > 1 else np.zeros(0)

    bpb = sim.pool.bytes_per_block
    peak_blocks = -(-w.peak_alloc_tokens() // sim.config.block_size)
    duration = float(np.nanmax(sim.finish_s[ok])) if ok.any() else 0.0
    completed = int(ok.sum())
    total_out = int(out_tokens[ok].sum())
    total_in = int(w.prompt_tokens[ok].sum())
    per_s = lambda x: x / duration if duration > 0 else None  # noqa: E731
    q = w.quality_score[ok & ~np.isnan(w.quality_score)]
    metrics = {
        "completed": completed,
        "failed": int(errored.sum()),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "duration_s": duration,
        "request_throughput": per_s(completed),
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        **_stats("ttft", ttft[ok & ~np.isnan(ttft)]),
        **_stats("tpot", tpot[multi]),
        **_stats("itl", itl),
        **_stats("e2el", e2e[ok]),
        "peak_kv_bytes": int(sim.pool.peak_blocks * bpb),
        "kv_capacity_bytes": int(sim.pool.capacity_blocks * bpb),
        "passes": int(sim.n_pass),
        "mean_batch_requests": float(len(req) / sim.n_pass) if sim.n_pass else None,
        "preemptions": int(sim.preemptions.sum()),
        "recomputed_tokens": int(c["rebuild"].sum()),
        "prefill_chunks": int((~c["final"]).sum()),
        "device_busy_s": float(sim.device.busy_s),
        "quality_mean": float(q.mean()) if len(q) else None,
        **goodput(ttft, tpot, ok, duration, sim.config.slo_ttft_ms, sim.config.slo_tpot_ms),
    }
    requests = pd.DataFrame(
        {
            "request_id": w.request_ids,
            "source_request_id": w.source_ids(),
            "arrival_s": arrival,
            "start_s": sim.start_s,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
            "steps": counts,
            "preemptions": sim.preemptions,
            "prompt_tokens": w.prompt_tokens,
            "output_tokens": out_tokens,
            "peak_live_kv_tokens": _peak(w.live_kv_tokens, w.offsets),
            "peak_kv_bytes": peak_blocks * bpb,
            "quality_score": w.quality_score,
            "status": [("error" if errored[r] else w.status[r]) for r in range(n)],
            "error": [sim.error.get(r, "") for r in range(n)],
        }
    )
    rows = {
        "request": req,
        "flat": flat,
        "start_s": start,
        "duration_s": dur,
        "batch_index": batch,
        "step_index": step_index,
        "emits": emits,
        "query": c["query"],
        "kv_read": c["kv"],
        "groups": c["groups"],
        "blocks": c["blocks"],
        "live": c["live"],
        "rebuild": c["rebuild"],
        "final": c["final"],
    }
    return ReplayResult(
        metrics,
        requests,
        rows,
        list(sim.events),
        w,
        sim.config,
        sim.hardware,
        sim.model,
        int(sim.capacity_bytes),
        bpb,
        getattr(getattr(sim.cost, "params", None), "source", ""),
    )


def _plain_rows(sim, stretches: list) -> dict[str, np.ndarray]:
    """`_stretch_rows` of many stretches of whole workload passes at once (no Python loop per row)."""
    n_req = np.array([len(s.requests) for s in stretches], np.int64)
    n_pass = np.array([len(s.durations_s) for s in stretches], np.int64)
    pass0 = np.concatenate([[0], np.cumsum(n_pass)[:-1]])  # each stretch's first entry in the pass arrays
    m = np.repeat(n_pass, n_req)  # passes of each (stretch, request)
    total = int(m.sum())
    j = np.arange(total) - np.repeat(np.cumsum(m) - m, m)  # pass within the stretch
    at = np.repeat(np.repeat(pass0, n_req), m) + j
    flat = np.repeat(np.concatenate([s.first_pass for s in stretches]), m) + j
    return {
        "req": np.repeat(np.concatenate([s.requests for s in stretches]), m),
        "start": np.concatenate([s.starts_s for s in stretches])[at],
        "dur": np.concatenate([s.durations_s for s in stretches])[at],
        "batch": np.repeat(np.repeat([s.first_batch for s in stretches], n_req), m) + j,
        **_workload_rows(sim, flat),
    }


def _workload_rows(sim, flat: np.ndarray) -> dict[str, np.ndarray]:
    """The columns of whole passes taken from the workload (`flat`: their pass indices)."""
    w = sim.w
    return {
        "flat": flat,
        "query": w.query_tokens[flat],
        "kv": w.kv_tokens_read[flat],
        "groups": w.query_groups[flat],
        "blocks": sim.blocks[flat],
        "live": w.live_kv_tokens[flat],
        "emits": w.emits[flat],
        "rebuild": np.zeros(len(flat), np.int64),
        "final": np.ones(len(flat), bool),
    }


def _stretch_rows(sim, s) -> dict[str, np.ndarray]:
    """One entry per (pass, request) of a stretch: the workload's passes, or the single pass's own demand."""
    m, R = len(s.durations_s), s.requests
    out = {
        "req": np.repeat(R, m),
        "start": np.tile(s.starts_s, len(R)),
        "dur": np.tile(s.durations_s, len(R)),
        "batch": s.first_batch + np.tile(np.arange(m), len(R)),
    }
    if s.demand is not None:
        d = s.demand
        return {
            **out,
            "flat": d.flat,
            "query": d.query,
            "kv": d.kv_read,
            "groups": d.groups,
            "blocks": d.blocks,
            "live": d.live,
            "emits": d.emits,
            "rebuild": d.rebuild,
            "final": d.final,
        }
    flat = (s.first_pass[:, None] + np.arange(m)[None, :]).ravel()
    return {**out, **_workload_rows(sim, flat)}


def _peak(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    out = np.zeros(len(offsets) - 1, np.int64)
    has = np.diff(offsets) > 0
    if has.any():
        out[has] = np.maximum.reduceat(values, offsets[:-1][has])
    return out


# ---- the simulated trace --------------------------------------------------------------------
def _strings(codes: np.ndarray, values) -> pa.Array:
    """A string column from small codes into a few values, built in Arrow (a numpy or object
    array of 21 million short strings takes gigabytes; this takes the offsets and the bytes)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(list(values), pa.string())).cast(pa.string())


def _steps_table(res: ReplayResult) -> pa.Table:
    w, r = res.workload, res.rows
    flat, req, final, rebuild = r["flat"], r["request"], r["final"], r["rebuild"]
    bpb = res.bytes_per_block
    blocks = r["blocks"]
    first = np.r_[True, req[1:] != req[:-1]] if len(req) else np.zeros(0, bool)
    prev_blocks = np.where(first, 0, np.roll(blocks, 1))
    evicted = np.where(final, w.evicted_tokens[flat], 0)
    # a recompute or a prefill chunk is a prefill pass; its note says what it re-prefilled
    phases = _strings(np.where(final, w.phase[flat], PHASES.index("prefill")), PHASES)
    streams = w.streams[flat] if w.streams is not None else _strings(np.zeros(len(flat), np.int8), ["0"])
    note = np.array(
        [
            (f"{RECOMPUTE_NOTE} ({n} tokens)" if n else "") + ("" if f else ("; " if n else "") + CHUNK_NOTE)
            for n, f in zip(rebuild.tolist(), final.tolist())
        ],
        dtype=object,
    )
    return pa.table(
        {
            "request_id": w.request_ids[req],
            "step_index": r["step_index"],
            "batch_index": r["batch_index"],
            "phase": phases,
            "start_s": r["start_s"],
            "duration_s": r["duration_s"],
            "streams": streams,
            "active_streams": r["groups"],
            "query_tokens": r["query"],
            "kv_tokens_read": r["kv_read"],
            "live_kv_tokens": r["live"],
            "kv_bytes_allocated": blocks * bpb,
            "emitted_tokens": r["emits"],
            "evicted_tokens": evicted,
            "freed_kv_bytes": np.where(evicted > 0, np.maximum(prev_blocks - blocks, 0) * bpb, 0),
            "device_memory_bytes": np.full(len(flat), -1, np.int64),
            "note": note,
            **_serving_step_columns(r),
        },
        schema=TABLES["steps"],
    )


def _pass_totals(batch: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per row: the sum of `values` over the rows of its pass (same `batch_index`)."""
    if not len(batch):
        return np.zeros(0, np.int64)
    _, inv = np.unique(batch, return_inverse=True)
    return np.bincount(inv, weights=values).astype(np.int64)[inv]


def _serving_step_columns(r: dict) -> dict[str, np.ndarray]:
    """The schema_minor step columns (profiler.schema.MINOR_COLUMNS) of the replayed passes."""
    batch, n = r["batch_index"], len(r["flat"])
    return {
        "batch_requests": _pass_totals(batch, np.ones(n)),
        "batch_query_tokens": _pass_totals(batch, r["query"]),
        "recompute_tokens": r["rebuild"],
        "preempted_requests": np.zeros(n, np.int64),
        "attention_kv_tokens": r["kv_read"],
        "chunk": ~r["final"],
        "host_s": np.full(n, np.nan),  # a replay does not split a pass's host work from its forward
    }


def _tokens_table(res: ReplayResult, source) -> pa.Table:
    w, r = res.workload, res.rows
    sim_step = np.full(w.total_passes(), -1, np.int64)  # pass of the workload -> step index in the simulation
    final = r["final"]  # the row that completes a workload pass emits its tokens
    sim_step[r["flat"][final]] = r["step_index"][final]
    sid = w.source_ids()
    if source is not None and len(source.tokens):
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
    em = r["emits"]
    owner = np.repeat(r["request"], em)
    counts = np.bincount(owner, minlength=w.n_requests)
    index = np.arange(len(owner)) - np.repeat(np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    k = len(owner)
    return pa.table(
        {
            "request_id": w.request_ids[owner],
            "token_index": index,
            "token_id": np.full(k, -1, np.int64),
            "token_text": np.full(k, "", object),
            "stream": np.zeros(k, np.int64),
            "step_index": np.repeat(r["step_index"], em),
            "position_id": np.full(k, -1, np.int64),
            "kv_slot": np.full(k, -1, np.int64),
            "kind": np.full(k, "content", object),
            "visible_streams": pa.ListArray.from_arrays(np.zeros(k + 1, np.int32), pa.array([], pa.int64())),
            "evicted_at_step": np.full(k, -1, np.int64),
        },
        schema=TABLES["tokens"],
    )


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
            "recompute_tokens": np.bincount(res.rows["request"], weights=res.rows["rebuild"], minlength=n).astype(
                np.int64
            ),
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
    empty = {"directed": True, "multigraph": False, "graph": {}, "nodes": [], "links": []}
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
