"""Trace validator: beyond what the reader checks (files, schema version, columns, types), the
cross-table facts every trace must satisfy. Returns a list of problems; empty means valid.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from profiler.reader import Trace, TraceError, read_trace
from profiler.schema import PHASES, STATUSES, TOKEN_KINDS, chunk_rows

# steps.streams: the stream ids with a query row, comma-separated (none for a row without one)
_STREAMS = re.compile(r"(\s*-?\d{1,18}\s*(,\s*-?\d{1,18}\s*)*)?")


def problems(trace: Trace) -> list[str]:
    out: list[str] = []
    req, steps, toks = trace.requests, trace.steps, trace.tokens
    ids = set(req["request_id"].tolist())
    if not len(req):  # a capture stopped before its first request finished: figures of nothing
        out.append("no requests (a run stopped before its first request finished)")
    if len(ids) != len(req):
        out.append("requests: duplicate request_id")
    for name, df in (("steps", steps), ("tokens", toks)):
        stray = set(df["request_id"].tolist()) - ids
        if stray:
            out.append(f"{name}: rows for unknown requests {sorted(stray)[:5]}")
    stray = set(trace.graphs) - ids  # was: kept and read by nothing, the trace called valid
    if stray:
        out.append(f"graph.json: graphs for unknown requests {sorted(stray)[:5]}")
    bad_phase = set(steps["phase"].unique()) - set(PHASES)
    if bad_phase:
        out.append(f"steps: unknown phases {sorted(bad_phase)}")
    bad_status = set(req["status"].unique()) - set(STATUSES)
    if bad_status:  # was: read as finished requests (only "error" is told apart)
        out.append(f"requests: unknown statuses {sorted(bad_status)}")
    bad_streams = [v for v in steps["streams"].unique() if not _STREAMS.fullmatch(v)]
    if bad_streams:  # was: `solm export` exit 1 (int() of the text), the dashboard's timeline too
        out.append(
            f"steps: streams must be comma-separated stream ids, got {', '.join(map(repr, bad_streams[:3]))}"[:300]
        )
    bad_kind = set(toks["kind"].unique()) - set(TOKEN_KINDS)
    if bad_kind:
        out.append(f"tokens: unknown kinds {sorted(bad_kind)}")
    # a serving capture's prefill-chunk rows (step_index -1, no rows or KV figures of their own: -1) are
    # parts of a pass, not passes (was: every --chunked-prefill capture refused by inspect and simulate)
    passes = steps[~chunk_rows(steps)]
    for col in ("query_tokens", "kv_tokens_read", "live_kv_tokens", "kv_bytes_allocated"):
        if (passes[col] < 0).any() or (steps[col] < -1).any():
            out.append(f"steps: negative {col}")
    # counts no writer leaves negative on any row, chunk rows included (were: `inspect --validate` said
    # valid, and simulate replayed the trace, exit 0); a negative batch_index is allowed: it marks a pass not
    # batched (simulator.validation._pass_frame)
    for col in ("emitted_tokens", "evicted_tokens", "freed_kv_bytes"):
        if col in steps and (steps[col] < 0).any():
            out.append(f"steps: negative {col}")
    if "device_memory_bytes" in steps and (steps["device_memory_bytes"] < -1).any():
        out.append("steps: device_memory_bytes below -1 (its mark for unknown)")
    for col in ("query_tokens", "active_streams"):  # was: 37 query rows for 0 streams, an internal error
        empty = int((passes[col] < 1).sum()) if col in passes else 0
        if empty:
            out.append(f"steps: {empty} passes with {col} < 1 (a forward pass computes query rows of a stream)")
    out += _request_row_problems(trace, passes)
    out += count_problems(req, measured=trace.kind == "measured")
    out += timing_problems(trace, passes)  # the chunk rows found once
    out += list(graphs_problems(trace))
    return out


def _indices_per_request(rows, column: str, rid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each request of `rid`: whether it has rows, their count, and whether its `column` values
    are exactly 0..count-1, n distinct indices (was: count, min and max only, so steps 0, 2, 2 passed)."""
    agg = rows.groupby("request_id")[column].agg(["count", "min", "max", "nunique"]).reindex(rid)
    has = agg["count"].notna().to_numpy()
    count = agg["count"].fillna(0).to_numpy(np.int64)
    zero_to_n = ((agg["min"] == 0) & (agg["max"] == agg["count"] - 1) & (agg["nunique"] == agg["count"])).to_numpy()
    return has, count, zero_to_n


