"""Trace format version 1: the contract between the runtime that writes traces and the simulator
and dashboard that read them. See docs/trace-format.md for the meaning of every column.

A trace is a directory:
    meta.json          schema version, kind (measured / simulated), system, knobs, task, model,
                       device, host, counters source, seed, creation time, completeness
    requests.parquet   one row per request
    steps.parquet      one row per (forward pass, request)
    tokens.parquet     one row per generated token
    counters.parquet   NVML or host time series
    graph.json         {request_id: node-link chunk DAG}
Every column name carries its unit (`_s`, `_bytes`, `_w`, `_mj`, `_tokens`, `_percent`, ...);
ids and indices are plain integers.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1
# Minor revisions add columns only (`MINOR_COLUMNS`); meta.json's `schema_minor` (absent: 0) says
# which a trace was written with, and readers fill a column an older trace lacks with its default.
#   1: serving under load (runtime.serve_capture)
#   2: each request's host work per pass (steps.host_s)
#   3: the pass's forward alone (steps.forward_s)
SCHEMA_MINOR = 3
KINDS = ("measured", "simulated")
# the slowest Poisson arrival rate (requests/s) a capture or a replay draws arrival_s from: slower
# than one request a day, arrival times grow so large that float64 loses the microseconds latencies
# are made of (at 1e-300 requests/s a replay read every latency 0.0 ms, and a capture's clock
# overflowed time.sleep)
MIN_RATE = 1e-5

REQUESTS = pa.schema(
    [
        ("request_id", pa.int64()),
        ("prompt", pa.string()),
        ("reference", pa.string()),  # expected answer ("" when there is none)
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("output_text", pa.string()),
        ("quality_score", pa.float64()),  # 0..1; NaN = not applicable (e.g. structure replay)
        ("arrival_s", pa.float64()),  # relative to the run's start
        ("start_s", pa.float64()),
        ("ttft_s", pa.float64()),  # from arrival to the end of the pass that produced the first token
        ("e2e_s", pa.float64()),  # from arrival to the end of the last pass
        ("steps", pa.int64()),
        ("critical_path_tokens", pa.int64()),
        ("theoretical_speedup", pa.float64()),  # output tokens / critical path
        ("peak_live_kv_tokens", pa.int64()),
        ("peak_kv_bytes", pa.int64()),
        ("status", pa.string()),  # ok, truncated, error
        ("stop_reason", pa.string()),
        ("error", pa.string()),
        ("events", pa.string()),  # JSON list of recorded fallbacks / guard hits
    ]
)

STEPS = pa.schema(
    [
        ("request_id", pa.int64()),
        ("step_index", pa.int64()),  # within the request
        ("batch_index", pa.int64()),  # global forward-pass index (rows of one batched pass share it)
        ("phase", pa.string()),  # prefill, decode, plan, denoise, sync
        ("start_s", pa.float64()),
        ("duration_s", pa.float64()),
        ("streams", pa.string()),  # comma-separated stream ids with a query row in this pass
        ("active_streams", pa.int64()),
        ("query_tokens", pa.int64()),
        ("kv_tokens_read", pa.int64()),  # sum over query rows of visible slots
        ("live_kv_tokens", pa.int64()),  # after the pass
        ("kv_bytes_allocated", pa.int64()),  # after the pass (whole pages held)
        ("emitted_tokens", pa.int64()),
        ("evicted_tokens", pa.int64()),  # declared dead by this pass (logical eviction)
        ("freed_kv_bytes", pa.int64()),  # released by this pass (physical eviction)
        ("device_memory_bytes", pa.int64()),  # -1 when unknown
        ("note", pa.string()),
    ]
)

TOKENS = pa.schema(
    [
        ("request_id", pa.int64()),
        ("token_index", pa.int64()),  # index in the final output
        ("token_id", pa.int64()),
        ("token_text", pa.string()),
        ("stream", pa.int64()),  # thread / span / register step that produced it
        ("step_index", pa.int64()),  # the pass that produced it
        ("position_id", pa.int64()),
        ("kv_slot", pa.int64()),  # -1: never written
        ("kind", pa.string()),  # content, tag, plan, mask, pad
        ("visible_streams", pa.list_(pa.int64())),  # -1 is the prompt
        ("evicted_at_step", pa.int64()),  # -1: never evicted
    ]
)

COUNTERS = pa.schema(
    [
        ("t_s", pa.float64()),  # relative to the run's start
        ("source", pa.string()),  # nvml or host
        ("gpu_memory_used_bytes", pa.float64()),
        ("gpu_utilization_percent", pa.float64()),
        ("power_w", pa.float64()),
        ("energy_mj", pa.float64()),  # cumulative since the sampler started
        ("sm_clock_mhz", pa.float64()),
        ("temperature_c", pa.float64()),
        ("cpu_percent", pa.float64()),
        ("rss_bytes", pa.float64()),
    ]
)

# the v1.0 columns (what every v1 trace has)
BASE_TABLES: dict[str, pa.Schema] = {"requests": REQUESTS, "steps": STEPS, "tokens": TOKENS, "counters": COUNTERS}

# Columns of minor revisions: (field, default). A default is a constant, or ("copy", column) to take
# another column's value (a trace served one request at a time: each pass is that request's alone).
MINOR_COLUMNS: dict[str, list[tuple[pa.Field, object]]] = {
    "requests": [
        (pa.field("queue_s", pa.float64()), float("nan")),  # arrival to first scheduled
        (pa.field("preemptions", pa.int64()), 0),  # times the request was preempted
        (pa.field("recompute_tokens", pa.int64()), 0),  # tokens re-prefilled after preemptions: not new demand
    ],
    "steps": [
        (pa.field("batch_requests", pa.int64()), 1),  # requests with rows in this pass
        (pa.field("batch_query_tokens", pa.int64()), ("copy", "query_tokens")),  # rows of the whole pass
        (pa.field("recompute_tokens", pa.int64()), 0),  # this request's re-prefill rows in the pass
        (pa.field("preempted_requests", pa.int64()), 0),  # requests preempted when the pass was scheduled
        (pa.field("attention_kv_tokens", pa.int64()), ("copy", "kv_tokens_read")),  # keys scored for its rows
        (pa.field("chunk", pa.bool_()), False),  # a (re-)prefill chunk: nothing sampled, step_index -1
        # minor 2: the engine's own host work for this request in the pass (building its rows, sampling,
        # bookkeeping), inside duration_s or, in a batched pass, between passes; NaN: not recorded
        (pa.field("host_s", pa.float64()), float("nan")),
        # minor 3: the pass's forward alone (the model's call, device synchronised), the same on every row
        # of a batched pass; duration_s less forward_s is host work; NaN: not recorded
        (pa.field("forward_s", pa.float64()), float("nan")),
    ],
}

TABLES: dict[str, pa.Schema] = {
    name: pa.schema(list(schema) + [f for f, _ in MINOR_COLUMNS.get(name, [])]) for name, schema in BASE_TABLES.items()
}


def fill_defaults(name: str, table: pa.Table, columns: Collection[str] | None = None) -> pa.Table:
    """`table` with every minor-revision column it lacks (of `columns` only, when given), filled with
    that column's default."""
    for field, value in MINOR_COLUMNS.get(name, []):
        if field.name in table.column_names or (columns is not None and field.name not in columns):
            continue
        if isinstance(value, tuple):
            arr = (
                table.column(value[1]).cast(field.type)
                if value[1] in table.column_names
                else pa.nulls(table.num_rows, field.type)
            )
        else:
            arr = pa.repeat(pa.scalar(value, field.type), table.num_rows)  # not a Python list of 21 million
        table = table.append_column(field, arr)
    return table


