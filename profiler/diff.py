"""Trace diff: what changed between two runs (measured or simulated, same or different system).

What: requests are matched by id (when the ids carry the same prompts) or else by prompt text;
per matched request and overall it compares latency, steps, parallelism (theoretical: output
tokens / critical path; attained: output tokens / forward passes), live and peak KV, quality,
as A, B, delta (B - A) and ratio (B / A); `speedup` is A's latency over B's. It also diffs the
output texts token by token (difflib over token texts), the chunk dependence graphs (chunks
added, removed, changed in length or in the chunks they depend on) and the counter summaries
both traces have (memory, power, energy, CPU).

Why here: the profiler owns the trace format, so the comparison of two traces lives beside the
reader; `solm diff` and the dashboard's Diff page only render it. Pure pandas, difflib and
networkx: no package of ours besides the profiler.

    from profiler.diff import diff_paths
    d = diff_paths("traces/seq", "traces/pasta"); d.summary()["overall"]["speedup"]
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from profiler.reader import Trace, TraceError, load_json_file
from profiler.schema import SCHEMA_VERSION
from profiler.stats import geomean
from profiler.validate import read_valid_trace

# per-request metrics: (name, lower is better). Order is the order of every table.
METRICS: tuple[tuple[str, bool], ...] = (
    ("e2e_s", True),
    ("ttft_s", True),
    ("steps", True),
    ("output_tokens", False),
    ("critical_path_tokens", True),
    ("theoretical_speedup", False),
    ("attained_parallelism", False),
    ("mean_live_kv_tokens", True),
    ("peak_live_kv_tokens", True),
    ("peak_kv_bytes", True),
    ("quality_score", False),
)
# counter column -> (summary name, reduction)
COUNTER_SUMMARIES: dict[str, tuple[str, str]] = {
    "gpu_memory_used_bytes": ("peak_gpu_memory_used_bytes", "max"),
    "gpu_utilization_percent": ("mean_gpu_utilization_percent", "mean"),
    "power_w": ("mean_power_w", "mean"),
    "energy_mj": ("energy_mj", "span"),
    "sm_clock_mhz": ("mean_sm_clock_mhz", "mean"),
    "temperature_c": ("peak_temperature_c", "max"),
    "cpu_percent": ("mean_cpu_percent", "mean"),
    "rss_bytes": ("peak_rss_bytes", "max"),
}
MAX_TEXT_OPS = 200  # token-diff opcodes kept per request (for display)


def _num(x) -> float | None:
    """JSON-safe float: NaN and infinities become None."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else x


def _nums(column: pd.Series) -> list[float | None]:
    """`_num` of every value of a column."""
    values = column.to_numpy(float)
    out = values.astype(object)
    out[~np.isfinite(values)] = None
    return out.tolist()


SIDES = ("a", "b", "delta", "ratio")  # each figure's four columns of `requests`, in the summary's order


def _same(a: pd.Series, b: pd.Series) -> bool:
    """Whether two columns hold the same value in every row, NaN (a figure not there) equal to NaN."""
    return bool(((a == b) | (a.isna() & b.isna())).all())


def _delta(a, b) -> tuple[float | None, float | None]:
    a, b = _num(a), _num(b)
    if a is None or b is None:
        return None, None
    return b - a, (b / a if a != 0 else (1.0 if b == 0 else None))


