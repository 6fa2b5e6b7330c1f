"""Dashboard data: pure pandas over traces (no `st.*` here; the pages cache and lay out).

Every function takes traces (`profiler.reader.Trace`) or paths and returns DataFrames or plain
dicts that `dashboard.figures` draws. Loading never fails as a whole: an unreadable or foreign
directory becomes an error row while the other traces load.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd

from profiler.diff import METRICS, TraceDiff
from profiler.errors import is_utf8, one_line
from profiler.reader import Trace, TraceError, read_trace
from profiler.stats import non_dominated
from profiler.summary import summarize
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
def find_trace_dirs(roots: list[str | Path], depth: int = 2) -> list[Path]:
    """Trace directories under `roots`: a root that is a trace, or folders below it (to `depth`
    levels) that hold any trace file. Folders that only look like traces are kept so the
    Overview can say why they do not load."""
    found: list[Path] = []

    def walk(p: Path, level: int) -> None:
        if any((p / m).exists() for m in TRACE_MARKERS):
            found.append(p)
            return
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


def within(path: str | Path, allowed: list[str | Path]) -> bool:
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


def find_sweep_tables(roots: list[str | Path], depth: int = 2) -> list[Path]:
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
        if problem:
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
    g = nx.node_link_graph(graph, edges="links") if "links" in graph else nx.node_link_graph(graph)
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
            for s, t in g.edges
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


# ---- what-if ---------------------------------------------------------------------------------
def whatif_part(hardware: str, gemm_calibration: str | None = None):
    """The catalog part, with a GEMM calibration (`solm calibrate`'s CAL.json) attached when one is
    given (ValueError, one line, for a bad file or another kernel family's)."""
    from simulator.hardware import get_hardware

    part = get_hardware(hardware)
    if gemm_calibration:
        from simulator.gemm_calibration import with_gemm_calibration

        part = with_gemm_calibration(part, gemm_calibration)
    return part


def whatif_recost(
    trace: Trace, hardware: str, model: str | None = None, gemm_calibration: str | None = None
) -> pd.DataFrame:
    """Every forward pass of `trace` re-costed on `hardware` (and `model`, default the trace's),
    keeping its structure: requests one after another as captured, no batching across requests.
    The What-if page uses it where the SimPy replay is not available. Per request: e2e, ttft."""
    from simulator.cost import CostModel
    from simulator.models import ModelSpec, get_model

    spec = get_model(model) if model else ModelSpec.from_trace_meta(trace.meta)
    cm = CostModel(whatif_part(hardware, gemm_calibration), spec)
    s = trace.steps.sort_values(["request_id", "step_index"])
    q = s["query_tokens"].clip(lower=1).to_numpy(dtype=float)
    groups = np.minimum(s["active_streams"].clip(lower=1).to_numpy(dtype=float), q)
    kv = np.maximum(s["kv_tokens_read"].to_numpy(dtype=float), q)
    dur = np.asarray(cm.step_time_s(q, kv, groups), dtype=float) if len(s) else np.zeros(0)
    per = pd.DataFrame(
        {"request_id": s["request_id"].to_numpy(), "duration_s": dur, "emitted": s["emitted_tokens"].to_numpy()}
    )
    agg = per.groupby("request_id").agg(e2e_s=("duration_s", "sum"))
    first = per.groupby("request_id")["duration_s"].first().rename("ttft_s")
    req = trace.requests.set_index("request_id")
    out = agg.join(first).reindex(req.index)
    out["quality_score"] = req["quality_score"]
    out["output_tokens"] = req["output_tokens"]
    out["peak_kv_bytes"] = req["peak_live_kv_tokens"] * spec.kv_bytes_per_token
    return out.reset_index()


def replay_available() -> bool:
    """Whether this build has the simulator's SimPy replay (`simulator.replay` and its result)."""
    try:
        import simulator.replay  # noqa: F401
        import simulator.simtrace  # noqa: F401
        from simulator.workload import from_trace  # noqa: F401
    except ImportError:
        return False
    return True


def whatif_point(trace: Trace, reqs: pd.DataFrame, hardware: str, model: str | None, label: str) -> dict:
    """One Pareto point of a what-if result (same columns as `pareto_points`)."""
    q = reqs["quality_score"].dropna()
    if q.empty:  # a structure replay has no quality of its own: the source trace's
        q = trace.requests["quality_score"].dropna()
    e2e = reqs["e2e_s"].dropna()
    tokens = reqs["output_tokens"].sum()
    return {
        "label": label,
        "trace": trace.name,
        "path": str(trace.path),
        "kind": "simulated",
        "system": trace.system,
        "knobs": knobs_label(trace.meta),
        "hardware": hardware,
        "quality": float(q.mean()) if len(q) else None,
        "e2e_ms_mean": float(e2e.mean() * 1e3) if len(e2e) else None,
        "e2e_ms_p50": float(e2e.median() * 1e3) if len(e2e) else None,
        "ttft_ms_p50": float(reqs["ttft_s"].median() * 1e3) if len(reqs) else None,
        "tokens_per_s": float(tokens / e2e.sum()) if e2e.sum() > 0 else None,
        "peak_kv_bytes": float(reqs["peak_kv_bytes"].max()) if len(reqs) else None,
        "mean_live_kv_tokens": None,
    }


def whatif_run(
    trace: Trace,
    hardware: str,
    model: str | None,
    max_seqs: int,
    max_batch_tokens: int,
    rate: float | None,
    deployment: dict | None = None,
    gemm_calibration: str | None = None,
) -> dict:
    """Simulate `trace` under the settings: the SimPy replay where it is available (batching across
    requests, arrivals at `rate` requests/s or the trace's own times, the KV pool), else every pass
    re-costed in place. Returns requests (request_id, e2e_s, ttft_s, ...), metrics and which engine.

    `deployment` (the what-if page's cluster controls; `whatif_deployment` reads them): TP, PP,
    replicas and router, disaggregation, a workload file, SLOs and a price. `gemm_calibration`: a
    CAL.json from `solm calibrate` for the part's GEMMs (None: the shipped A100 fit carried)."""
    label = f"{trace.system} on {hardware}" + (f" ({model})" if model else "")
    label += " (calibrated GEMMs)" if gemm_calibration else ""
    part = whatif_part(hardware, gemm_calibration)
    if deployment and replay_available():
        return whatif_deployment(trace, hardware, model, max_seqs, max_batch_tokens, rate, deployment, label, part)
    if replay_available():
        from simulator.models import ModelSpec, get_model
        from simulator.replay import ReplayConfig, replay
        from simulator.workload import from_trace

        spec = get_model(model) if model else ModelSpec.from_trace_meta(trace.meta)
        cfg = ReplayConfig(max_seqs=int(max_seqs), max_batch_tokens=int(max_batch_tokens), rate=rate)
        result = replay(from_trace(trace), part, spec, cfg)
        reqs = _replay_requests(result, trace)
        metrics = {
            k: v
            for k, v in dict(getattr(result, "metrics", {}) or {}).items()
            if isinstance(v, (int, float, str)) or v is None
        }
        engine = "SimPy replay (continuous batching)"
    else:
        reqs = whatif_recost(trace, hardware, model, gemm_calibration)
        metrics = {
            "mean_e2el_ms": float(reqs["e2e_s"].mean() * 1e3),
            "mean_ttft_ms": float(reqs["ttft_s"].mean() * 1e3),
        }
        engine = "cost model per pass (replay not available: batch settings and rate not applied)"
    return {
        "requests": reqs,
        "point": whatif_point(trace, reqs, hardware, model, label),
        "metrics": metrics,
        "engine": engine,
    }


def whatif_deployment(
    trace: Trace,
    hardware: str,
    model: str | None,
    max_seqs: int,
    max_batch_tokens: int,
    rate: float | None,
    d: dict,
    label: str,
    part=None,
) -> dict:
    """The cluster what-if (simulator.cluster.run): keys tp, pp, pp_schedule, replicas, router, disaggregate
    ("P:D" or ""), workload (a CSV path or ""), time_scale, num_requests, slo_ttft_ms, slo_tpot_ms,
    price_per_gpu_hour (0 or None: not set). `part`: the hardware spec to use (default: the catalog's
    `hardware`)."""
    from simulator.cluster.run import simulate

    spec, part, workload = _deployment_inputs(trace, hardware, model, d, part)
    cfg, cluster = _deployment_configs(max_seqs, max_batch_tokens, rate, d)
    result = simulate(workload, part, spec, cfg, cluster)
    if d.get("workload"):  # requests of the file, not of the trace: no quality to carry over
        reqs = result.requests.copy()
        reqs["quality_score"] = np.nan
    else:
        reqs = _replay_requests(result, trace)
    metrics = {k: v for k, v in result.metrics.items() if isinstance(v, (int, float, str)) or v is None}
    return {
        "requests": reqs,
        "point": whatif_point(trace, reqs, hardware, model, label),
        "metrics": metrics,
        "engine": "SimPy replay of the deployment (simulator.cluster)",
    }


def _deployment_inputs(trace: Trace, hardware: str, model: str | None, d: dict, part=None) -> tuple:
    """(model spec, part, workload) of a cluster what-if: the page's price set on the part, the
    trace's requests stretched to `d["workload"]`'s lengths and arrivals when a file is given."""
    import dataclasses

    from simulator.cluster.workload_file import read_workload_file, stretch
    from simulator.hardware import get_hardware
    from simulator.models import ModelSpec, get_model
    from simulator.workload import from_trace

    spec = get_model(model) if model else ModelSpec.from_trace_meta(trace.meta)
    part = get_hardware(hardware) if part is None else part
    if d.get("price_per_gpu_hour"):
        part = dataclasses.replace(part, price_per_gpu_hour=float(d["price_per_gpu_hour"]))
    workload = from_trace(trace)
    if d.get("workload"):
        workload = stretch(workload, read_workload_file(d["workload"], time_scale=float(d.get("time_scale") or 1.0)))
    return spec, part, workload


def _deployment_configs(max_seqs: int, max_batch_tokens: int, rate: float | None, d: dict) -> tuple:
    """(ReplayConfig, ClusterConfig) from the what-if page's batch settings and deployment keys `d`
    (missing keys: one GPU, one replica, round robin, no disaggregation, no SLO)."""
    from simulator.cluster.cli import parse_disaggregate
    from simulator.cluster.parallel import Parallelism
    from simulator.cluster.run import ClusterConfig
    from simulator.replay import ReplayConfig

    cfg = ReplayConfig(
        max_seqs=int(max_seqs),
        max_batch_tokens=int(max_batch_tokens),
        rate=rate,
        num_requests=int(d["num_requests"]) if d.get("num_requests") else None,
    )
    cluster = ClusterConfig(
        Parallelism(int(d.get("tp", 1)), int(d.get("pp", 1)), schedule=d.get("pp_schedule", "drain")),
        replicas=int(d.get("replicas", 1)),
        router=d.get("router", "round_robin"),
        disaggregate=parse_disaggregate(d.get("disaggregate") or None),
        slo_ttft_ms=d.get("slo_ttft_ms") or None,
        slo_tpot_ms=d.get("slo_tpot_ms") or None,
    )
    return cfg, cluster


def _replay_requests(result, trace: Trace) -> pd.DataFrame:
    """Per-request rows of a replay result, in the columns `whatif_point` reads."""
    table = getattr(result, "requests", None)
    if table is None and hasattr(result, "tables"):
        table = result.tables.get("requests")
    if table is not None and hasattr(table, "to_pandas"):
        table = table.to_pandas()
    if table is None:
        raise ValueError("the replay result has no per-request table")
    df = pd.DataFrame(table).copy()
    src = trace.requests.set_index("request_id")
    for col in ("quality_score", "output_tokens"):
        if col not in df:
            df[col] = df["request_id"].map(src[col]) if "request_id" in df else np.nan
    if "peak_kv_bytes" not in df:
        df["peak_kv_bytes"] = np.nan
    return df
