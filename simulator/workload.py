"""Workload: the forward passes each request of a trace needs, as the simulator replays them.

What: for every request of a trace, the sequence of *pass demands* its dependence structure
implied when it ran: per forward pass the query tokens (summed over the streams that had a query
row in it), the KV slots those rows read, the streams (query groups), the live KV tokens after
the pass and the KV it held in whole pages, the tokens it declared dead (TIP), its phase
(`prefill`, `decode`, `plan`, `denoise`, `sync`) and how many output tokens it produced. No
measured time is kept: the same structure is re-costed on another part and another model size,
where KV bytes = tokens x that model's `kv_bytes_per_token`.

Why this is the structure, not just the step log: the runtime batches the parallel streams of
one request into one pass (PASTA threads, planned-diffusion spans), so a request with k threads
already has fewer, wider passes than its sequential twin; TIP's evictions show as live KV that
goes down; a diffusion round is as many `denoise` passes as its slowest span needs. Everything
else (batching with other requests, queueing, preemption) is the simulator's to decide.

Where each column comes from: `steps.parquet` (query tokens, KV read, active streams, live and
allocated KV, evictions, phase), `tokens.parquet` (output tokens per pass: the tokens whose
`step_index` is that pass; `emitted_tokens` where a request has no token rows), `requests.parquet`
(prompt and output lengths, quality, arrival, status) and `graph.json` (kept for the simulated
trace). Layout: flat numpy arrays, CSR-style (`offsets[r]:offsets[r + 1]` are request r's
passes), so the replay indexes whole batches at once; a workload cycled to more requests than its
source (`cycle`, what `--num-requests` does) shares the source's arrays instead, each request's
passes at `pass_starts[r]`, `offsets` still counting them per request.

    from simulator.workload import load_workload
    w = load_workload("traces/sequential-tiny")
    w.passes(0)[:2]   # [PassDemand(query_tokens=28, kv_tokens_read=406, ...), ...]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from profiler.errors import TraceError, quoted
from profiler.reader import Trace
from profiler.schema import PHASES, chunk_rows, linear_graph

PHASE_CODE = {name: i for i, name in enumerate(PHASES)}
MAX_CONTEXT_TOKENS = 1 << 20  # the most tokens one pass or one request's prompt or answer may have (a 1M context)
RECOMPUTE_NOTE = "recompute after preemption"  # steps.note of a pass that re-prefilled KV lost to a preemption
PASS_FIELDS = (  # the per-pass arrays of a Workload (taken or sliced together)
    "query_tokens",
    "kv_tokens_read",
    "query_groups",
    "logit_tokens",
    "live_kv_tokens",
    "alloc_kv_tokens",
    "evicted_tokens",
    "phase",
    "emits",
)


class PassDemand(NamedTuple):
    """One forward pass of one request, in tokens (model-independent)."""

    query_tokens: int
    kv_tokens_read: int
    query_groups: int  # streams with a query row (active_streams)
    live_kv_tokens: int  # after the pass
    kv_tokens_delta: int  # live KV after minus before (negative: TIP freed more than it wrote)
    alloc_kv_tokens: int  # KV held after the pass in whole pages, in tokens
    evicted_tokens: int
    phase: str
    emits: int  # output tokens this pass produced


@dataclass(frozen=True)
class Workload:
    """Pass demands of every request of one trace (flat arrays, see the module docstring)."""

    request_ids: np.ndarray  # (R,) source request ids
    offsets: np.ndarray  # (R + 1,)
    query_tokens: np.ndarray  # (P,) int64, one entry per pass of every request
    kv_tokens_read: np.ndarray
    query_groups: np.ndarray
    logit_tokens: np.ndarray  # rows that need logits: every row of a denoise pass, else 1/stream
    live_kv_tokens: np.ndarray
    alloc_kv_tokens: np.ndarray
    evicted_tokens: np.ndarray
    phase: np.ndarray  # (P,) int8 codes into profiler.schema.PHASES
    emits: np.ndarray
    prompt_tokens: np.ndarray  # (R,)
    output_tokens: np.ndarray
    quality_score: np.ndarray  # (R,) float, NaN = not applicable
    arrival_s: np.ndarray  # (R,) the trace's own arrival times, from its first request
    status: tuple[str, ...]  # (R,) source status: ok, truncated, error
    streams: np.ndarray | None = None  # (P,) object: the source's comma-separated stream ids
    source: dict = field(default_factory=dict)  # path, system, task, model meta, device meta
    graphs: dict = field(default_factory=dict, repr=False)  # request id -> node-link DAG
    source_request_ids: np.ndarray | None = None  # (R,) set by `take`: which source request
    # (R,) where each request's passes start in the per-pass arrays, when they are shared (`cycle`:
    # a request repeated keeps one copy of its passes); None: offsets[:-1], each request's own
    starts: np.ndarray | None = None

    # ---- shape ------------------------------------------------------------------------
    @property
    def n_requests(self) -> int:
        return len(self.request_ids)

    @property
    def n_passes(self) -> np.ndarray:
        """(R,) forward passes per request."""
        return np.diff(self.offsets)

    @property
    def pass_starts(self) -> np.ndarray:
        """(R,) index of each request's first pass in the per-pass arrays (request r's passes are
        `pass_starts[r] + 0 .. n_passes[r] - 1`; `offsets` numbers them as if each had its own copy)."""
        return self.offsets[:-1] if self.starts is None else self.starts

    def per_request_max(self, values: np.ndarray) -> np.ndarray:
        """(R,) the largest of each request's per-pass `values`; 0 without passes."""
        out = np.zeros(self.n_requests, dtype=np.int64)
        has = self.n_passes > 0
        if has.any():
            lo = self.pass_starts[has]
            bounds = np.stack([lo, lo + self.n_passes[has]], 1).ravel()  # [start, end) of each, in any order
            out[has] = np.maximum.reduceat(np.append(values, 0), bounds)[::2]
        return out

    def passes(self, r: int) -> list[PassDemand]:
        """Request r's passes (by position, not id) as readable records."""
        lo = int(self.pass_starts[r])
        hi = lo + int(self.n_passes[r])
        before = np.concatenate([[self.prompt_tokens[r]], self.live_kv_tokens[lo : hi - 1]]) if hi > lo else np.zeros(0)
        return [
            PassDemand(
                int(self.query_tokens[i]),
                int(self.kv_tokens_read[i]),
                int(self.query_groups[i]),
                int(self.live_kv_tokens[i]),
                int(self.live_kv_tokens[i] - before[i - lo]),
                int(self.alloc_kv_tokens[i]),
                int(self.evicted_tokens[i]),
                PHASES[self.phase[i]],
                int(self.emits[i]),
            )
            for i in range(lo, hi)
        ]

    def peak_alloc_tokens(self) -> np.ndarray:
        """(R,) the most KV each request holds at once (whole pages, tokens); 0 without passes."""
        return self.per_request_max(self.alloc_kv_tokens)

    def total_passes(self) -> int:
        """Passes of all requests (a request repeated by `cycle` counts each time)."""
        return int(self.offsets[-1])

    def source_ids(self) -> np.ndarray:
        return self.request_ids if self.source_request_ids is None else self.source_request_ids

    def take(self, positions) -> Workload:
        """A workload of the requests at `positions` (repeats allowed), renumbered 0..N-1.

        `w.take(np.arange(1000) % w.n_requests)` cycles a small trace into 1,000 requests, as
        `vllm bench serve --num-prompts` samples a dataset; arrivals keep each request's own.
        """
        pos = self._positions(positions)
        lengths = self.n_passes[pos]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = np.repeat(self.pass_starts[pos] - offsets[:-1], lengths) + np.arange(offsets[-1])
        per_pass = {name: getattr(self, name)[flat] for name in PASS_FIELDS}
        return self._renumbered(pos, offsets, per_pass, None if self.streams is None else self.streams[flat], None)

    def cycle(self, positions) -> Workload:
        """`take`, the requests sharing this workload's per-pass arrays (`starts`), not copying
        them: 100,000 requests cycled from 19,366 hold their passes once (1.4 GB less)."""
        pos = self._positions(positions)
        offsets = np.concatenate([[0], np.cumsum(self.n_passes[pos])]).astype(np.int64)
        per_pass = {name: getattr(self, name) for name in PASS_FIELDS}
        return self._renumbered(pos, offsets, per_pass, self.streams, self.pass_starts[pos])

    def _positions(self, positions) -> np.ndarray:
        pos = np.asarray(positions, dtype=np.int64)
        if pos.ndim != 1 or (len(pos) and (pos.min() < 0 or pos.max() >= self.n_requests)):
            raise ValueError(f"take: positions must index 0..{self.n_requests - 1}")
        return pos

    def _renumbered(self, pos, offsets, per_pass: dict, streams, starts) -> Workload:
        per_req = {
            name: getattr(self, name)[pos] for name in ("prompt_tokens", "output_tokens", "quality_score", "arrival_s")
        }
        return Workload(
            request_ids=np.arange(len(pos), dtype=np.int64),
            offsets=offsets,
            **per_pass,
            **per_req,
            status=tuple(self.status[i] for i in pos),
            streams=streams,
            source=self.source,
            graphs=self.graphs,
            source_request_ids=self.source_ids()[pos],
            starts=starts,
        )

    @property
    def quality_mean(self) -> float:
        q = self.quality_score[~np.isnan(self.quality_score)]
        return float(q.mean()) if len(q) else float("nan")