@dataclass
class TraceDiff:
    a: Trace
    b: Trace
    matched_by: str  # "request_id" or "prompt"
    requests: pd.DataFrame  # one row per matched request: a_id, b_id, <metric>_a/_b/_delta/_ratio, speedup
    overall: dict
    text: dict[int, dict] = field(default_factory=dict)  # by a's request id
    graphs: dict[int, dict] = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    unmatched_a: list[int] = field(default_factory=list)
    unmatched_b: list[int] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """Every matched request's every figure the same in A and B (or missing in both), the same
        outputs and the same dependence graphs (was: the figures' means only, so two requests that
        traded latencies made an identical diff)."""
        r = self.requests
        return (
            all(_same(r[f"{m}_a"], r[f"{m}_b"]) for m, _ in METRICS)
            and all(t["identical"] for t in self.text.values())
            and all(g["identical"] for g in self.graphs.values())
        )

    def summary(self) -> dict:
        """Everything JSON-safe except the per-token opcodes (see `text` for those)."""
        r = self.requests  # each column read once, not a float() per cell (12 s of 100,000 requests)
        col = {c: _nums(r[c]) for c in ("speedup", *(f"{m}_{x}" for m, _ in METRICS for x in SIDES))}
        per_request = []
        for i, (rid, bid) in enumerate(zip(r["a_id"].astype(int).tolist(), r["b_id"].astype(int).tolist())):
            item: dict[str, object] = {"a_id": rid, "b_id": bid, "speedup": col["speedup"][i]}
            for m, _ in METRICS:
                item[m] = {x: col[f"{m}_{x}"][i] for x in SIDES}
            item["text"] = {k: v for k, v in self.text[rid].items() if k != "ops"}
            item["graph"] = self.graphs[rid]
            per_request.append(item)
        return {
            "a": _describe(self.a),
            "b": _describe(self.b),
            "matched_by": self.matched_by,
            "matched": len(self.requests),
            "unmatched_a": self.unmatched_a,
            "unmatched_b": self.unmatched_b,
            "identical": self.identical,
            "overall": self.overall,
            "counters": self.counters,
            "requests": per_request,
        }


def _describe(t: Trace) -> dict:
    model = t.meta.get("model", {})
    return {
        "trace": str(t.path),
        "kind": t.kind,
        "system": t.system,
        "model": model.get("name") if isinstance(model, dict) else model,
        "requests": int(len(t.requests)),
    }


def request_metrics(trace: Trace) -> pd.DataFrame:
    """Per-request figures (indexed by request_id) from the requests and steps tables."""
    req = trace.requests.set_index("request_id")
    out = req[
        [
            "e2e_s",
            "ttft_s",
            "steps",
            "output_tokens",
            "critical_path_tokens",
            "theoretical_speedup",
            "peak_live_kv_tokens",
            "peak_kv_bytes",
            "quality_score",
            "prompt",
        ]
    ].copy()
    out["attained_parallelism"] = (req["output_tokens"] / req["steps"].where(req["steps"] > 0)).astype(float)
    live = _mean_by_request(trace.steps["request_id"].to_numpy(), trace.steps["live_kv_tokens"].to_numpy(float))
    out["mean_live_kv_tokens"] = live.reindex(out.index).astype(float)
    return out


def _mean_by_request(ids: np.ndarray, values: np.ndarray) -> pd.Series:
    """Mean of `values` per id, indexed by id. Rows sorted by id (a simulated trace's steps) are
    summed between the id changes (21 million rows: a tenth of a second, a third of a groupby)."""
    if len(ids) > 1 and not np.all(ids[1:] >= ids[:-1]):
        return pd.Series(values).groupby(ids).mean()
    starts = np.r_[0, np.flatnonzero(ids[1:] != ids[:-1]) + 1] if len(ids) else np.zeros(0, np.int64)
    counts = np.diff(np.r_[starts, len(ids)])
    return pd.Series(np.add.reduceat(values, starts) / counts if len(ids) else [], index=ids[starts], dtype=float)


