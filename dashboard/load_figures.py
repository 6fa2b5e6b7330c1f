"""The Load page's figure: latency against throughput, a curve per system and kind (no `st.*`)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures import _layout, _system_colors

LABELS = {
    "request_throughput": "throughput (requests/s)",
    "output_throughput": "throughput (output tokens/s)",
    "ttft_ms_p50": "median TTFT (ms)",
    "ttft_ms_p99": "p99 TTFT (ms)",
    "tpot_ms_p50": "median TPOT (ms)",
    "e2e_ms_p50": "median end-to-end latency (ms)",
    "e2e_ms_p99": "p99 end-to-end latency (ms)",
}
DASH = {"measured": "solid", "simulated (batch-1 calibration)": "dash", "simulated trace": "dot", "what-if": "dashdot"}
SYMBOL = {
    "measured": "circle",
    "simulated (batch-1 calibration)": "diamond",
    "simulated trace": "square",
    "what-if": "x",
}


def load_curve_figure(points: pd.DataFrame, x: str = "request_throughput", y: str = "e2e_ms_p50") -> go.Figure:
    """Measured and simulated latency-vs-throughput curves per system overlaid (sorted by throughput)."""
    fig = go.Figure()
    colors = _system_colors(points["system"]) if len(points) else {}
    for (system, kind), g in points.dropna(subset=[x, y]).groupby(["system", "kind"], sort=True):
        g = g.sort_values(x)
        fig.add_trace(
            go.Scatter(
                x=g[x],
                y=g[y],
                mode="lines+markers",
                name=f"{system} {kind}",
                line=dict(color=colors[system], dash=DASH.get(kind, "solid")),
                marker=dict(symbol=SYMBOL.get(kind, "circle"), size=9),
                text=g["load"],
                hovertemplate="%{text}<br>%{x:.3g}, %{y:.3g}<extra></extra>",
            )
        )
    fig.update_xaxes(title=LABELS.get(x, x))
    fig.update_yaxes(title=LABELS.get(y, y))
    return _layout(fig, f"{LABELS.get(y, y)} vs {LABELS.get(x, x)}")
