"""Overview: every trace found (measured / simulated, system, model, device, date, headline
figures), and one error row per folder that could not be read while the others still load."""

import streamlit as st

from dashboard import data
from dashboard.views import _shared

st.title("Traces")
traces, errors = _shared.load()
table = data.overview_table(traces, errors)
measured = int((table["kind"] == "measured").sum())
simulated = int((table["kind"] == "simulated").sum())
c1, c2, c3 = st.columns(3)
c1.metric("measured", measured)
c2.metric("simulated", simulated)
c3.metric("unreadable", len(errors))
if len(table):
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "quality": st.column_config.NumberColumn(format="%.3f"),
            "e2e_ms_p50": st.column_config.NumberColumn("e2e p50 (ms)", format="%.1f"),
            "tokens_per_s": st.column_config.NumberColumn("tokens/s", format="%.1f"),
        },
    )
else:
    _shared.need_traces(traces)
for e in errors.itertuples():
    st.error(f"{e.path}: {e.error}")
