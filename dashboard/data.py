"""Dashboard data: pure pandas over traces (no `st.*` here; the pages cache and lay out).

Every function takes traces (`profiler.reader.Trace`) or paths and returns DataFrames or plain
dicts that `dashboard.figures` draws. Loading never fails as a whole: an unreadable or foreign
directory becomes an error row while the other traces load.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd

from profiler.diff import METRICS, TraceDiff
from profiler.errors import is_utf8, one_line
from profiler.outdir import project_kind
from profiler.reader import Trace, TraceError, read_trace
from profiler.stats import non_dominated
from profiler.summary import attention_strategy, summarize
from profiler.validate import graphs_problems, not_valid

TRACE_MARKERS = ("meta.json", "requests.parquet", "steps.parquet", "graph.json")
COUNTER_COLUMNS = (
    "gpu_memory_used_bytes",
    "gpu_utilization_percent",
    "power_w",
    "energy_mj",
    "sm_clock_mhz",
    "temperature_c",
    "cpu_percent",
    "rss_bytes",
)


# ---- finding and loading ---------------------------------------------------------------------
def find_trace_dirs(roots: Sequence[str | Path], depth: int = 2) -> list[Path]:
    """Trace directories under `roots`: a root that is a trace, or folders below it (to `depth`
    levels) that hold any trace file. Folders that only look like traces are kept so the
    Overview can say why they do not load. A GPU capture folder (`bench/gpu_capture.py`: a
    meta.json of kind gpu_capture over one trace per system) is not a trace but holds them: its
    traces are listed as if they stood in its place (was: the folder itself, as an unreadable
    trace, and none of its traces)."""
    found: list[Path] = []

    def walk(p: Path, level: int) -> None:
        if any((p / m).exists() for m in TRACE_MARKERS):
            # a capture folder holds no tables of its own: only then is its meta.json read
            if (p / "requests.parquet").exists() or project_kind(p) != "gpu_capture":
                found.append(p)
                return
            level -= 1  # its traces count at its own level
        if level >= depth:
            return
        try:
            children = sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith("."))
        except OSError:
            return
        for c in children:
            walk(c, level + 1)

    for r in roots:
        walk(Path(r), 0)
    return list(dict.fromkeys(p.resolve() for p in found))


def path_problem(path: str) -> str | None:
    """Why a folder typed in the sidebar cannot be used as a path (a NUL byte, a name too long for
    the OS), else None; a folder that does not exist or cannot be opened just holds no traces."""
    try:
        os.stat(path)
    except ValueError:
        return "not a path (it holds a NUL byte)"
    except OSError as e:
        return None if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ELOOP) else e.strerror
    return None


def within(path: str | Path, allowed: Sequence[str | Path]) -> bool:
    """True if `path` (symlinks resolved) is one of the `allowed` folders or below one. A `~` is a
    name, as everywhere in solm (the shell expands it): expanded here alone, `~/x` was judged as
    $HOME/x while the pages read ./~/x."""
    p = Path(path).resolve()
    return any(p.is_relative_to(Path(a).resolve()) for a in allowed)


def split_allowed(roots: list[str], allowed: list[str] | None) -> tuple[list[str], list[str]]:
    """(kept, refused): the sidebar's folders inside `allowed` (None: any folder) and the others."""
    if allowed is None:
        return list(roots), []
    kept = [r for r in roots if within(r, allowed)]
    return kept, [r for r in roots if r not in kept]


def path_key(path: str | Path) -> str | bytes:
    """`path` as part of a cache key: its text, or its bytes when the name is not UTF-8 (Streamlit's
    cache hashes text as UTF-8 and raised on it, taking every page down); `os.fsdecode` undoes it."""
    text = str(path)
    return text if is_utf8(text) else os.fsencode(text)


def signature(paths: list[Path]) -> tuple:
    """A cache key that changes when a trace is rewritten (paths and meta.json mtimes)."""
    out = []
    for p in paths:
        try:
            out.append((path_key(p), (p / "meta.json").stat().st_mtime_ns))
        except OSError:
            out.append((path_key(p), 0))
    return tuple(out)


NOT_UTF8 = "the name is not UTF-8 text; rename it"


