"""Perfetto / chrome://tracing export of traces, measured and simulated alike.

What: the Chrome trace event format (the JSON object form, `{"traceEvents": [...]}`), which
Perfetto (ui.perfetto.dev) and chrome://tracing open. Each request is a process; its first track
("forward passes") holds one complete event (`ph: "X"`) per forward pass, named by its phase, and
each stream (thread / span / register step) has its own track with one complete event per pass in
which it had a query row. Live KV tokens and bytes held after each pass are counter tracks of the
request. The trace's counter samples (NVML or host) are counter events (`ph: "C"`) of a
"counters" process, one event per sample and column, values as sampled. Times are microseconds
(`ts`, `dur`) from the start of the run; every event carries `ph`, `ts`, `dur`, `pid`, `tid`
(instant ones, counters and track names, have `dur: 0`).

Why: style item 9 (vidur `to_chrome_trace`, gpt-fast `--profile`): several traces exported into
one file open side by side, each under its own block of process ids.

    from profiler.perfetto import export_perfetto
    export_perfetto(["traces/seq", "sim/h100"], "both.json")
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from profiler.errors import UsageError
from profiler.outdir import write_chunks_atomic
from profiler.reader import Trace
from profiler.schema import COUNTERS
from profiler.validate import read_valid_trace

if TYPE_CHECKING:
    import pandas as pd

US = 1e6
PID_BLOCK = 1_000_000  # process ids of trace i: i * PID_BLOCK + ...
COUNTER_PID = 0  # within a block: the counters process; a request is its rank among the ids + 1
STEPS_TID = 0  # within a request: forward passes; stream s is s + 1 (the prompt, -1, is tid 0)
COUNTER_COLUMNS = tuple(f.name for f in COUNTERS if f.name not in ("t_s", "source"))
STEP_ARGS = (
    "step_index",
    "batch_index",
    "query_tokens",
    "kv_tokens_read",
    "active_streams",
    "emitted_tokens",
    "evicted_tokens",
    "live_kv_tokens",
    "kv_bytes_allocated",
    "freed_kv_bytes",
)


def _us(seconds: float) -> float:
    return round(float(seconds) * US, 3)


def _meta_event(name: str, pid: int, tid: int, value: str, sort_index: int | None = None) -> list[dict]:
    out = [{"ph": "M", "name": name, "ts": 0, "dur": 0, "pid": pid, "tid": tid, "args": {"name": value}}]
    if sort_index is not None:
        key = "process_sort_index" if name == "process_name" else "thread_sort_index"
        out.append(
            {"ph": "M", "name": key, "ts": 0, "dur": 0, "pid": pid, "tid": tid, "args": {"sort_index": sort_index}}
        )
    return out


def _streams(cell: str) -> list[int]:
    return [int(s) for s in str(cell).split(",") if s.strip() not in ("", "nan")]


def _event(ph: str, cat: str, name: str, ts: float, dur: float, pid: int, tid: int, args: dict) -> dict:
    """One trace event, its keys in the order every exported event has them."""
    return {"ph": ph, "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def trace_events(trace: Trace, index: int = 0) -> list[dict]:
    """Events of one trace under process ids `index * PID_BLOCK + ...`."""
    return list(iter_trace_events(trace, index))


def iter_trace_events(trace: Trace, index: int = 0) -> Iterator[dict]:
    """`trace_events`, one at a time: each request's process (in request id order), then the
    counters process. A request's process id is its rank among the trace's request ids plus one
    (its id plus one when the ids are 0..n-1, as the writers leave them), so any ids stay inside
    the trace's block (was: id + 1, and request -1 landed in the counters process, an id of a
    million in the next trace's block)."""
    if len(trace.requests) >= PID_BLOCK:
        raise UsageError(
            f"{trace.path}: {len(trace.requests)} requests; an export holds at most {PID_BLOCK - 1} per trace"
        )
    base = index * PID_BLOCK
    label = f"{trace.name} [{trace.kind} {trace.system}]"
    ids = np.sort(trace.requests["request_id"].to_numpy(np.int64))
    steps = trace.steps.sort_values(["request_id", "start_s", "step_index"])
    pids = base + 1 + np.searchsorted(ids, steps["request_id"].to_numpy(np.int64))
    pid, seen_streams = -1, set[int]()  # no process yet: every pid is >= 1
    for p, rid, phase, start, duration, streams, note, values in _rows(steps, pids):
        if p != pid:  # the request's process and its forward-pass track
            pid, seen_streams = p, set()
            yield from _meta_event("process_name", pid, STEPS_TID, f"{label} request {int(rid)}", pid)
            yield from _meta_event("thread_name", pid, STEPS_TID, "forward passes", 0)
        ts, dur = _us(start), _us(duration)
        step: dict[str, Any] = {k: int(v) for k, v in zip(STEP_ARGS, values)}
        step["streams"] = streams
        if isinstance(note, str) and note:  # a missing cell: None from disk, NaN in a table built in memory
            step["note"] = note
        yield _event("X", "step", phase, ts, dur, pid, STEPS_TID, step)
        for stream in _streams(streams):
            tid = stream + 1
            if stream not in seen_streams:
                seen_streams.add(stream)
                yield from _meta_event("thread_name", pid, tid, f"stream {stream}", tid)
            stream_args = {"stream": stream, "step_index": step["step_index"]}
            yield _event("X", "stream", f"{phase} s{stream}", ts, dur, pid, tid, stream_args)
        end = _us(start + duration)
        live, held = {"live_kv_tokens": step["live_kv_tokens"]}, {"kv_bytes_allocated": step["kv_bytes_allocated"]}
        yield _event("C", "kv", "live KV", end, 0, pid, STEPS_TID, live)
        yield _event("C", "kv", "KV bytes held", end, 0, pid, STEPS_TID, held)
    if len(trace.counters):
        yield from _counter_events(trace.counters, base + COUNTER_PID, label)


