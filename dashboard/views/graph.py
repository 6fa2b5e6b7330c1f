"""Dependence graph: the chunk DAG of one request (prompt, main segments, threads, spans,
reasoning steps), layered by dependence depth."""

import streamlit as st

from dashboard import data, figures
from dashboard.views import _shared

st.title("Dependence graph")
traces, _ = _shared.load()
if _shared.need_traces(traces):
    c1, c2 = st.columns([2, 1])
    with c1:
        trace = _shared.pick_trace(traces, key="graph_trace")
    with c2:
        rid = _shared.pick_request(trace, key="graph_request")
    if rid is not None:
        graph = trace.graphs.get(rid)
        if not graph:
            st.warning(f"{trace.name} has no dependence graph for request {rid}.")
        else:
            nodes, edges = data.graph_layout(graph)
            st.plotly_chart(figures.graph_figure(nodes, edges), key="graph_chart")
            st.dataframe(nodes.drop(columns=["x", "y"]), hide_index=True, width="stretch")
