"""Dashboard figures: plotly figures from the frames of `dashboard.data` (no `st.*` here).

Phases, kinds and systems keep one colour or symbol across every figure (style item 4: one name
per phase, everywhere). `diff_report_html` assembles the figures of a diff into the
self-contained page `solm diff --html` writes.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard import data
from profiler.diff import METRICS, TraceDiff

PHASE_COLORS = {"prefill": "#4C78A8", "decode": "#F58518", "plan": "#54A24B", "denoise": "#B279A2", "sync": "#E45756"}
KIND_SYMBOLS = {"measured": "circle", "simulated": "diamond", "sweep": "square-open"}
FRONT_DASH = {"measured": "solid", "simulated": "dash", "sweep": "dot"}
NODE_COLORS = {
    "prompt": "#9D9D9D",
    "main": "#4C78A8",
    "async": "#F58518",
    "thread": "#F58518",
    "span": "#B279A2",
    "step": "#54A24B",
    "plan": "#72B7B2",
}
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D", "#EECA3B")
AXIS = {
    "e2e_ms_mean": "mean end-to-end latency (ms)",
    "e2e_ms_p50": "median end-to-end latency (ms)",
    "ttft_ms_p50": "median time to first token (ms)",
    "peak_kv_bytes": "peak KV held (bytes)",
    "quality": "quality (mean score, 0..1)",
    "tokens_per_s": "throughput (tokens/s)",
}


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0.01, xanchor="left"),
        height=height + 60,
        template="plotly_white",
        margin=dict(l=60, r=20, t=50, b=40),
        legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0),
    )
    return fig


def _system_colors(systems) -> dict[str, str]:
    return {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(sorted(set(systems)))}


def pareto_figure(
    points: pd.DataFrame, x: str = "e2e_ms_mean", y: str = "quality", title: str | None = None
) -> go.Figure:
    """Every trace a point (colour: system, symbol: measured/simulated); each kind's front drawn."""
    fig = go.Figure()
    colors = _system_colors(points["system"]) if len(points) else {}
    for (system, kind), g in points.groupby(["system", "kind"], sort=True):
        fig.add_trace(
            go.Scatter(
                x=g[x],
                y=g[y],
                mode="markers",
                name=f"{system} ({kind})",
                text=g["label"],
                marker=dict(
                    size=12,
                    color=colors[system],
                    symbol=KIND_SYMBOLS.get(kind, "circle"),
                    line=dict(width=1, color="#333"),
                ),
                hovertemplate="%{text}<br>" + AXIS.get(x, x) + ": %{x:.4g}<br>" + AXIS.get(y, y) + ": %{y:.3g}"
                "<extra></extra>",
            )
        )
    for kind, g in points.groupby("kind"):
        front = data.pareto_front(g, x, y)
        if len(front) >= 1:
            fig.add_trace(
                go.Scatter(
                    x=front[x],
                    y=front[y],
                    mode="lines",
                    name=f"front ({kind})",
                    line=dict(color="#333", dash=FRONT_DASH.get(kind, "solid"), shape="hv", width=1.5),
                    hoverinfo="skip",
                )
            )
    # measured CPU runs and simulated GPU replays sit orders of magnitude apart: log axes
    fig.update_xaxes(
        title=AXIS.get(x, x),
        type="log" if x in ("peak_kv_bytes", "e2e_ms_mean", "e2e_ms_p50", "ttft_ms_p50") else "linear",
    )
    fig.update_yaxes(title=AXIS.get(y, y))
    return _layout(fig, title or f"{AXIS.get(y, y)} vs {AXIS.get(x, x)}")


def gantt_figure(g: pd.DataFrame, title: str = "streams over forward passes") -> go.Figure:
    """One bar per (pass, stream), coloured by phase; streams are rows."""
    fig = go.Figure()
    for phase, p in g.groupby("phase", sort=False):
        fig.add_trace(
            go.Bar(
                base=p["start_ms"],
                x=p["duration_ms"],
                y=p["stream"],
                orientation="h",
                name=phase,
                marker=dict(color=PHASE_COLORS.get(phase, "#999"), line=dict(width=0.5, color="white")),
                customdata=p[["step_index", "query_tokens"]],
                hovertemplate="step %{customdata[0]}<br>%{base:.2f} ms + %{x:.2f} ms<br>%{customdata[1]} query tokens"
                "<extra>" + phase + "</extra>",
            )
        )
    order = g.sort_values("stream_id")["stream"].unique().tolist() if len(g) else []
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], title="stream")
    fig.update_xaxes(title="time since run start (ms)")
    fig.update_layout(barmode="overlay", bargap=0.25)
    return _layout(fig, title, height=max(260, 80 + 40 * len(order)))