# Optional `runs.parquet` of a measured trace: every timed run of every request (`capture --repeats`
# records one run per request in the tables above; this keeps them all, one row per forward pass of
# each run, on the capture's real clock). See profiler/runs.py.
RUNS = pa.schema(
    [
        ("request_id", pa.int64()),
        ("run", pa.int64()),  # the round it ran in: 0 = the first (a `--repeats 1` capture's only run)
        ("recorded", pa.bool_()),  # the run the trace's tables hold (shifted onto their timeline)
        ("same_output", pa.bool_()),  # its output tokens equal the first run's
        ("arrival_s", pa.float64()),  # the request's, on the capture's clock (repeated on each of its rows)
        ("ttft_s", pa.float64()),
        ("e2e_s", pa.float64()),
        ("step_index", pa.int64()),
        ("start_s", pa.float64()),
        ("duration_s", pa.float64()),
    ]
)

META_REQUIRED = ("schema_version", "kind", "system", "model", "device", "created_at")


CHUNK_NOTE = "prefill chunk"  # steps.note of a chunk of a prefill that is not its last


def chunk_rows(steps: pd.DataFrame) -> np.ndarray:
    """Which steps rows are chunks of a prefill that is not its last (`note` "prefill chunk", or a true
    `chunk` column): a serving capture's part of a pass, with no query rows or stream of its own."""
    if "note" in steps:
        chunk = steps["note"].fillna("").astype(str).str.contains(CHUNK_NOTE, regex=False).to_numpy(bool)
    else:
        chunk = np.zeros(len(steps), bool)
    if "chunk" in steps:
        chunk = chunk | steps["chunk"].fillna(False).to_numpy(bool)
    return chunk


PHASES = ("prefill", "decode", "plan", "denoise", "sync")
STATUSES = ("ok", "truncated", "error")  # a request: stopped itself, cut at a bound, or never ran
TOKEN_KINDS = ("content", "tag", "plan", "mask", "pad")


def empty_graph() -> dict:
    """graph.json of a request that never ran (a server's error row): node-link form, no chunks."""
    return {"directed": True, "multigraph": False, "graph": {}, "nodes": [], "links": []}


def linear_graph(prompt_tokens: int, output_tokens: int) -> dict:
    """graph.json of a request with no parallel structure: its prompt, then one main chunk (the
    runtime's sequential engines and the simulator's synthetic workloads)."""
    return {
        "directed": True,
        "multigraph": False,
        "graph": {},
        "nodes": [
            {"id": "prompt", "kind": "prompt", "stream": -1, "tokens": prompt_tokens},
            {"id": "main:0", "kind": "main", "stream": 0, "tokens": output_tokens},
        ],
        "links": [{"source": "prompt", "target": "main:0"}],
    }