# The steps columns every page's figures aggregate (summary: mean live KV; diff: per request);
# the Timeline reads one request's rows (`Trace.request_steps`), the Diff page the token texts
# (`Trace.token_table`), when they are shown.
STEPS_LOADED = ("request_id", "live_kv_tokens")
TIMELINE_STEPS = (
    "request_id",
    "step_index",
    "phase",
    "start_s",
    "duration_s",
    "streams",
    "query_tokens",
    "live_kv_tokens",
    "kv_bytes_allocated",
    "evicted_tokens",
)


def load_traces(paths: list[str | bytes | Path]) -> tuple[list[Trace], pd.DataFrame]:
    """(traces that read, error rows `path`, `error`). Each trace holds its requests table and
    only the `STEPS_LOADED` columns of its steps; per-token rows and the other steps columns are
    read by the page that shows them."""
    traces, errors = [], []
    for p in map(os.fsdecode, paths):
        if not is_utf8(p):  # was: pyarrow's UnicodeEncodeError building the error frame
            errors.append({"path": one_line(p), "error": NOT_UTF8})
            continue
        try:
            trace = read_trace(p, tokens=False, steps_columns=STEPS_LOADED)
            problem = graph_problem(trace)
            if problem:
                raise TraceError(problem)
            traces.append(trace)
        except TraceError as e:
            errors.append({"path": str(p), "error": str(e)})
        except Exception as e:  # a foreign file the reader did not anticipate: still one row
            errors.append({"path": str(p), "error": f"{type(e).__name__}: {e}"})
    return traces, pd.DataFrame(errors, columns=["path", "error"])


def graph_problem(trace: Trace) -> str | None:
    """The first dependence graph `profiler.validate` refuses (what `solm diff` says of it), else
    None: the pages draw and diff the graphs, so one that is not node-link is the trace's error row.
    Graphs shared by many requests (a simulated trace's structures) are checked once."""
    found = next(graphs_problems(trace, each_once=True), None)
    return not_valid(trace.path, [found]) if found else None


# ---- labels ----------------------------------------------------------------------------------
def knobs_label(meta: dict) -> str:
    knobs = meta.get("knobs") or {}
    skip = {"temperature", "top_p", "page_size", "max_tokens"}
    parts = [f"{k}={v}" for k, v in sorted(knobs.items()) if k not in skip and not isinstance(v, (dict, list))]
    return ",".join(parts)


def hardware_label(trace: Trace) -> str:
    sim = trace.meta.get("simulation") or {}
    hw = sim.get("hardware") if isinstance(sim, dict) else None
    if hw:
        return str(hw.get("name", hw)) if isinstance(hw, dict) else str(hw)
    dev = trace.meta.get("device", {})
    return str(dev.get("name", "?")) if isinstance(dev, dict) else str(dev)


def trace_label(trace: Trace, parents: int = 0) -> str:
    k = knobs_label(trace.meta)
    name = "/".join(trace.path.parts[-1 - parents :])
    return f"{trace.system}{' ' + k if k else ''} · {trace.kind} · {name}"


def trace_labels(traces: list[Trace]) -> list[str]:
    """Labels that tell every trace apart (more of the path where two folders share a name)."""
    for parents in range(4):
        labels = [trace_label(t, parents) for t in traces]
        if len(set(labels)) == len(labels):
            return labels
    return [f"{lab} ({i})" for i, lab in enumerate(labels)]