def kv_figure(kv: pd.DataFrame, title: str = "KV over time", x_range: tuple[float, float] | None = None) -> go.Figure:
    """Live KV tokens and bytes held after each pass (`x_range`: align with the Gantt above)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(
            x=kv["t_ms"],
            y=kv["live_kv_tokens"],
            name="live KV tokens",
            mode="lines",
            line=dict(shape="hv", color="#4C78A8"),
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=kv["t_ms"],
            y=kv["kv_bytes_allocated"],
            name="KV bytes held",
            mode="lines",
            line=dict(shape="hv", color="#E45756", dash="dot"),
        ),
        secondary_y=True,
    )
    fig.update_xaxes(title="time since run start (ms)")
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    fig.update_yaxes(title="live KV (tokens)", secondary_y=False)
    fig.update_yaxes(title="held (bytes)", secondary_y=True)
    return _layout(fig, title, height=320)


def counters_figure(long: pd.DataFrame, title: str = "counters") -> go.Figure:
    names = list(dict.fromkeys(long["counter"])) if len(long) else []
    if not names:
        fig = go.Figure()
        fig.add_annotation(
            text="no counter samples in this window", showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper"
        )
        return _layout(fig, title, height=200)
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, subplot_titles=names, vertical_spacing=0.08)
    for i, n in enumerate(names, start=1):
        s = long.loc[long["counter"] == n]
        fig.add_trace(
            go.Scatter(
                x=s["t_ms"],
                y=s["value"],
                name=n,
                mode="lines+markers",
                showlegend=False,
                marker=dict(size=4),
                line=dict(color=PALETTE[(i - 1) % len(PALETTE)]),
            ),
            row=i,
            col=1,
        )
    fig.update_xaxes(title="time since run start (ms)", row=len(names), col=1)
    return _layout(fig, title, height=160 + 150 * len(names))


def graph_figure(nodes: pd.DataFrame, edges: pd.DataFrame, title: str = "chunk dependence graph") -> go.Figure:
    fig = go.Figure()
    xs, ys = [], []
    for e in edges.itertuples():
        xs += [e.x0, e.x1, None]
        ys += [e.y0, e.y1, None]
    fig.add_trace(
        go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#aaa", width=1.5), hoverinfo="skip", showlegend=False)
    )
    if len(edges):  # arrowheads at the dependent chunk
        for e in edges.itertuples():
            fig.add_annotation(
                x=e.x1,
                y=e.y1,
                ax=e.x0,
                ay=e.y0,
                xref="x",
                yref="y",
                axref="x",
                ayref="y",
                showarrow=True,
                arrowhead=2,
                arrowsize=1.2,
                arrowcolor="#888",
                standoff=14,
                text="",
            )
    for kind, g in nodes.groupby("kind", sort=False):
        size = 16 + 4 * g["tokens"].fillna(0).astype(float).clip(lower=0) ** 0.5
        fig.add_trace(
            go.Scatter(
                x=g["x"],
                y=g["y"],
                mode="markers+text",
                name=kind,
                text=g["id"],
                textposition="top center",
                marker=dict(
                    size=size, color=NODE_COLORS.get(kind.split(":")[0], "#777"), line=dict(width=1, color="#333")
                ),
                customdata=g[["tokens", "stream"]],
                hovertemplate="%{text}<br>%{customdata[0]} tokens, stream %{customdata[1]}<extra>" + kind + "</extra>",
            )
        )
    fig.update_xaxes(title="dependence depth", showgrid=False, zeroline=False, dtick=1)
    fig.update_yaxes(visible=False)
    return _layout(
        fig, title, height=max(300, 120 + 60 * (nodes["y"].max() - nodes["y"].min() + 1 if len(nodes) else 1))
    )


MAX_BARS = 1000  # bars per series: a figure is narrower than that many pixels


def _latency_bars(g: pd.DataFrame, per_bar: int) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(x labels, heights, the largest latency of each bar) of one series: a bar per request, or
    with `per_bar` > 1 the mean of that many consecutive requests (labelled first-last id)."""
    if per_bar == 1:
        return g["request_id"].astype(str), g["e2e_ms"], g["e2e_ms"]
    grouped = g.reset_index(drop=True).groupby(np.arange(len(g)) // per_bar)
    ids = grouped["request_id"]
    labels = ids.first().astype(str) + "-" + ids.last().astype(str)
    return labels, grouped["e2e_ms"].mean(), grouped["e2e_ms"].max()


def latency_figure(requests: pd.DataFrame, title: str = "end-to-end latency per request") -> go.Figure:
    """Grouped bars: `requests` has request_id, e2e_ms and series (e.g. measured / simulated). A
    series of more than `MAX_BARS` requests is drawn as `MAX_BARS` bars or fewer, each the mean of
    consecutive requests (said in the title; hover shows the largest of them)."""
    fig = go.Figure()
    longest = int(requests.groupby("series", sort=False).size().max()) if len(requests) else 0
    per_bar = -(-longest // MAX_BARS) if longest > MAX_BARS else 1
    for i, (series, g) in enumerate(requests.groupby("series", sort=False)):
        x, y, peak = _latency_bars(g, per_bar)
        fig.add_trace(
            go.Bar(
                x=x,
                y=y,
                name=series,
                marker_color=PALETTE[i % len(PALETTE)],
                customdata=peak,
                hovertemplate="requests %{x}: mean %{y:.4g} ms, largest %{customdata:.4g} ms<extra></extra>"
                if per_bar > 1
                else None,
            )
        )
    fig.update_xaxes(title="request" if per_bar == 1 else f"requests (each bar: the mean of {per_bar} in a row)")
    fig.update_yaxes(title="end-to-end latency (ms)", type="log", dtick=1)
    fig.update_layout(barmode="group")
    if per_bar > 1:
        title += f" ({longest} requests: each bar the mean of {per_bar} consecutive ones)"
    return _layout(fig, title, height=340)


def diff_latency_figure(d: TraceDiff) -> go.Figure:
    t = data.diff_requests_table(d)
    long = pd.concat(
        [
            pd.DataFrame({"request_id": t["a_id"], "e2e_ms": t["e2e_ms_a"], "series": f"A {d.a.system} ({d.a.name})"}),
            pd.DataFrame({"request_id": t["a_id"], "e2e_ms": t["e2e_ms_b"], "series": f"B {d.b.system} ({d.b.name})"}),
        ]
    )
    fig = latency_figure(long, title=f"latency per request (speedup A/B {d.overall['speedup'] or 0:.2f}x)")
    fig.update_yaxes(type="linear", dtick=None)
    return fig


def diff_ratio_figure(d: TraceDiff) -> go.Figure:
    """B/A per metric as bars from 1; green where B is better (lower latency and memory, higher
    parallelism and quality), red where worse."""
    lower_better = dict(METRICS)
    t = data.diff_overall_table(d).dropna(subset=["ratio"])
    better = [(r < 1) == lower_better[m] or r == 1 for m, r in zip(t["metric"], t["ratio"])]
    fig = go.Figure(
        go.Bar(
            x=t["ratio"] - 1,
            base=1,
            y=t["metric"],
            orientation="h",
            marker_color=["#54A24B" if b else "#E45756" for b in better],
            customdata=t["ratio"],
            hovertemplate="%{y}: B/A = %{customdata:.3f}<extra></extra>",
        )
    )
    fig.add_vline(x=1.0, line=dict(color="#333", dash="dash"))
    fig.update_xaxes(title="B / A (mean over matched requests)")
    fig.update_yaxes(categoryorder="array", categoryarray=t["metric"].tolist()[::-1])
    return _layout(fig, "ratios B / A (green: B better)", height=380)


def diff_report_html(d: TraceDiff) -> str:
    """A self-contained HTML page (plotly.js inlined once) with the diff's tables and figures."""
    s = d.summary()
    o = s["overall"]
    figs = [diff_latency_figure(d), diff_ratio_figure(d)]
    first = d.requests["a_id"].iloc[0] if len(d.requests) else None
    if first is not None:
        for side, t, rid in (("A", d.a, int(first)), ("B", d.b, int(d.requests["b_id"].iloc[0]))):
            n, e = data.graph_layout(t.graphs.get(rid))
            figs.append(graph_figure(n, e, title=f"{side}: dependence graph of request {rid} ({t.system})"))
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figs)]
    overall = data.diff_overall_table(d).to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="n/a")
    per_req = data.diff_requests_table(d).to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="n/a")
    counters = pd.DataFrame([{"counter": k, **v} for k, v in s["counters"].items()])
    counters_html = (
        counters.to_html(index=False, float_format=lambda x: f"{x:.4g}")
        if len(counters)
        else "<p>No counter both traces have.</p>"
    )
    head = (
        f"<p><b>A</b> {html.escape(s['a']['trace'])} ({s['a']['kind']} {s['a']['system']})<br>"
        f"<b>B</b> {html.escape(s['b']['trace'])} ({s['b']['kind']} {s['b']['system']})<br>"
        f"{s['matched']} requests matched by {s['matched_by']}; speedup A/B "
        f"<b>{(o['speedup'] or 0):.3f}x</b> (geomean {(o['speedup_geomean'] or 0):.3f}x); outputs identical in "
        f"{o['text_identical_requests']}, graphs in {o['graph_identical_requests']}.</p>"
    )
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;"
        "font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>solm diff</title><style>{style}</style>"
        f"</head><body><h1>solm diff</h1>{head}<h2>Overall</h2>{overall}{parts[0]}{parts[1]}"
        f"<h2>Per request</h2>{per_req}<h2>Counters</h2>{counters_html}<h2>Dependence graphs</h2>"
        f"{''.join(parts[2:])}</body></html>"
    )
