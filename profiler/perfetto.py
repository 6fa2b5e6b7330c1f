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
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.outdir import write_file_atomic
from profiler.reader import Trace
from profiler.schema import COUNTERS
from profiler.validate import read_valid_trace

if TYPE_CHECKING:
    import pandas as pd

US = 1e6
PID_BLOCK = 1_000_000  # process ids of trace i: i * PID_BLOCK + ...
COUNTER_PID = 0  # within a block: the counters process; request r is r + 1
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
    base = index * PID_BLOCK
    label = f"{trace.name} [{trace.kind} {trace.system}]"
    events: list[dict] = []
    steps = trace.steps.sort_values(["request_id", "start_s", "step_index"])
    for rid, group in steps.groupby("request_id", sort=True):
        events += _request_events(group, base + int(rid) + 1, f"{label} request {int(rid)}")
    if len(trace.counters):
        events += _counter_events(trace.counters, base + COUNTER_PID, label)
    return events


def _request_events(group: pd.DataFrame, pid: int, name: str) -> list[dict]:
    """One request's process: its forward-pass track, a track per stream, its KV counter tracks."""
    events = _meta_event("process_name", pid, STEPS_TID, name, pid)
    events += _meta_event("thread_name", pid, STEPS_TID, "forward passes", 0)
    seen_streams: set[int] = set()
    for s in group.itertuples(index=False):
        ts, dur = _us(s.start_s), _us(s.duration_s)
        args = {k: int(getattr(s, k)) for k in STEP_ARGS}
        args["streams"] = s.streams
        if s.note:
            args["note"] = s.note
        events.append(_event("X", "step", s.phase, ts, dur, pid, STEPS_TID, args))
        for stream in _streams(s.streams):
            tid = stream + 1
            if stream not in seen_streams:
                seen_streams.add(stream)
                events += _meta_event("thread_name", pid, tid, f"stream {stream}", tid)
            stream_args = {"stream": stream, "step_index": int(s.step_index)}
            events.append(_event("X", "stream", f"{s.phase} s{stream}", ts, dur, pid, tid, stream_args))
        end = _us(s.start_s + s.duration_s)
        live = {"live_kv_tokens": int(s.live_kv_tokens)}
        events.append(_event("C", "kv", "live KV", end, 0, pid, STEPS_TID, live))
        held = {"kv_bytes_allocated": int(s.kv_bytes_allocated)}
        events.append(_event("C", "kv", "KV bytes held", end, 0, pid, STEPS_TID, held))
    return events


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


def to_chrome_trace(traces: list[Trace]) -> dict:
    """The JSON object of one or more traces (several open side by side)."""
    events: list[dict] = []
    for i, t in enumerate(traces):
        events += trace_events(t, i)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
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
        },
    }


def export_perfetto(paths: list[str | Path], out: str | Path) -> dict:
    """Read the traces at `paths`, write `out`; returns a summary of what was written."""
    traces = [read_valid_trace(p) for p in paths]
    doc = to_chrome_trace(traces)
    out_path = Path(out)
    if out_path.parent and not out_path.parent.exists():
        raise FileNotFoundError(f"{out_path.parent}: no such directory for the --perfetto output")
    write_file_atomic(out_path, json.dumps(doc, separators=(",", ":")))  # whole or not at all
    ev = doc["traceEvents"]
    return {
        "out": str(out_path),
        "traces": [str(t.path) for t in traces],
        "events": len(ev),
        "complete_events": sum(e["ph"] == "X" for e in ev),
        "counter_events": sum(e["ph"] == "C" and e.get("cat") == "counter" for e in ev),
        "requests": sum(len(t.requests) for t in traces),
        "bytes": out_path.stat().st_size,
    }