def match_requests(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Pairs (a_id, b_id) in A's id order. By request id when every shared id carries the same
    prompt in both traces; otherwise by prompt text (the k-th copy of a prompt in A with the k-th
    in B)."""
    pa_, pb = a["prompt"], b["prompt"]
    shared = pa_.index.intersection(pb.index).sort_values()  # id order, as the prompt pairs below
    if len(shared) and (pa_.loc[shared] == pb.loc[shared]).all():
        return pd.DataFrame({"a_id": shared, "b_id": shared}), "request_id"

    def keyed(p: pd.Series) -> pd.DataFrame:
        df = p.rename("prompt").reset_index()
        df["k"] = df.groupby("prompt").cumcount()
        return df

    m = keyed(pa_).merge(keyed(pb), on=["prompt", "k"], suffixes=("_a", "_b"))
    m = m.rename(columns={"request_id_a": "a_id", "request_id_b": "b_id"}).sort_values("a_id")
    return m[["a_id", "b_id"]].reset_index(drop=True), "prompt"


TEXT_COLUMNS = ("request_id", "token_index", "token_text")


def _token_texts(trace: Trace) -> tuple[np.ndarray, pa.Array]:
    """(request ids, token texts) of every token, by request then token index: the per-token table
    read now if the trace was read without it (`Trace.token_table`), three of its columns only."""
    t = trace.token_table(TEXT_COLUMNS)
    ids = t.column("request_id").to_numpy()
    index = t.column("token_index").to_numpy()
    texts = t.column("token_text").combine_chunks()
    if len(ids) > 1 and not _sorted_by(ids, index):
        order = np.lexsort((index, ids))  # stable: the order of equal (request, index) rows kept
        ids, texts = ids[order], texts.take(pa.array(order))
    return ids, texts


def _sorted_by(ids: np.ndarray, index: np.ndarray) -> bool:
    """Whether rows are sorted by `ids`, then `index`."""
    later, same = ids[1:] > ids[:-1], ids[1:] == ids[:-1]
    return bool(np.all(later | (same & (index[1:] >= index[:-1]))))


def _gather(texts: pa.Array, lo: np.ndarray, n: np.ndarray) -> pa.Array:
    """texts[lo[i] : lo[i] + n[i]] of every i, concatenated (a slice when each follows the last)."""
    if len(n) == 0 or np.array_equal(lo[1:], lo[:-1] + n[:-1]):
        return texts.slice(int(lo[0]) if len(n) else 0, int(n.sum()))
    starts = np.cumsum(n) - n
    return texts.take(pa.array(np.repeat(lo - starts, n) + np.arange(int(n.sum()))))


def text_diffs(a: Trace, b: Trace, pairs: pd.DataFrame) -> dict[int, dict]:
    """`text_diff` of each matched pair's output tokens, by A's request id. Which outputs are equal
    token for token is found in Arrow for all pairs at once, and each gets what `text_diff` gives
    for equal outputs (one "equal" opcode): a 100k-request trace diffed with itself runs no
    difflib. Only the other pairs go through `text_diff`."""
    ids_a, texts_a = _token_texts(a)
    ids_b, texts_b = (ids_a, texts_a) if b is a else _token_texts(b)
    a_id, b_id = pairs["a_id"].to_numpy(np.int64), pairs["b_id"].to_numpy(np.int64)
    lo_a, lo_b = np.searchsorted(ids_a, a_id, "left"), np.searchsorted(ids_b, b_id, "left")
    n_a, n_b = np.searchsorted(ids_a, a_id, "right") - lo_a, np.searchsorted(ids_b, b_id, "right") - lo_b
    same = np.flatnonzero(n_a == n_b)  # pairs that may be identical: compare their tokens
    n = n_a[same]
    tokens_a = _gather(texts_a, lo_a[same], n)
    equal = pc.fill_null(pc.equal(tokens_a, _gather(texts_b, lo_b[same], n)), False)
    starts = np.cumsum(n) - n
    differs = np.zeros(len(n), bool)  # a token that differs: the pair it falls in (the last to start at or before it)
    differs[np.searchsorted(starts, np.flatnonzero(~equal.to_numpy(zero_copy_only=False)), "right") - 1] = True
    # the joined text of each output of `same`: the "equal" opcode of the identical ones
    offsets = pa.array(np.r_[0, np.cumsum(n)].astype(np.int64))
    joined = pc.binary_join(pa.LargeListArray.from_arrays(offsets, tokens_a), "").to_pylist()
    out: dict[int, dict] = {}
    for rid, k, text in zip(a_id[same][~differs].tolist(), n[~differs].tolist(), np.asarray(joined, object)[~differs]):
        out[rid] = {
            "identical": True,
            "similarity": 1.0,
            "a_tokens": k,
            "b_tokens": k,
            "equal_tokens": k,
            "inserted_tokens": 0,
            "deleted_tokens": 0,
            "replaced_tokens": 0,
            "ops": [("equal", text, text)] if k else [],
        }
    for i in np.setdiff1d(np.arange(len(pairs)), same[~differs]).tolist():
        tokens_of = lambda texts, lo, k: texts.slice(int(lo), int(k)).to_pylist()  # noqa: E731
        out[int(a_id[i])] = text_diff(tokens_of(texts_a, lo_a[i], n_a[i]), tokens_of(texts_b, lo_b[i], n_b[i]))
    return out


def text_diff(a_tokens: list[str], b_tokens: list[str]) -> dict:
    """Token-level diff of two outputs: counts per opcode, similarity, and the opcodes."""
    sm = difflib.SequenceMatcher(None, a_tokens, b_tokens, autojunk=False)
    counts = {"equal_tokens": 0, "inserted_tokens": 0, "deleted_tokens": 0, "replaced_tokens": 0}
    ops: list[tuple[str, str, str]] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            counts["equal_tokens"] += i2 - i1
        elif tag == "insert":
            counts["inserted_tokens"] += j2 - j1
        elif tag == "delete":
            counts["deleted_tokens"] += i2 - i1
        else:
            counts["replaced_tokens"] += max(i2 - i1, j2 - j1)
        if len(ops) < MAX_TEXT_OPS:
            ops.append((tag, "".join(a_tokens[i1:i2]), "".join(b_tokens[j1:j2])))
    identical = a_tokens == b_tokens
    return {
        "identical": identical,
        "similarity": 1.0 if identical else round(sm.ratio(), 6),
        "a_tokens": len(a_tokens),
        "b_tokens": len(b_tokens),
        **counts,
        "ops": ops,
    }


def graph_diff(ga: dict | None, gb: dict | None) -> dict:
    """Structural diff of two node-link chunk DAGs, chunks identified by node id."""
    na, ea = _nodes_edges(ga)
    nb, eb = _nodes_edges(gb)
    common = sorted(set(na) & set(nb), key=str)
    preds_a = _preds(ea)
    preds_b = _preds(eb)
    length = [
        {"chunk": n, "a_tokens": na[n].get("tokens"), "b_tokens": nb[n].get("tokens")}
        for n in common
        if na[n].get("tokens") != nb[n].get("tokens")
    ]
    deps = [
        {
            "chunk": n,
            "a_depends_on": sorted(preds_a.get(n, ()), key=str),
            "b_depends_on": sorted(preds_b.get(n, ()), key=str),
        }
        for n in common
        if preds_a.get(n, set()) != preds_b.get(n, set())
    ]
    added = sorted(set(nb) - set(na), key=str)
    removed = sorted(set(na) - set(nb), key=str)
    return {
        "identical": not (added or removed or length or deps) and ea == eb,
        "a_chunks": len(na),
        "b_chunks": len(nb),
        "a_edges": len(ea),
        "b_edges": len(eb),
        "added": added,
        "removed": removed,
        "changed_length": length,
        "changed_dependence": deps,
        "edges_added": len(eb - ea),
        "edges_removed": len(ea - eb),
    }


def _nodes_edges(g: dict | None) -> tuple[dict, set]:
    if not g:
        return {}, set()
    nodes = {n["id"]: n for n in g.get("nodes", [])}
    edges = {(e["source"], e["target"]) for e in g.get("links", g.get("edges", []))}
    return nodes, edges


def _preds(edges: set) -> dict:
    out: dict = {}
    for s, t in edges:
        out.setdefault(t, set()).add(s)
    return out


def counter_summary(counters: pd.DataFrame) -> dict[str, float]:
    out = {}
    for col, (name, how) in COUNTER_SUMMARIES.items():
        s = counters[col].dropna() if col in counters else pd.Series(dtype=float)
        if s.empty:
            continue
        v = s.max() if how == "max" else s.mean() if how == "mean" else s.iloc[-1] - s.iloc[0]
        out[name] = float(v)
    return out


def diff_traces(a: Trace, b: Trace) -> TraceDiff:
    va, vb = a.meta.get("schema_version"), b.meta.get("schema_version")
    if va != vb:
        raise TraceError(f"cannot diff traces of different schema versions: {a.path} is v{va!r}, {b.path} is v{vb!r}")
    ma = request_metrics(a)
    mb = ma if b is a else request_metrics(b)
    pairs, how = match_requests(ma, mb)
    if pairs.empty:
        raise TraceError(
            f"no requests in common: {a.path} and {b.path} share no request with the same prompt "
            f"(capture both with the same --task, --split, --seed and --n)"
        )
    ra = ma.loc[pairs["a_id"]].reset_index(drop=True)
    rb = mb.loc[pairs["b_id"]].reset_index(drop=True)
    rows, overall = _matched_rows(pairs, ra, rb)
    text = text_diffs(a, b, pairs)
    text = {int(ai): text[int(ai)] for ai in pairs["a_id"]}  # in pair order
    graphs = _graph_diffs(a, b, pairs)
    overall["text_identical_requests"] = sum(t["identical"] for t in text.values())
    overall["text_similarity_mean"] = float(np.mean([t["similarity"] for t in text.values()]))
    overall["graph_identical_requests"] = sum(g["identical"] for g in graphs.values())
    return TraceDiff(
        a=a,
        b=b,
        matched_by=how,
        requests=rows,
        overall=overall,
        text=text,
        graphs=graphs,
        counters=_counter_diffs(a.counters, b.counters),
        unmatched_a=sorted(set(ma.index.tolist()) - set(pairs["a_id"].tolist())),
        unmatched_b=sorted(set(mb.index.tolist()) - set(pairs["b_id"].tolist())),
    )


def _matched_rows(pairs: pd.DataFrame, ra: pd.DataFrame, rb: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Per matched pair, every metric in A and B with its delta and ratio, and the speedup; and the
    overall figures: each metric's mean in A and B, the speedups and the output tokens per second."""
    rows = pairs.copy()
    overall_metrics = {}
    for m, _ in METRICS:
        rows[f"{m}_a"] = ra[m].astype(float).to_numpy()
        rows[f"{m}_b"] = rb[m].astype(float).to_numpy()
        rows[f"{m}_delta"] = rows[f"{m}_b"] - rows[f"{m}_a"]
        a_col, b_col = rows[f"{m}_a"], rows[f"{m}_b"]
        rows[f"{m}_ratio"] = (b_col / a_col.where(a_col != 0)).mask((a_col == 0) & (b_col == 0), 1.0)
        a_mean, b_mean = ra[m].astype(float).mean(), rb[m].astype(float).mean()
        d, r = _delta(a_mean, b_mean)
        overall_metrics[m] = {"a": _num(a_mean), "b": _num(b_mean), "delta": d, "ratio": r}
    rows["speedup"] = rows["e2e_s_a"] / rows["e2e_s_b"].where(rows["e2e_s_b"] > 0)
    total_a, total_b = float(ra["e2e_s"].sum()), float(rb["e2e_s"].sum())
    tok_a, tok_b = float(ra["output_tokens"].sum()), float(rb["output_tokens"].sum())
    overall = {
        # speedup: A's total latency over B's on the matched requests (>1: B is faster)
        "speedup": _num(total_a / total_b) if total_b > 0 else None,
        "speedup_geomean": _num(geomean(rows["speedup"])),
        "e2e_s_total_a": total_a,
        "e2e_s_total_b": total_b,
        "tokens_per_s_a": _num(tok_a / total_a) if total_a > 0 else None,
        "tokens_per_s_b": _num(tok_b / total_b) if total_b > 0 else None,
        "metrics": overall_metrics,
    }
    return rows, overall


def _graph_diffs(a: Trace, b: Trace, pairs: pd.DataFrame) -> dict:
    """`graph_diff` of each matched pair's dependency graphs, keyed by A's request id."""
    graphs, seen = {}, {}
    for ai, bi in zip(pairs["a_id"].tolist(), pairs["b_id"].tolist()):
        ga, gb = a.graphs.get(ai), b.graphs.get(bi)
        key = (id(ga), id(gb))  # requests of a simulated trace share their structure's graph: diffed once
        if key not in seen:
            seen[key] = graph_diff(ga, gb)
        graphs[ai] = seen[key]
    return graphs


def _counter_diffs(counters_a: pd.DataFrame, counters_b: pd.DataFrame) -> dict:
    """The counter summaries both traces have (`counter_summary`), A's and B's with delta and ratio, by name."""
    ca, cb = counter_summary(counters_a), counter_summary(counters_b)
    counters = {}
    for name in ca.keys() & cb.keys():
        d, r = _delta(ca[name], cb[name])
        counters[name] = {"a": ca[name], "b": cb[name], "delta": d, "ratio": r}
    return dict(sorted(counters.items()))


def _raw_version(path: Path):
    try:  # the reader's own checks: a FIFO or /dev/zero as meta.json is refused, not read
        return load_json_file(path / "meta.json").get("schema_version")
    except TraceError:
        return None  # read_trace says what is wrong


def diff_paths(a: str | Path, b: str | Path) -> TraceDiff:
    """Read both traces and diff them. Different schema versions are named before reading."""
    pa_, pb = Path(a), Path(b)
    va, vb = _raw_version(pa_), _raw_version(pb)
    if va is not None and vb is not None and va != vb:
        raise TraceError(
            f"cannot diff traces of different schema versions: {pa_} is v{va!r}, {pb} is v{vb!r} "
            f"(this solm reads v{SCHEMA_VERSION}; re-capture the other one)"
        )
    return diff_traces(read_valid_trace(pa_), read_valid_trace(pb))