def _request_row_problems(trace: Trace, passes) -> list[str]:
    """Each request's own rows against its counts, and its quality and TTFT: the checks are columns
    over every request at once (a loop of pandas lookups per request took 20 s on a simulated trace
    of 100,000 requests), the problems listed request by request, each request's in a fixed order."""
    req = trace.requests
    rid = req["request_id"].to_numpy()
    measured = trace.kind == "measured"
    status = req["status"].to_numpy(object)
    n_steps, n_out = req["steps"].to_numpy(), req["output_tokens"].to_numpy()
    has_s, count_s, zero_s = _indices_per_request(passes, "step_index", rid)
    has_t, count_t, zero_t = _indices_per_request(trace.tokens, "token_index", rid)
    q = req["quality_score"].to_numpy(float)
    ttft, e2e = req["ttft_s"].to_numpy(float), req["e2e_s"].to_numpy(float)
    with np.errstate(invalid="ignore"):  # each check: which requests fail it, and what it says of one
        checks = [
            (has_s & measured & ~zero_s, lambda i: "step_index not 0..n-1"),
            (has_s & measured & (count_s != n_steps), lambda i: f"{count_s[i]} step rows but steps={n_steps[i]}"),
            (~has_s & (status != "error"), lambda i: "no steps"),
            (has_t & ((count_t != n_out) | ~zero_t), lambda i: f"token rows do not match output_tokens={n_out[i]}"),
            (~has_t & (n_out > 0), lambda i: f"no token rows for {n_out[i]} output tokens"),
            (np.array([r not in trace.graphs for r in rid.tolist()], dtype=bool), lambda i: "no dependence graph"),
            (~(np.isnan(q) | ((q >= 0.0) & (q <= 1.0))), lambda i: f"quality_score {q[i]} outside 0..1"),
            ((status == "ok") & ~(ttft <= e2e + 1e-9), lambda i: "ttft_s > e2e_s"),
        ]
    failing = np.logical_or.reduce([bad for bad, _ in checks])
    return [f"request {rid[i]}: {say(i)}" for i in np.flatnonzero(failing) for bad, say in checks if bad[i]]


# per-request counts no writer leaves negative (was: `solm inspect` printed "peak KV ... -5 bytes"
# and `solm diff` a -24166x ratio of it, both exit 0, from a requests table with a negative count)
REQUEST_COUNTS = (
    "prompt_tokens",
    "output_tokens",
    "steps",
    "critical_path_tokens",
    "peak_live_kv_tokens",
    "peak_kv_bytes",
    "preemptions",
    "recompute_tokens",
)


def count_problems(req, measured: bool = False) -> list[str]:
    """Request counts must be >= 0; theoretical_speedup (output tokens / critical path) finite and
    >= 0, or NaN (was: a negative one made inspect's geomean "n/ax" and diff's ratio negative); in a
    measured trace, where the runtime computed it, exactly output_tokens / max(1,
    critical_path_tokens) (a simulated trace keeps its source request's, whose output it may stretch)."""
    out = []
    for col in REQUEST_COUNTS:
        bad = req[col].to_numpy() < 0
        if bad.any():
            out.append(f"requests: negative {col} for requests {req.loc[bad, 'request_id'].tolist()[:5]}")
    speedup = req["theoretical_speedup"].to_numpy(float)
    bad = np.isinf(speedup) | (speedup < 0)
    if bad.any():
        out.append(
            f"requests: theoretical_speedup infinite or negative for requests {req.loc[bad, 'request_id'].tolist()[:5]}"
        )
    elif measured:  # was: a speedup of 1e300 passed, inspect printed a geomean of 5.6e18x
        crit = np.maximum(req["critical_path_tokens"].to_numpy(float), 1.0)
        off = ~np.isnan(speedup) & ~np.isclose(speedup, req["output_tokens"].to_numpy(float) / crit, rtol=1e-9, atol=0)
        if off.any():
            out.append(
                "requests: theoretical_speedup is not output_tokens / critical_path_tokens for requests "
                f"{req.loc[off, 'request_id'].tolist()[:5]}"
            )
    return out


