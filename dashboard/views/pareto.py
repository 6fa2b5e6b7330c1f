"""Pareto: quality against latency and against memory; every system and knob setting a point,
measured and simulated traces overlaid with the configurations of any `solm sweep` table found
in the folders, each kind's front drawn."""

import pandas as pd
import streamlit as st

from dashboard import data, figures
from dashboard.views import _shared

st.title("Pareto: quality vs latency and memory")
traces, _ = _shared.load()
if _shared.need_traces(traces):
    points = data.pareto_points(traces)
    sweeps, sweep_errors = _shared.load_sweeps()
    for e in sweep_errors:
        st.error(e)
    if len(sweeps) and st.toggle(f"Include {len(sweeps)} sweep configurations", value=True, key="pareto_sweeps"):
        points = pd.concat([points, sweeps], ignore_index=True)
    latency = st.radio(
        "Latency",
        ["e2e_ms_mean", "e2e_ms_p50", "ttft_ms_p50"],
        horizontal=True,
        format_func=figures.AXIS.get,
        key="pareto_latency",
    )
    left, right = st.columns(2)
    left.plotly_chart(figures.pareto_figure(points, latency, "quality"), key="pareto_latency_chart")
    right.plotly_chart(figures.pareto_figure(points, "peak_kv_bytes", "quality"), key="pareto_memory_chart")
    if points["quality"].isna().any():
        st.caption("Traces without a quality score (structure replays) are not drawn.")
    st.dataframe(points.drop(columns=["path"]), hide_index=True, width="stretch")
