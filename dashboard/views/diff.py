"""Diff: pick two traces; `solm diff` drawn: speedup, per-metric ratios, latency per request,
the token diff of one output and the change of its dependence graph."""

import streamlit as st

from dashboard import data, figures
from dashboard.views import _shared
from profiler.reader import TraceError

st.title("Diff")
traces, _ = _shared.load()
if _shared.need_traces(traces):
    c1, c2 = st.columns(2)
    with c1:
        a = _shared.pick_trace(traces, "A (baseline)", key="diff_a", index=0)
    with c2:
        b = _shared.pick_trace(traces, "B", key="diff_b", index=1)
    try:
        d = _shared.diff(a, b)
    except TraceError as e:
        st.error(str(e))
        st.stop()
    o = d.overall
    m = st.columns(4)
    m[0].metric("speedup A/B", f"{o['speedup']:.2f}x" if o["speedup"] else "n/a")
    m[1].metric("matched requests", len(d.requests), help=f"matched by {d.matched_by}")
    m[2].metric("identical outputs", o["text_identical_requests"])
    m[3].metric("identical graphs", o["graph_identical_requests"])
    left, right = st.columns(2)
    left.plotly_chart(figures.diff_latency_figure(d), key="diff_latency")
    right.plotly_chart(figures.diff_ratio_figure(d), key="diff_ratios")
    st.dataframe(data.diff_overall_table(d), hide_index=True, width="stretch")
    st.subheader("Per request")
    st.dataframe(data.diff_requests_table(d), hide_index=True, width="stretch")
    rid = st.selectbox("Request (A's id)", [int(i) for i in d.requests["a_id"]], key="diff_request")
    t1, t2 = st.columns(2)
    with t1:
        st.markdown(f"**Token diff** (similarity {d.text[rid]['similarity']:.2f})")
        st.dataframe(data.diff_text_ops(d, rid), hide_index=True, width="stretch")
    with t2:
        st.markdown("**Graph changes**")
        rows = data.diff_graph_rows(d, rid)
        if len(rows):
            st.dataframe(rows, hide_index=True, width="stretch")
        else:
            st.write("none")
    if d.counters:
        st.subheader("Counters")
        st.dataframe([{"counter": k, **v} for k, v in d.counters.items()], hide_index=True)
