"""What-if: choose hardware, model size, batch settings and arrival rate; the simulator replays
the chosen traces live (cached per setting) and the Pareto and latency charts redraw."""

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import data, figures, load_data
from dashboard.views import _shared
from profiler.reader import read_trace
from simulator.hardware import HARDWARE
from simulator.models import MODELS

TRACE_MODEL = "(the trace's own model)"


@st.cache_data(show_spinner="simulating…", max_entries=256)
def simulate(
    path: str,
    signature: tuple,
    hardware: str,
    model: str | None,
    max_seqs: int,
    max_batch_tokens: int,
    rate: float | None,
) -> dict:
    return data.whatif_run(read_trace(path), hardware, model, max_seqs, max_batch_tokens, rate)


st.title("What-if")
traces, _ = _shared.load()
measured = [t for t in traces if t.kind == "measured"]
if _shared.need_traces(measured):
    labels = dict(zip((str(t.path) for t in measured), data.trace_labels(measured)))
    c1, c2, c3, c4, c5 = st.columns([2, 2, 1, 1, 1])
    hw_names = sorted(HARDWARE)
    hardware = c1.selectbox("Hardware", hw_names, index=hw_names.index("a100-80g"), key="whatif_hardware")
    model = c2.selectbox("Model", [TRACE_MODEL, *sorted(MODELS)], key="whatif_model")
    max_seqs = c3.number_input("Max sequences", 1, 4096, 64, key="whatif_max_seqs")
    max_tokens = c4.number_input("Max batched tokens", 16, 1 << 20, 8192, step=512, key="whatif_max_tokens")
    rate = c5.number_input("Arrival rate (req/s, 0 = trace's)", 0.0, 1e6, 0.0, key="whatif_rate")
    chosen = st.multiselect(
        "Traces to replay", list(labels), default=list(labels)[:6], format_func=labels.get, key="whatif_traces"
    )
    model_arg = None if model == TRACE_MODEL else model
    serving = [labels[p] for p in chosen if load_data.is_serving(next(t for t in measured if str(t.path) == p))]
    if serving:
        st.caption(
            f"Serving runs ({', '.join(serving)}): rate 0 replays their own arrivals, another rate replays "
            f"their requests as Poisson arrivals at that rate (the Load page overlays them with the "
            f"measured curve)."
        )
    results, failures = [], []
    for path in chosen:
        sig = data.signature([Path(path)])
        try:
            results.append(
                (path, simulate(path, sig, hardware, model_arg, int(max_seqs), int(max_tokens), float(rate) or None))
            )
        except (ValueError, KeyError) as e:
            failures.append(f"{labels[path]}: {e.args[0] if isinstance(e, KeyError) else e}")
    for f in failures:
        st.error(f)
    if results:
        st.caption(f"Simulated with: {results[0][1]['engine']}")
        points = data.pareto_points([t for t in measured if str(t.path) in chosen])
        sim_points = pd.DataFrame([r["point"] for _, r in results])
        both = pd.concat([points, sim_points], ignore_index=True)
        left, right = st.columns(2)
        left.plotly_chart(
            figures.pareto_figure(
                both, "e2e_ms_mean", "quality", title=f"quality vs latency: measured and on {hardware}"
            ),
            key="whatif_pareto",
        )
        right.plotly_chart(
            figures.pareto_figure(
                both, "peak_kv_bytes", "quality", title=f"quality vs memory: measured and on {hardware}"
            ),
            key="whatif_memory",
        )
        per_req = []
        for path, r in results:
            t = next(t for t in measured if str(t.path) == path)
            per_req.append(
                pd.DataFrame(
                    {
                        "request_id": t.requests["request_id"],
                        "e2e_ms": t.requests["e2e_s"] * 1e3,
                        "series": f"{t.system} measured",
                    }
                )
            )
            per_req.append(
                pd.DataFrame(
                    {
                        "request_id": r["requests"]["request_id"],
                        "e2e_ms": r["requests"]["e2e_s"] * 1e3,
                        "series": f"{t.system} on {hardware}",
                    }
                )
            )
        st.plotly_chart(figures.latency_figure(pd.concat(per_req, ignore_index=True)), key="whatif_latency")
        st.dataframe(
            pd.DataFrame([{"trace": labels[p], **r["metrics"]} for p, r in results]), hide_index=True, width="stretch"
        )
