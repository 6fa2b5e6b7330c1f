"""Timeline: one request at a time: streams / spans / register steps as a Gantt over forward
passes, live KV and bytes held over time, and the counters sampled meanwhile."""

import streamlit as st

from dashboard import data, figures
from dashboard.views import _shared
from profiler.reader import TraceError

st.title("Timeline")
traces, _ = _shared.load()
if _shared.need_traces(traces):
    c1, c2 = st.columns([2, 1])
    with c1:
        trace = _shared.pick_trace(traces, key="timeline_trace")
    with c2:
        rid = _shared.pick_request(trace, key="timeline_request")
    if rid is not None:
        row = trace.requests.set_index("request_id").loc[rid]
        m = st.columns(5)
        m[0].metric("e2e", f"{row['e2e_s'] * 1e3:.1f} ms")
        m[1].metric("ttft", f"{row['ttft_s'] * 1e3:.1f} ms")
        m[2].metric("forward passes", int(row["steps"]))
        m[3].metric("output tokens", int(row["output_tokens"]))
        m[4].metric("peak live KV", f"{int(row['peak_live_kv_tokens'])} tokens")
        try:  # the Timeline's columns are read now: a steps.parquet damaged there is one error line
            steps = _shared.request_steps(trace, rid)
        except TraceError as e:
            st.error(str(e))
            st.stop()
        gantt = data.gantt_frame(steps)
        span = (gantt["start_ms"].min(), gantt["end_ms"].max()) if len(gantt) else None
        st.plotly_chart(figures.gantt_figure(gantt), key="timeline_gantt")
        st.plotly_chart(figures.kv_figure(data.kv_frame(steps), x_range=span), key="timeline_kv")
        source = trace.meta.get("counters_source", "?")
        st.plotly_chart(
            figures.counters_figure(data.counters_frame(trace, steps), title=f"counters ({source})"),
            key="timeline_counters",
        )
        with st.expander("Output text"):
            st.code(str(row["output_text"]), language=None)
