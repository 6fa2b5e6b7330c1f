"""Load: latency against throughput per system, measured serving runs and the simulator's
prediction of them (calibrated on a batch-1 trace of the same system found in the folders)
overlaid; a what-if rate replays every serving trace's requests at another Poisson rate."""

import pandas as pd
import streamlit as st

from dashboard import load_data, load_figures
from dashboard.views import _shared


@st.cache_data(show_spinner="predicting the serving runs…", max_entries=64)
def predict(calibration: str, serving: tuple[str, ...], signature: tuple, rate: float | None) -> dict:
    from simulator.load_validation import validate_load

    if rate:
        return validate_load(list(serving), calibration, rate=rate)
    return validate_load(list(serving), calibration)


st.title("Load")
traces, _ = _shared.load()
points = load_data.load_points(traces)
if points.empty:
    st.info(
        "No serving runs in the folders. Capture some with `solm capture --system S --rate R --out DIR` "
        "(several rates), and a batch-1 trace of the same system for the simulated curve."
    )
else:
    c1, c2, c3 = st.columns([2, 2, 1])
    y = c1.radio(
        "Latency",
        ["e2e_ms_p50", "e2e_ms_p99", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50"],
        format_func=load_figures.LABELS.get,
        horizontal=True,
        key="load_y",
    )
    x = c2.radio(
        "Throughput",
        ["request_throughput", "output_throughput"],
        format_func=load_figures.LABELS.get,
        horizontal=True,
        key="load_x",
    )
    rate = c3.number_input("What-if rate (req/s, 0 = off)", 0.0, 1e6, 0.0, key="load_rate")
    frames = [points]
    for calib, serving in load_data.calibration_groups(traces):
        sig = tuple(
            sorted(str(t.path) + str(t.meta.get("created_at")) for t in traces if str(t.path) in (calib, *serving))
        )
        try:
            frames.append(load_data.predicted_points(predict(calib, tuple(serving), sig, None)))
            if rate:
                frames.append(load_data.predicted_points(predict(calib, tuple(serving), sig, float(rate)), "what-if"))
        except (ValueError, KeyError) as e:
            st.error(f"{calib}: {e.args[0] if isinstance(e, KeyError) else e}")
    both = pd.concat([f for f in frames if len(f)], ignore_index=True)
    st.plotly_chart(load_figures.load_curve_figure(both, x, y), key="load_chart")
    if len(frames) == 1:
        st.caption("No batch-1 trace of these systems in the folders: only measured points are drawn.")
    st.dataframe(both.drop(columns=["path"]), hide_index=True, width="stretch")
