"""Trace validator: beyond what the reader checks (files, schema version, columns, types), the
cross-table facts every trace must satisfy. Returns a list of problems; empty means valid.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from profiler.reader import Trace, TraceError, read_trace
from profiler.schema import PHASES, TOKEN_KINDS


def problems(trace: Trace) -> list[str]:
    out: list[str] = []
    req, steps, toks = trace.requests, trace.steps, trace.tokens
    ids = set(req["request_id"].tolist())
    if len(ids) != len(req):
        out.append("requests: duplicate request_id")
    for name, df in (("steps", steps), ("tokens", toks)):
        stray = set(df["request_id"].tolist()) - ids
        if stray:
            out.append(f"{name}: rows for unknown requests {sorted(stray)[:5]}")
    bad_phase = set(steps["phase"]) - set(PHASES)
    if bad_phase:
        out.append(f"steps: unknown phases {sorted(bad_phase)}")
    bad_kind = set(toks["kind"]) - set(TOKEN_KINDS)
    if bad_kind:
        out.append(f"tokens: unknown kinds {sorted(bad_kind)}")
    for col in ("duration_s", "query_tokens", "kv_tokens_read", "live_kv_tokens", "kv_bytes_allocated"):
        if (steps[col] < 0).any():
            out.append(f"steps: negative {col}")
    steps_per_req = steps.groupby("request_id")["step_index"].agg(["count", "min", "max"])
    toks_per_req = toks.groupby("request_id")["token_index"].agg(["count", "min", "max"])
    for r in req.itertuples():
        rid = r.request_id
        if rid in steps_per_req.index:
            s = steps_per_req.loc[rid]
            if trace.kind == "measured" and not (s["min"] == 0 and s["max"] == s["count"] - 1):
                out.append(f"request {rid}: step_index not 0..n-1")
            if trace.kind == "measured" and s["count"] != r.steps:
                out.append(f"request {rid}: {s['count']} step rows but steps={r.steps}")
        elif r.status != "error":
            out.append(f"request {rid}: no steps")
        if rid in toks_per_req.index:
            t = toks_per_req.loc[rid]
            if t["count"] != r.output_tokens or not (t["min"] == 0 and t["max"] == t["count"] - 1):
                out.append(f"request {rid}: token rows do not match output_tokens={r.output_tokens}")
        elif r.output_tokens > 0:
            out.append(f"request {rid}: no token rows for {r.output_tokens} output tokens")
        if rid not in trace.graphs:
            out.append(f"request {rid}: no dependence graph")
        q = r.quality_score
        if not (np.isnan(q) or 0.0 <= q <= 1.0):
            out.append(f"request {rid}: quality_score {q} outside 0..1")
        if r.status == "ok" and not (r.ttft_s <= r.e2e_s + 1e-9):
            out.append(f"request {rid}: ttft_s > e2e_s")
    for rid, g in trace.graphs.items():
        if not {"nodes", "links"} <= set(g):
            out.append(f"graph {rid}: not node-link (needs nodes and links)")
    return out


def validate(path: str | Path) -> list[str]:
    """Problems of the trace at `path` (a `TraceError` message is one problem)."""
    try:
        trace = read_trace(path)
    except TraceError as e:
        return [str(e)]
    return problems(trace)