def _rows(steps: pd.DataFrame, pids: np.ndarray, chunk: int = 65_536) -> Iterator[tuple]:
    """(pid, request_id, phase, start_s, duration_s, streams, note, STEP_ARGS values) per row, as
    Python values, read `chunk` rows at a time (lists of every row's values of a 2-million-row
    steps table took more memory than the table)."""
    columns = ("request_id", "phase", "start_s", "duration_s", "streams", "note")
    for lo in range(0, len(steps), chunk):
        part = steps.iloc[lo : lo + chunk]
        values = zip(*(part[k].tolist() for k in STEP_ARGS))
        yield from zip(pids[lo : lo + chunk].tolist(), *(part[c].tolist() for c in columns), values, strict=True)


def _counter_events(counters: pd.DataFrame, pid: int, label: str) -> list[dict]:
    """The "counters" process: one counter event per sample and column (missing values skipped)."""
    source = ",".join(sorted(set(counters["source"].dropna()))) or "?"
    events = _meta_event("process_name", pid, 0, f"{label} counters ({source})", pid)
    for col in COUNTER_COLUMNS:
        for t, v in zip(counters["t_s"], counters[col]):
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            events.append(_event("C", "counter", col, _us(t), 0, pid, 0, {col: float(v)}))
    return events


def _other_data(traces: list[Trace]) -> dict:
    return {
        "solm_traces": [
            {
                "trace": str(t.path),
                "kind": t.kind,
                "system": t.system,
                "pid_base": i * PID_BLOCK,
                "schema_version": t.meta.get("schema_version"),
            }
            for i, t in enumerate(traces)
        ]
    }


def to_chrome_trace(traces: list[Trace]) -> dict:
    """The JSON object of one or more traces (several open side by side)."""
    events = [e for i, t in enumerate(traces) for e in iter_trace_events(t, i)]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": _other_data(traces)}


def _document(traces: list[Trace], counts: dict[str, int], batch: int = 10_000) -> Iterator[str]:
    """`to_chrome_trace(traces)` as compact JSON text, the same bytes as json.dumps of it with
    separators (",", ":"), in pieces of `batch` events: the events are never all in memory (an
    export of a simulated trace of 100,000 requests held 9.4 GB); `counts` is filled in as they go."""
    encode = json.JSONEncoder(separators=(",", ":")).encode
    yield '{"traceEvents":['
    pending: list[str] = []
    sep = ""
    for i, t in enumerate(traces):
        for e in iter_trace_events(t, i):
            counts["events"] += 1
            counts["complete_events"] += e["ph"] == "X"
            counts["counter_events"] += e["ph"] == "C" and e["cat"] == "counter"
            pending.append(encode(e))
            if len(pending) == batch:
                yield sep + ",".join(pending)
                pending, sep = [], ","
    if pending:
        yield sep + ",".join(pending)
    yield f'],"displayTimeUnit":"ms","otherData":{encode(_other_data(traces))}}}'


def export_perfetto(paths: list[str | Path], out: str | Path) -> dict:
    """Read the traces at `paths`, write `out`; returns a summary of what was written."""
    traces = [read_valid_trace(p) for p in paths]
    out_path = Path(out)
    if out_path.parent and not out_path.parent.exists():
        raise FileNotFoundError(f"{out_path.parent}: no such directory for the --perfetto output")
    counts = dict.fromkeys(("events", "complete_events", "counter_events"), 0)
    write_chunks_atomic(out_path, _document(traces, counts))  # whole or not at all
    return {
        "out": str(out_path),
        "traces": [str(t.path) for t in traces],
        **counts,
        "requests": sum(len(t.requests) for t in traces),
        "bytes": out_path.stat().st_size,
    }