def graphs_problems(trace: Trace, each_once: bool = False) -> Iterator[str]:
    """ "graph <request>: <problem>" for each problem of each request's dependence graph, in request
    order; `each_once`: a graph object shared by several requests (a simulated trace's structures)
    is checked once, under the first of them."""
    seen: set[int] = set()
    for rid, g in trace.graphs.items():
        if each_once:
            if id(g) in seen:
                continue
            seen.add(id(g))
        for p in graph_problems(g):
            yield f"graph {rid}: {p}"


# the latest time a trace may hold, in seconds (30 million years): a sum or mean over any number of
# requests stays finite (16 e2e_s of 1e308 summed to inf: inspect printed an infinite mean, diff
# numpy's overflow warnings and a 0.000x speedup, both exit 0)
MAX_TIME_S = 1e15


def _bad_times(values: np.ndarray, allow_nan: bool) -> np.ndarray:
    """Entries that are infinite, negative, beyond MAX_TIME_S, or NaN where a time is required."""
    v = np.asarray(values, dtype=float)
    nan = np.isnan(v)
    return (np.isinf(v) | (v < 0) | (v > MAX_TIME_S)) | (nan & (not allow_nan))


def timing_problems(trace: Trace, passes: pd.DataFrame | None = None) -> list[str]:
    """Times must be finite and non-negative: arrivals, starts, TTFT, E2E (finished requests),
    pass starts and durations, counter timestamps. `passes`: the steps rows that are not prefill
    chunks, where the caller has them (`problems`); else found here."""
    out: list[str] = []
    req = trace.requests
    ok = (req["status"] == "ok").to_numpy()
    for col in ("arrival_s", "start_s", "ttft_s", "e2e_s"):
        bad = _bad_times(req[col], allow_nan=True) | (ok & np.isnan(req[col].to_numpy(float)))
        if bad.any():
            ids = req.loc[bad, "request_id"].tolist()[:5]
            out.append(f"requests: {col} infinite, negative or missing (or over {MAX_TIME_S:g} s) for requests {ids}")
    for col in ("start_s", "duration_s"):
        bad = _bad_times(trace.steps[col], allow_nan=False)
        if bad.any():
            out.append(f"steps: {int(bad.sum())} rows with {col} infinite, negative or NaN (or over {MAX_TIME_S:g} s)")
    if passes is None:  # the three columns the check reads, not the whole table, are copied
        passes = trace.steps.loc[~chunk_rows(trace.steps), ["request_id", "step_index", "start_s"]]
    back = _back_in_time(passes)
    if back:
        out.append(f"steps: start_s goes back in time between passes of requests {back[:5]}")
    if len(trace.counters) and _bad_times(trace.counters["t_s"], allow_nan=False).any():
        out.append("counters: t_s infinite, negative or NaN")
    values = trace.counters.drop(columns=["t_s", "source"], errors="ignore").select_dtypes("number")
    infinite = [c for c in values.columns if np.isinf(values[c].to_numpy(float)).any()]
    if infinite:  # was: diff's JSON line gave the counter's mean as the string "inf"
        out.append(f"counters: infinite values in {', '.join(infinite)}")
    return out


