"""What-if: choose hardware (with its own GEMM calibration, if any), model size, batch settings and
arrival rate, and the deployment (TP, PP, replicas and router, prefill/decode disaggregation, a
production workload file, SLOs, a price);
the simulator replays the chosen traces live (cached per setting), the Pareto and latency charts
redraw, and the per-GPU memory, GPU count, goodput and cost of the deployment are shown."""

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import data, figures, load_data, whatif_data
from dashboard.views import _shared
from profiler.errors import SolmError
from profiler.reader import read_trace
from simulator.cluster.parallel import PP_SCHEDULES
from simulator.cluster.routers import ROUTERS
from simulator.cluster.workload_file import WORKLOADS_DIR
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
    deployment: tuple = (),
    gemm_calibration: str = "",
    calibration_signature: tuple = (),
) -> dict:
    return whatif_data.whatif_run(
        read_trace(path),
        hardware,
        model,
        max_seqs,
        max_batch_tokens,
        rate,
        dict(deployment) or None,
        gemm_calibration or None,
    )


WORKLOADS = {"(the trace's own requests)": "", **{p.stem: str(p) for p in sorted(WORKLOADS_DIR.glob("*.csv"))}}


def deployment_ui() -> tuple:
    """The cluster controls, as a hashable tuple of (key, value) pairs (empty: a single device)."""
    with st.expander("Deployment: parallelism, replicas, disaggregation, workload, SLOs, price"):
        c = st.columns(4)
        tp = c[0].selectbox("Tensor parallel", [1, 2, 4, 8], key="whatif_tp")
        pp = c[1].selectbox("Pipeline stages", [1, 2, 4], key="whatif_pp")
        replicas = c[2].number_input("Replicas", 1, 64, 1, key="whatif_replicas")
        router = c[3].selectbox(
            "Router", sorted(ROUTERS), index=sorted(ROUTERS).index("round_robin"), key="whatif_router"
        )
        c = st.columns(4)
        disagg = c[0].text_input("Disaggregate P:D (empty: off)", "", key="whatif_disaggregate")
        workload = c[1].selectbox("Workload file", list(WORKLOADS), key="whatif_workload")
        time_scale = c[2].number_input("Arrivals x (time scale)", 0.01, 1000.0, 1.0, key="whatif_time_scale")
        num_requests = c[3].number_input("Requests (0: all)", 0, 100_000, 0, step=100, key="whatif_num_requests")
        c = st.columns(4)
        slo_ttft = c[0].number_input("SLO TTFT ms (0: none)", 0.0, 1e6, 0.0, key="whatif_slo_ttft")
        slo_tpot = c[1].number_input("SLO TPOT ms (0: none)", 0.0, 1e6, 0.0, key="whatif_slo_tpot")
        price = c[2].number_input("Price USD per GPU-hour (0: none)", 0.0, 1000.0, 0.0, key="whatif_price")
        schedule = c[3].selectbox("PP schedule (stages > 1)", list(PP_SCHEDULES), key="whatif_pp_schedule")
    d = {
        "tp": int(tp),
        "pp": int(pp),
        "pp_schedule": schedule,
        "replicas": int(replicas),
        "router": router,
        "disaggregate": disagg.strip(),
        "workload": WORKLOADS[workload],
        "time_scale": float(time_scale),
        "num_requests": int(num_requests),
        "slo_ttft_ms": float(slo_ttft),
        "slo_tpot_ms": float(slo_tpot),
        "price_per_gpu_hour": float(price),
    }
    single = (
        d["tp"] == d["pp"] == d["replicas"] == 1
        and not d["disaggregate"]
        and not d["workload"]
        and not (slo_ttft or slo_tpot or price)
    )
    return () if single else tuple(sorted(d.items()))


def deployment_figures(metrics: dict) -> None:
    """GPU count and what one GPU holds, beside the latency figures."""
    if "gpus" not in metrics:
        return
    m = st.columns(6)
    m[0].metric("GPUs", metrics["gpus"])
    m[1].metric("weights per GPU", f"{metrics['weight_bytes_per_gpu'] / 2**30:.1f} GiB")
    m[2].metric("KV pool per GPU", f"{metrics['kv_pool_bytes_per_gpu'] / 2**30:.1f} GiB")
    m[3].metric("comm share of a pass", f"{metrics['comm_share_percent']:.1f}%")
    good = metrics.get("request_goodput")
    m[4].metric("goodput", "n/a" if good is None else f"{good:.2f} req/s")
    cost = metrics.get("cost_per_million_output_tokens")
    m[5].metric("cost / M output tokens", "n/a" if cost is None else f"${cost:.2f}")


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
        "Traces to replay",
        list(labels),
        default=list(labels)[:6],
        format_func=lambda key: labels[key],
        key="whatif_traces",
    )
    deployment = deployment_ui()
    gemm_calibration = st.text_input(
        "GEMM calibration of the part (a CAL.json from `solm calibrate`; empty: the A100 fit carried to it)",
        "",
        key="whatif_gemm_calibration",
    ).strip()
    # the file's size and time: an edited calibration is simulated again, not served from the cache
    stat = Path(gemm_calibration).stat() if gemm_calibration and Path(gemm_calibration).is_file() else None
    calibration_signature = (stat.st_size, stat.st_mtime_ns) if stat else ()
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
                (
                    path,
                    simulate(
                        path,
                        sig,
                        hardware,
                        model_arg,
                        int(max_seqs),
                        int(max_tokens),
                        float(rate) or None,
                        deployment,
                        gemm_calibration,
                        calibration_signature,
                    ),
                )
            )
        except (SolmError, ValueError, KeyError) as e:  # SolmError: a trace unreadable in full (TraceError)
            failures.append(f"{labels[path]}: {e.args[0] if isinstance(e, KeyError) else e}")
    for f in failures:
        st.error(f)
    if results:
        st.caption(f"Simulated with: {results[0][1]['engine']}")
        deployment_figures(results[0][1]["metrics"])
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
            if not dict(deployment).get("workload"):  # the file's requests are not the trace's
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