# ---- overview and Pareto ---------------------------------------------------------------------
def overview_table(traces: list[Trace], errors: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for t in traces:
        s = summarize(t)
        rows.append(
            {
                "status": "ok" if t.complete else "incomplete",
                "trace": t.name,
                "kind": t.kind,
                "system": t.system,
                "knobs": knobs_label(t.meta),
                "model": s["model"],
                "device": hardware_label(t),
                "attention": attention_strategy(t.meta) if t.kind == "measured" else "",
                "date": str(t.meta.get("created_at", ""))[:19].replace("T", " "),
                "requests": s["requests"],
                "quality": s["quality_mean"],
                "e2e_ms_p50": None if s["e2e_s_p50"] is None else s["e2e_s_p50"] * 1e3,
                "tokens_per_s": s["tokens_per_s"],
                "peak_kv_bytes": s["peak_kv_bytes"],
                "path": str(t.path),
                "error": "",
            }
        )
    for e in errors.itertuples():
        rows.append({"status": "error", "trace": Path(e.path).name, "path": e.path, "error": e.error})
    cols = [
        "status",
        "trace",
        "kind",
        "system",
        "knobs",
        "model",
        "device",
        "attention",
        "date",
        "requests",
        "quality",
        "e2e_ms_p50",
        "tokens_per_s",
        "peak_kv_bytes",
        "path",
        "error",
    ]
    return pd.DataFrame(rows, columns=cols)


def pareto_points(traces: list[Trace]) -> pd.DataFrame:
    """One point per trace: quality, latency and memory figures, labelled by system and knobs."""
    rows = []
    for t, label in zip(traces, trace_labels(traces)):
        s = summarize(t)
        rows.append(
            {
                "label": label,
                "trace": t.name,
                "path": str(t.path),
                "kind": t.kind,
                "system": t.system,
                "knobs": knobs_label(t.meta),
                "hardware": hardware_label(t),
                "quality": s["quality_mean"],
                "e2e_ms_mean": None if s["e2e_s_mean"] is None else s["e2e_s_mean"] * 1e3,
                "e2e_ms_p50": None if s["e2e_s_p50"] is None else s["e2e_s_p50"] * 1e3,
                "ttft_ms_p50": None if s["ttft_s_p50"] is None else s["ttft_s_p50"] * 1e3,
                "tokens_per_s": s["tokens_per_s"],
                "peak_kv_bytes": s["peak_kv_bytes"],
                "mean_live_kv_tokens": s["mean_live_kv_tokens"],
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "label",
            "trace",
            "path",
            "kind",
            "system",
            "knobs",
            "hardware",
            "quality",
            "e2e_ms_mean",
            "e2e_ms_p50",
            "ttft_ms_p50",
            "tokens_per_s",
            "peak_kv_bytes",
            "mean_live_kv_tokens",
        ],
    )


def pareto_front(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Rows not dominated for lower `x` and higher `y`, sorted by `x` (NaN rows are skipped; of
    identical points the first is kept)."""
    d = df.dropna(subset=[x, y]).sort_values([x, y], ascending=[True, False], kind="stable")
    front = d[non_dominated(np.stack([-d[x].to_numpy(float), d[y].to_numpy(float)], axis=1).reshape(-1, 2))]
    return front.drop_duplicates(subset=[x, y])


def find_sweep_tables(roots: Sequence[str | Path], depth: int = 2) -> list[Path]:
    """`sweep.parquet` tables (from `solm sweep --out DIR`) under `roots`, to `depth` levels."""
    found: list[Path] = []
    for r in map(Path, roots):
        for level in range(depth + 1):
            found += sorted(r.glob("/".join(["*"] * level + ["sweep.parquet"])))
    return list(dict.fromkeys(p.resolve() for p in found))


SWEEP_FIGURES = ("quality_mean", "mean_e2el_ms", "peak_kv_bytes")


def sweep_points(files: list[str | bytes | Path], errors: list[str] | None = None) -> pd.DataFrame:
    """One Pareto point per finished sweep configuration (kind "sweep"), columns as `pareto_points`.
    A table that does not read, lacks the columns or holds figures that are not numbers is left
    out, one line per table appended to `errors` (the sweep's own results.jsonl remains)."""
    frames = []
    for f in map(Path, map(os.fsdecode, files)):
        if not is_utf8(str(f)):
            if errors is not None:
                errors.append(f"{one_line(str(f))}: {NOT_UTF8}")
            continue
        t, problem = _read_sweep_table(f)
        if problem or t is None:
            if errors is not None:
                errors.append(f"{f}: not a solm sweep table: {problem}; its configurations are not drawn")
            continue
        finished = t.loc[t["status"] == "ok"]
        if not len(finished):  # was: a TypeError building the labels of no rows
            if errors is not None:
                errors.append(f"{f}: no configuration of this sweep finished (see its results.jsonl); nothing to draw")
            continue
        frames.append(_sweep_table_points(finished, f))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _read_sweep_table(f: Path) -> tuple[pd.DataFrame | None, str]:
    """(the table, "") or (None or the table, why it is not a sweep table: unreadable, columns
    missing, figures not numbers)."""
    try:
        t = pd.read_parquet(f)
    except Exception as e:  # a half-written or foreign table
        return None, f"unreadable Parquet ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    missing = sorted({"hardware", "status", *SWEEP_FIGURES} - set(t.columns))
    not_numbers = [c for c in SWEEP_FIGURES if c in t and not pd.api.types.is_numeric_dtype(t[c])]
    problem = f"missing columns {', '.join(missing)}" if missing else ""
    return t, problem or (f"{', '.join(not_numbers)} not numbers" if not_numbers else "")


def _sweep_table_points(t: pd.DataFrame, f: Path) -> pd.DataFrame:
    """The Pareto points (columns as `pareto_points`) of sweep table `f`'s finished rows `t`;
    optional columns a table lacks read as `?`, empty or NaN."""

    def col(name: str, default=np.nan) -> pd.Series:
        return t[name] if name in t else pd.Series(default, index=t.index)

    label = (
        col("system", "?").map(str)
        + " on "
        + t["hardware"].map(str)
        + " ("
        + col("model", "").map(str)
        + ") seqs="
        + col("max_seqs", "").map(str)
        + " rate="
        + col("rate", "").map(str)
    )
    return pd.DataFrame(
        {
            "label": label,
            "trace": f.parent.name,
            "path": str(f),
            "kind": "sweep",
            "system": col("system", "?"),
            "knobs": "",
            "hardware": t["hardware"],
            "quality": t["quality_mean"],
            "e2e_ms_mean": t["mean_e2el_ms"],
            "e2e_ms_p50": col("median_e2el_ms"),
            "ttft_ms_p50": col("median_ttft_ms"),
            "tokens_per_s": col("output_throughput"),
            "peak_kv_bytes": t["peak_kv_bytes"],
            "mean_live_kv_tokens": np.nan,
        }
    )


# ---- one request: timeline, KV, counters, graph -----------------------------------------------
def request_ids(trace: Trace) -> list[int]:
    return [int(r) for r in trace.requests["request_id"].tolist()]


def request_steps(trace: Trace, rid: int) -> pd.DataFrame:
    """The `TIMELINE_STEPS` columns of one request's passes, by start (what `gantt_frame`,
    `kv_frame` and `counters_frame` draw): read from steps.parquet when the trace holds fewer columns."""
    s = trace.request_steps(rid, TIMELINE_STEPS)
    return s.sort_values(["start_s", "step_index"], kind="stable").reset_index(drop=True)


def gantt_frame(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (forward pass, stream with a query row) of a request's `steps`: stream, start/end
    in ms, phase."""
    rows = []
    for r in steps.itertuples(index=False):
        for stream in str(r.streams).split(","):
            if stream.strip() == "":
                continue
            rows.append(
                {
                    "stream": f"stream {int(stream)}",
                    "stream_id": int(stream),
                    "phase": r.phase,
                    "start_ms": r.start_s * 1e3,
                    "duration_ms": r.duration_s * 1e3,
                    "end_ms": (r.start_s + r.duration_s) * 1e3,
                    "step_index": int(r.step_index),
                    "query_tokens": int(r.query_tokens),
                }
            )
    return pd.DataFrame(
        rows,
        columns=["stream", "stream_id", "phase", "start_ms", "duration_ms", "end_ms", "step_index", "query_tokens"],
    )


def kv_frame(steps: pd.DataFrame) -> pd.DataFrame:
    """Live KV tokens and bytes held after each pass of a request's `steps`, against time (ms)."""
    s = steps.sort_values("start_s")
    return pd.DataFrame(
        {
            "t_ms": (s["start_s"] + s["duration_s"]).to_numpy() * 1e3,
            "live_kv_tokens": s["live_kv_tokens"].to_numpy(),
            "kv_bytes_allocated": s["kv_bytes_allocated"].to_numpy(),
            "evicted_tokens": s["evicted_tokens"].to_numpy(),
        }
    )


def counters_frame(trace: Trace, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Counter samples in long form (t_ms, counter, value), within the window of a request's
    `steps` if given."""
    c = trace.counters
    if steps is not None and len(c) and len(steps):
        lo, hi = steps["start_s"].min(), (steps["start_s"] + steps["duration_s"]).max()
        pad = max(0.05, 0.1 * (hi - lo))
        c = c.loc[(c["t_s"] >= lo - pad) & (c["t_s"] <= hi + pad)]
    cols = [k for k in COUNTER_COLUMNS if k in c and c[k].notna().any()]
    if not cols:
        return pd.DataFrame(columns=["t_ms", "counter", "value"])
    long = c.assign(t_ms=c["t_s"] * 1e3).melt(id_vars=["t_ms"], value_vars=cols, var_name="counter")
    return long.dropna(subset=["value"]).reset_index(drop=True)


def graph_layout(graph: dict | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Nodes (id, kind, stream, tokens, x, y) layered by dependence depth; edges as segments."""
    node_cols = ["id", "kind", "stream", "tokens", "x", "y"]
    edge_cols = ["source", "target", "x0", "y0", "x1", "y1"]
    if not graph or not graph.get("nodes"):
        return pd.DataFrame(columns=node_cols), pd.DataFrame(columns=edge_cols)
    # a graph that does not say is a simple directed one, as solm writes them (networkx's default
    # is a multigraph, whose edges come in threes: was a ValueError drawing a foreign trace's graph)
    simple = {"directed": True, "multigraph": False}
    g = nx.node_link_graph(graph, edges="links", **simple) if "links" in graph else nx.node_link_graph(graph, **simple)
    try:
        layers = list(nx.topological_generations(g))
    except nx.NetworkXUnfeasible:  # a cycle: fall back to one node per layer
        layers = [[n] for n in g.nodes]
    pos = {}
    for x, layer in enumerate(layers):
        layer = sorted(layer, key=lambda n: (g.nodes[n].get("stream", 0), str(n)))
        for i, n in enumerate(layer):
            pos[n] = (x, i - (len(layer) - 1) / 2)
    nodes = pd.DataFrame(
        [
            {
                "id": str(n),
                "kind": d.get("kind", "?"),
                "stream": d.get("stream"),
                "tokens": d.get("tokens", 0),
                "x": pos[n][0],
                "y": pos[n][1],
            }
            for n, d in g.nodes(data=True)
        ],
        columns=node_cols,
    )
    edges = pd.DataFrame(
        [
            {"source": str(s), "target": str(t), "x0": pos[s][0], "y0": pos[s][1], "x1": pos[t][0], "y1": pos[t][1]}
            for s, t in g.edges()
        ],
        columns=edge_cols,
    )
    return nodes, edges


# ---- diff ------------------------------------------------------------------------------------
def diff_overall_table(d: TraceDiff) -> pd.DataFrame:
    rows = [{"metric": m, **d.overall["metrics"][m]} for m, _ in METRICS]
    return pd.DataFrame(rows, columns=["metric", "a", "b", "delta", "ratio"])


def diff_requests_table(d: TraceDiff) -> pd.DataFrame:
    r = d.requests
    out = pd.DataFrame(
        {
            "a_id": r["a_id"],
            "b_id": r["b_id"],
            "e2e_ms_a": r["e2e_s_a"] * 1e3,
            "e2e_ms_b": r["e2e_s_b"] * 1e3,
            "speedup": r["speedup"],
            "steps_a": r["steps_a"],
            "steps_b": r["steps_b"],
            "peak_kv_bytes_a": r["peak_kv_bytes_a"],
            "peak_kv_bytes_b": r["peak_kv_bytes_b"],
            "quality_a": r["quality_score_a"],
            "quality_b": r["quality_score_b"],
        }
    )
    out["text_similarity"] = [d.text[int(i)]["similarity"] for i in r["a_id"]]
    out["graph_identical"] = [d.graphs[int(i)]["identical"] for i in r["a_id"]]
    return out


def diff_text_ops(d: TraceDiff, a_id: int) -> pd.DataFrame:
    return pd.DataFrame(d.text[a_id]["ops"], columns=["op", "a", "b"])


def diff_graph_rows(d: TraceDiff, a_id: int) -> pd.DataFrame:
    g = d.graphs[a_id]
    rows = [{"change": "added", "chunk": n, "detail": ""} for n in g["added"]]
    rows += [{"change": "removed", "chunk": n, "detail": ""} for n in g["removed"]]
    rows += [
        {"change": "length", "chunk": c["chunk"], "detail": f"{c['a_tokens']} -> {c['b_tokens']} tokens"}
        for c in g["changed_length"]
    ]
    rows += [
        {"change": "dependence", "chunk": c["chunk"], "detail": f"{c['a_depends_on']} -> {c['b_depends_on']}"}
        for c in g["changed_dependence"]
    ]
    return pd.DataFrame(rows, columns=["change", "chunk", "detail"])