def _back_in_time(steps) -> list[int]:
    """Requests one of whose passes starts before the pass before it (by step_index): a request's
    passes run one after another. Rows in (request, step) order, as the writers leave them, are not sorted again
    (a simulated trace at scale has 21 million). `steps`: passes only; a prefill chunk's row has no
    place in that order (its step_index is -1, and a re-prefill's chunks after a preemption run after
    the passes before it: were "goes back in time", every preempting --chunked-prefill capture refused)."""
    rid, idx = steps["request_id"].to_numpy(), steps["step_index"].to_numpy()
    start = steps["start_s"].to_numpy(float)
    if not ((np.diff(rid) > 0) | ((np.diff(rid) == 0) & (np.diff(idx) > 0))).all():
        order = np.lexsort((idx, rid))
        rid, start = rid[order], start[order]
    back = (np.diff(rid) == 0) & (np.diff(start) < 0)
    return sorted({int(r) for r in rid[1:][back]})


def graph_problems(g: dict) -> list[str]:
    """A request's chunk DAG: node-link form, unique node ids, token counts that are counts, no
    link to a missing node, no cycle."""
    nodes, links = (g.get("nodes"), g.get("links")) if isinstance(g, dict) else (None, None)
    if not isinstance(nodes, list) or not isinstance(links, list):
        return ["not node-link (needs nodes and links lists)"]
    if not all(isinstance(n, dict) and "id" in n for n in nodes):
        return ["a node without an id"]
    bad = next((n for n in nodes if "tokens" in n and not _is_count(n["tokens"])), None)
    if bad is not None:
        return [f"node {bad['id']!r}: tokens must be an integer >= 0, got {bad['tokens']!r}"]
    ids = [n["id"] for n in nodes]
    try:
        known = set(ids)
    except TypeError:
        return ["node ids must be strings or numbers"]
    out = ["duplicate node ids"] if len(known) != len(ids) else []
    edges = []
    for link in links:
        if not isinstance(link, dict) or "source" not in link or "target" not in link:
            return [*out, "a link without source and target"]
        src, dst = link["source"], link["target"]
        try:
            missing = [x for x in (src, dst) if x not in known]
        except TypeError:
            missing = [src, dst]
        if missing:
            out.append(f"link {src!r} -> {dst!r} names a missing node")
        else:
            edges.append((src, dst))
    if g.get("directed") is not True:  # was: read undirected by networkx, `solm diff --html` exit 1
        out.append("not a directed graph (node-link 'directed' must be true)")
    if edges and has_cycle(known, edges):
        out.append("the dependence graph has a cycle")
    return out


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def has_cycle(nodes: set, edges: list[tuple]) -> bool:
    """Kahn's algorithm: a DAG empties; what remains lies on a cycle."""
    indeg = dict.fromkeys(nodes, 0)
    succ: dict = {n: [] for n in nodes}
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    ready = [n for n, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    return seen < len(nodes)


def validate(path: str | Path) -> list[str]:
    """Problems of the trace at `path` (a `TraceError` message is one problem)."""
    try:
        trace = read_trace(path)
    except TraceError as e:
        return [str(e)]
    return problems(trace)


def not_valid(path: str | Path, found: list[str], rest: str | None = None) -> str:
    """The line naming a trace's first problem: "<path>: not a valid trace: <first> (and N more
    <rest>)"; `rest` says where the others are (default: `solm inspect <path> --validate` lists them)."""
    rest = f": solm inspect {path} --validate" if rest is None else rest
    more = f" (and {len(found) - 1} more{rest})" if len(found) > 1 else ""
    return f"{path}: not a valid trace: {found[0]}{more}"


def read_valid_trace(path: str | Path) -> Trace:
    """`read_trace`, then the validator: a trace with problems is one TraceError naming the first
    (what `diff` and `export` read, so they never compute figures from a broken trace)."""
    trace = read_trace(path)
    found = problems(trace)
    if found:
        raise TraceError(not_valid(path, found))
    return trace