def _causal(x: np.ndarray) -> np.ndarray:
    return x * (x + 1) // 2


def own_passes(
    steps: pd.DataFrame, tokens: pd.DataFrame, replay_in_rows: bool = True
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A serving trace's rows as each request's own passes: the demand, not what the load did to it.

    Chunks of a prefill (`note` "prefill chunk", or a true `chunk` column) fold into the pass they
    belong to (query tokens and KV reads summed); the re-prefill part of a recompute (column
    `recompute_tokens`, else the count in `note` "recompute after preemption (N tokens)", else the
    live KV of the request's row before it) is taken out: it is what a preemption cost, not new demand. Tokens' step
    indices follow. Rows sorted by (request_id, step_index); other traces pass through unchanged.
    `replay_in_rows` False: the rows' query tokens and KV reads are already the request's own (the
    runtime's serving capture records the re-prefill only in `recompute_tokens`), nothing is taken out.
    """
    note = steps["note"].fillna("").astype(str) if "note" in steps else pd.Series("", index=steps.index)
    chunk = chunk_rows(steps)
    rid = steps["request_id"].to_numpy(np.int64)
    live = steps["live_kv_tokens"].to_numpy(np.int64)
    first = np.r_[True, rid[1:] != rid[:-1]] if len(rid) else np.zeros(0, bool)
    if not replay_in_rows:
        rc = np.zeros(len(steps), np.int64)
    elif "recompute_tokens" in steps:
        rc = steps["recompute_tokens"].fillna(0).to_numpy(np.int64)
    else:  # "recompute after preemption (N tokens)"; without a count: the KV the request held before
        counted = note.str.extract(r"recompute after preemption \((\d+) tokens\)")[0].fillna(-1).astype(np.int64)
        bare = note.str.startswith(RECOMPUTE_NOTE).to_numpy() & ~first
        rc = np.where(counted >= 0, counted, np.where(bare, np.roll(live, 1), 0))
    if not chunk.any() and not rc.any():
        return steps, tokens
    steps = steps.copy()
    q = steps["query_tokens"].to_numpy(np.int64)
    steps["query_tokens"] = np.maximum(q - rc, 0)
    steps["kv_tokens_read"] = np.maximum(steps["kv_tokens_read"].to_numpy(np.int64) - _causal(np.minimum(rc, q)), 0)
    # pass id within the request: non-chunk rows before the row; a chunk shares the id of the row that ends it
    own = (~chunk).astype(np.int64)
    starts = np.flatnonzero(first)
    csum = np.cumsum(own) - own
    pass_id = csum - np.repeat(csum[starts], np.diff(np.r_[starts, len(rid)]))
    steps["step_index_old"] = steps["step_index"]
    steps["step_index"] = pass_id
    summed = steps.groupby(["request_id", "step_index"], sort=True)[
        ["query_tokens", "kv_tokens_read", "emitted_tokens"]
    ].transform("sum")
    steps[["query_tokens", "kv_tokens_read", "emitted_tokens"]] = summed
    keep = ~chunk | (
        np.r_[rid[1:] != rid[:-1], True] if len(rid) else np.zeros(0, bool)
    )  # a trailing chunk ends its pass
    out = steps[keep].drop_duplicates(["request_id", "step_index"], keep="last")
    if len(tokens):
        remap = dict(zip(zip(steps["request_id"], steps["step_index_old"]), steps["step_index"]))
        tokens = tokens.copy()
        tokens["step_index"] = [remap.get((r, s), s) for r, s in zip(tokens["request_id"], tokens["step_index"])]
    return out.drop(columns="step_index_old").reset_index(drop=True), tokens


def from_trace(trace: Trace) -> Workload:
    """The pass demands of every request of a read trace (measured or simulated, one at a time or
    under load: see `own_passes`)."""
    req = trace.requests.sort_values("request_id", kind="stable").reset_index(drop=True)
    steps = trace.steps.sort_values(["request_id", "step_index"], kind="stable").reset_index(drop=True)
    # a simulated trace's rows carry the re-prefill (simtrace); a runtime capture's rows do not
    # (was: taken out of them too, a decode after a recompute read back as 0 query tokens)
    steps, toks = own_passes(steps, trace.tokens, replay_in_rows=trace.kind == "simulated")
    if toks is not trace.tokens:
        trace = dataclasses.replace(trace, tokens=toks)
    ids = req["request_id"].to_numpy(np.int64)
    pos, offsets = _pass_offsets(trace, steps, ids)
    return Workload(
        request_ids=ids,
        offsets=offsets,
        **_pass_demands(trace, steps, pos, offsets),
        arrival_s=_relative_arrivals(req),
        prompt_tokens=req["prompt_tokens"].to_numpy(np.int64),
        output_tokens=req["output_tokens"].to_numpy(np.int64),
        quality_score=req["quality_score"].to_numpy(float),
        status=tuple(req["status"].astype(str)),
        source=_source(trace),
        graphs=trace.graphs,
    )


def _pass_offsets(trace: Trace, steps: pd.DataFrame, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each pass's request (an index into the sorted `ids`) and each request's first pass (N + 1
    offsets); a pass of a request requests.parquet lacks is a TraceError."""
    pos = np.searchsorted(ids, steps["request_id"].to_numpy(np.int64))
    if len(steps) and (np.any(pos >= len(ids)) or np.any(ids[np.minimum(pos, len(ids) - 1)] != steps["request_id"])):
        raise TraceError(f"{trace.path}: steps.parquet has rows for requests not in requests.parquet")
    counts = np.bincount(pos, minlength=len(ids)) if len(steps) else np.zeros(len(ids), np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return pos, offsets


def _pass_demands(trace: Trace, steps: pd.DataFrame, pos: np.ndarray, offsets: np.ndarray) -> dict:
    """The per-pass columns of the `Workload` (query tokens, KV read, live and allocated, phase,
    emitted tokens, ...), checked (`_check_passes`)."""

    def col(name: str) -> np.ndarray:
        return steps[name].to_numpy(np.int64) if len(steps) else np.zeros(0, np.int64)

    q, kv = col("query_tokens"), col("kv_tokens_read")
    groups = np.where(q > 0, np.clip(col("active_streams"), 1, np.maximum(q, 1)), 0)  # a sync pass may have no rows
    _check_passes(trace, steps, q, kv)
    phase = steps["phase"].map(PHASE_CODE).to_numpy(np.int8) if len(steps) else np.zeros(0, np.int8)
    live = col("live_kv_tokens")
    kv_per_token = _kv_bytes_per_token(trace)
    alloc = -(-col("kv_bytes_allocated") // kv_per_token) if kv_per_token > 0 else live.copy()
    alloc = np.maximum(alloc, live)  # pages hold at least the live tokens
    logit = np.where(phase == PHASE_CODE["denoise"], q, groups)
    emits = _emits(trace, steps, pos, offsets, col("emitted_tokens"))
    return {
        "query_tokens": q,
        "kv_tokens_read": kv,
        "query_groups": groups,
        "logit_tokens": logit,
        "live_kv_tokens": live,
        "alloc_kv_tokens": alloc,
        "evicted_tokens": col("evicted_tokens"),
        "phase": phase,
        "emits": emits,
        "streams": steps["streams"].to_numpy(object) if len(steps) else np.zeros(0, object),
    }


def _kv_bytes_per_token(trace: Trace) -> int:
    """meta.json's `model.kv_bytes_per_token` (0 when absent: allocation then counts live tokens);
    anything but a count is a TraceError (was: int() of a string, NaN or 1e30 in the replay,
    `solm simulate` and `solm validate` exit 1)."""
    value = (trace.meta.get("model") or {}).get("kv_bytes_per_token") or 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**62:
        raise TraceError(
            f"{trace.path}: meta.json model.kv_bytes_per_token must be an integer >= 0, got {quoted(value)}"
        )
    return value


def _check_passes(trace: Trace, steps: pd.DataFrame, q: np.ndarray, kv: np.ndarray) -> None:
    """A TraceError for negative token counts, a pass larger than a context, or an unknown phase."""
    if np.any(q < 0) or np.any(kv < 0):
        raise TraceError(f"{trace.path}: negative query_tokens or kv_tokens_read in steps.parquet")
    if len(q) and q.max() > MAX_CONTEXT_TOKENS:  # was: 1e12 query tokens chunked into 1e8 passes, for ever
        raise TraceError(
            f"{trace.path}: a pass of {q.max()} query tokens in steps.parquet, more than a {MAX_CONTEXT_TOKENS}-token "
            f"context holds"
        )
    unknown = set(steps["phase"]) - set(PHASES)
    if unknown:
        raise TraceError(f"{trace.path}: unknown phases {sorted(unknown)}; known: {', '.join(PHASES)}")


def _relative_arrivals(req: pd.DataFrame) -> np.ndarray:
    """Arrivals from the first one (all 0 where none is known; an unknown one 0)."""
    arrival = req["arrival_s"].to_numpy(float)
    arrival = arrival - np.nanmin(arrival) if len(arrival) and np.isfinite(arrival).any() else np.zeros(len(req))
    return np.nan_to_num(arrival)


def _source(trace: Trace) -> dict:
    """Where a workload came from: the trace's path, kind, system, task, knobs, model and device."""
    model, device = trace.meta.get("model") or {}, trace.meta.get("device") or {}
    return {
        "path": str(trace.path),
        "kind": trace.kind,
        "system": trace.system,
        "task": trace.meta.get("task"),
        "knobs": trace.meta.get("knobs", {}),
        "model": model,
        "device": device,
    }


def _emits(trace: Trace, steps, pos: np.ndarray, offsets: np.ndarray, emitted_col: np.ndarray) -> np.ndarray:
    """Output tokens per pass: counted from tokens.parquet where a request has token rows."""
    emits = emitted_col.copy()
    toks = trace.tokens
    if not len(toks) or not len(steps):
        return emits
    ids = trace.requests["request_id"].sort_values().to_numpy(np.int64)
    t_req = np.searchsorted(ids, toks["request_id"].to_numpy(np.int64))
    t_step = toks["step_index"].to_numpy(np.int64)
    n_pass = np.diff(offsets)
    ok = (t_req < len(ids)) & (t_step >= 0) & (t_step < n_pass[np.minimum(t_req, len(ids) - 1)])
    counted = np.bincount(offsets[t_req[ok]] + t_step[ok], minlength=len(emits))
    has_tokens = np.zeros(len(ids), bool)
    has_tokens[t_req[ok]] = True
    use = has_tokens[pos]
    emits[use] = counted[use]
    return emits


def load_workload(path: str | Path) -> Workload:
    """Read a trace directory and return its workload."""
    from profiler.validate import read_valid_trace

    return from_trace(read_valid_trace(path))


def uniform(n_requests: int, prompt_tokens: int, output_tokens: int, page_size: int = 16) -> Workload:
    """A synthetic sequential workload: every request one prefill, then one decode per token.

    For what-if questions without a trace ("1,000 requests x 500 tokens") and benchmarks. The
    prefill of p tokens reads p (p + 1) / 2 KV slots (causal); decode i reads p + i.
    """
    if n_requests < 1 or prompt_tokens < 1 or output_tokens < 1:
        raise ValueError("uniform workload needs n_requests, prompt_tokens and output_tokens >= 1")
    p, n = prompt_tokens, output_tokens
    step = np.arange(n, dtype=np.int64)
    live_one = p + step  # after pass i: the prompt plus the i tokens written by decodes so far
    q_one = np.where(step == 0, p, 1)
    kv_one = np.where(step == 0, p * (p + 1) // 2, live_one)
    alloc_one = -(-live_one // page_size) * page_size
    phase_one = np.where(step == 0, PHASE_CODE["prefill"], PHASE_CODE["decode"]).astype(np.int8)
    tile = lambda a: np.tile(a, n_requests)  # noqa: E731
    ones = np.ones(n * n_requests, np.int64)
    return Workload(
        request_ids=np.arange(n_requests, dtype=np.int64),
        offsets=np.arange(n_requests + 1, dtype=np.int64) * n,
        query_tokens=tile(q_one),
        kv_tokens_read=tile(kv_one),
        query_groups=ones,
        logit_tokens=ones,
        live_kv_tokens=tile(live_one),
        alloc_kv_tokens=tile(alloc_one),
        evicted_tokens=0 * ones,
        phase=tile(phase_one),
        emits=ones.copy(),
        prompt_tokens=np.full(n_requests, p, np.int64),
        output_tokens=np.full(n_requests, n, np.int64),
        quality_score=np.full(n_requests, np.nan),
        arrival_s=np.zeros(n_requests),
        status=("ok",) * n_requests,
        streams=None,
        source={
            "path": "",
            "kind": "synthetic",
            "system": "sequential",
            "task": f"uniform {p}+{n}",
            "knobs": {},
            "model": {},
            "device": {},
        },
        graphs={int(r): linear_graph(p, n) for r in range(n_requests)},
    )
