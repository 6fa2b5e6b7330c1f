"""The dashboard's figures, Load-page frames and what-if helpers, each test killing mutants a
mutation round on dashboard/figures.py, load_data.py, load_figures.py, whatif_data.py and views/
left alive (named in the docstrings). Figures are inspected as plotly objects; the pages through
Streamlit's AppTest (no server).

The round: 67 mutants; 9 killed by the existing fast tests (test_data.py and test_load.py, plus
test_app.py for whatif_data.py and the pages); the 58 survivors all killed here. None equivalent;
no bug found."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dashboard import data, figures, load_data, load_figures, whatif_data
from profiler.diff import diff_traces
from profiler.reader import read_trace
from tests.dashboard.traces import make_trace


def _points() -> pd.DataFrame:
    """Two systems, measured and simulated: of the measured, (10, 0.5) and (40, 0.9) are the front
    and (20, 0.4) is dominated; the simulated sit two orders of magnitude lower in latency."""
    return pd.DataFrame(
        {
            "system": ["a", "a", "b", "a"],
            "kind": ["measured", "measured", "measured", "simulated"],
            "label": ["m1", "m2", "m3", "s1"],
            "e2e_ms_mean": [10.0, 20.0, 40.0, 0.1],
            "quality": [0.5, 0.4, 0.9, 0.5],
            "peak_kv_bytes": [1e3, 2e3, 4e3, 1e3],
        }
    )


def test_pareto_figure_draws_quality_against_latency_and_each_kinds_front():
    """Markers at (latency, quality), a diamond per simulated point, the measured front the points
    of lower latency and higher quality, a log latency axis titled by its column, the page's title
    when given. (Mutants: y drawn from x, front with x and y swapped, e2e_ms_mean on a linear axis,
    the x axis titled by y, the given title ignored, one symbol for every kind.)"""
    fig = figures.pareto_figure(_points())
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["a (measured)"].x) == [10.0, 20.0] and list(by_name["a (measured)"].y) == [0.5, 0.4]
    assert by_name["a (simulated)"].marker.symbol == "diamond" and by_name["a (measured)"].marker.symbol == "circle"
    front = by_name["front (measured)"]
    assert list(front.x) == [10.0, 40.0] and list(front.y) == [0.5, 0.9]
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis.title.text == figures.AXIS["e2e_ms_mean"]
    assert fig.layout.yaxis.title.text == figures.AXIS["quality"]
    assert fig.layout.title.text == f"{figures.AXIS['quality']} vs {figures.AXIS['e2e_ms_mean']}"
    assert figures.pareto_figure(_points(), title="mine").layout.title.text == "mine"
    assert figures.pareto_figure(_points(), "quality", "peak_kv_bytes").layout.xaxis.type == "linear"


def _gantt() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "stream": ["stream 0", "stream 1", "stream 0"],
            "stream_id": [0, 1, 0],
            "phase": ["prefill", "decode", "decode"],
            "start_ms": [0.0, 5.0, 5.0],
            "duration_ms": [5.0, 2.0, 2.0],
            "end_ms": [5.0, 7.0, 7.0],
            "step_index": [0, 1, 1],
            "query_tokens": [6, 1, 1],
        }
    )


def test_gantt_bars_start_where_the_pass_starts_and_stream_zero_is_on_top():
    """A bar from start_ms, duration_ms long; plotly draws the first category at the bottom, so the
    order is reversed to put stream 0 on top. (Mutants: bars based at the end, as long as the end
    time, streams in bottom-up order.)"""
    fig = figures.gantt_figure(_gantt())
    decode = next(t for t in fig.data if t.name == "decode")
    assert list(decode.base) == [5.0, 5.0] and list(decode.x) == [2.0, 2.0]
    assert list(fig.layout.yaxis.categoryarray) == ["stream 1", "stream 0"]


def test_kv_figure_draws_bytes_on_the_second_axis_aligned_with_the_gantt():
    """(Mutants: the bytes trace drawing tokens, the Gantt's time range not applied.)"""
    kv = pd.DataFrame({"t_ms": [1.0, 2.0], "live_kv_tokens": [6, 7], "kv_bytes_allocated": [4096, 8192]})
    fig = figures.kv_figure(kv, x_range=(0.0, 3.0))
    held = next(t for t in fig.data if t.name == "KV bytes held")
    assert list(held.y) == [4096, 8192] and held.yaxis == "y2"
    assert tuple(fig.layout.xaxis.range) == (0.0, 3.0)


def test_counters_figure_draws_each_counter_its_own_samples():
    """(Mutant: a subplot drawing every counter but its own.)"""
    long = pd.DataFrame({"t_ms": [1.0, 1.0, 2.0], "counter": ["power_w", "cpu_percent", "power_w"], "value": [1, 9, 2]})
    fig = figures.counters_figure(long)
    assert [(t.name, list(t.y)) for t in fig.data] == [("power_w", [1, 2]), ("cpu_percent", [9])]


def test_graph_arrows_point_at_the_dependent_chunk_and_nodes_grow_with_tokens():
    """(Mutants: arrowheads at the chunk depended on, every node the same size.)"""
    graph = {
        "nodes": [{"id": "prompt", "kind": "prompt", "tokens": 16}, {"id": "main:0", "kind": "main", "tokens": 1}],
        "links": [{"source": "prompt", "target": "main:0"}],
    }
    nodes, edges = data.graph_layout(graph)
    fig = figures.graph_figure(nodes, edges)
    (arrow,) = fig.layout.annotations
    assert (arrow.x, arrow.ax) == (1, 0)  # head at main:0 (depth 1), tail at the prompt
    size = {t.name: t.marker.size for t in fig.data if t.mode == "markers+text"}
    assert list(size["prompt"])[0] > list(size["main"])[0]


def test_latency_figure_is_on_a_log_axis():
    """Measured CPU runs and simulated GPU replays sit orders of magnitude apart. (Mutant: linear.)"""
    df = pd.DataFrame({"request_id": [0, 0], "e2e_ms": [1.0, 1000.0], "series": ["a", "b"]})
    assert figures.latency_figure(df).layout.yaxis.type == "log"


@pytest.fixture(scope="module")
def diff_pair(tmp_path_factory):
    """A and B with the same prompts, B's ids from 10 (matched by prompt) and B faster; A's folder
    name holds HTML."""
    root = tmp_path_factory.mktemp("diffpair")
    a = make_trace(root / "a<b>&", e2e_s=[0.4, 0.6], passes=4)
    b = make_trace(root / "b", e2e_s=[0.2, 0.3], passes=4, first_id=10)
    return diff_traces(read_trace(a), read_trace(b))


def test_diff_figures_draw_b_its_own_latency_and_green_where_b_is_better(diff_pair):
    """(Mutants: B's series drawn with A's latency; better/worse colours flipped; bars from 1 as
    long as the ratio, not ratio - 1; the first metric at the bottom.)"""
    lat = figures.diff_latency_figure(diff_pair)
    assert [list(t.y) for t in lat.data] == [[400.0, 600.0], [200.0, 300.0]]
    ratio = figures.diff_ratio_figure(diff_pair)
    bars = ratio.data[0]
    t = data.diff_overall_table(diff_pair).dropna(subset=["ratio"])
    assert list(bars.x) == pytest.approx(list(t["ratio"] - 1)) and bars.base == 1
    colour = dict(zip(bars.y, bars.marker.color))
    assert colour["e2e_s"] == "#54A24B"  # half the latency: better
    assert list(ratio.layout.yaxis.categoryarray) == t["metric"].tolist()[::-1]


def test_diff_report_is_self_contained_escaped_and_draws_each_sides_graph(diff_pair):
    """plotly.js inlined once; the trace names escaped; B's graph the matched request's own (id
    10, not A's 0). (Mutants: plotly.js left out, names unescaped, B's graph looked up by A's id.)"""
    page = figures.diff_report_html(diff_pair)
    assert page.count("<script>/**\n* plotly.js v") == 1
    assert "a&lt;b&gt;&amp;" in page and "a<b>&" not in page
    assert "B: dependence graph of request 10" in page


def _serving(requests: pd.DataFrame, kind: str = "measured", meta: dict | None = None, **kw) -> SimpleNamespace:
    meta = {"knobs": {"rate": 4.0}} if meta is None else meta
    return SimpleNamespace(requests=requests, meta=meta, system="s", name="t", path="/x/t", kind=kind, **kw)


def test_a_load_point_in_ms_from_the_requests_that_finished():
    """Two ok requests: arrivals 0 and 1 s, ttft 0.1 and 0.3 s, e2e 1 and 2 s, 5 and 1 output
    tokens; an errored one left out. (Mutants: errors counted, TPOT over n not n - 1 tokens, a
    one-token request's TPOT kept, seconds not ms, duration to the last arrival not the last
    finish, p99 the median, output throughput counting requests.)"""
    r = pd.DataFrame(
        {
            "status": ["ok", "ok", "error"],
            "arrival_s": [0.0, 1.0, 0.5],
            "ttft_s": [0.1, 0.3, 5.0],
            "e2e_s": [1.0, 2.0, 9.0],
            "output_tokens": [5, 1, 50],
        }
    )
    p = load_data.point(_serving(r), "measured")
    assert p["load"] == "rate 4/s" and p["tpot_ms_p50"] == pytest.approx(225.0)  # (1 - 0.1) / 4
    assert p["e2e_ms_p50"] == pytest.approx(1500.0) and p["ttft_ms_p99"] == pytest.approx(298.0)
    assert p["request_throughput"] == pytest.approx(2 / 3.0) and p["output_throughput"] == pytest.approx(2.0)


def test_serving_level_reads_a_simulated_replays_rate_and_kinds_stay_apart():
    """A simulated trace replayed under load names its rate under simulation.batch. (Mutants: only
    the knobs read; every serving trace a measured point.)"""
    assert load_data.serving_level({"simulation": {"batch": {"rate": 3}}}) == (3.0, None)
    r = pd.DataFrame({"status": ["ok"], "arrival_s": [0.0], "ttft_s": [0.1], "e2e_s": [1.0], "output_tokens": [3]})
    pts = load_data.load_points([_serving(r), _serving(r, kind="simulated")])
    assert pts["kind"].tolist() == ["measured", "simulated trace"]


def test_calibration_pairs_a_batch_one_trace_with_its_own_models_serving_runs():
    """The serving run listed first is not taken for the batch-1 trace; another model's batch-1 trace
    of the same system is not paired. (Mutants: a serving trace taken as calibration, the model left
    out of the key.)"""
    r = pd.DataFrame()

    def t(path, model, serving):
        meta = {"model": {"name": model}, **({"knobs": {"rate": 2.0}} if serving else {})}
        return SimpleNamespace(requests=r, meta=meta, system="s", path=path, kind="measured")

    groups = load_data.calibration_groups(
        [t("r2", "m", True), t("r1", "m", True), t("b1-other", "o", False), t("b1", "m", False)]
    )
    assert groups == [("b1", ["r1", "r2"])]


def test_predicted_points_map_each_simulated_figure_to_its_column():
    """(Mutants: TTFT p50 from E2E, E2E p99 from p50.)"""
    sim = {
        "request_throughput": 1.0,
        "output_throughput": 2.0,
        "ttft_p50_ms": 3.0,
        "ttft_p99_ms": 4.0,
        "tpot_p50_ms": 5.0,
        "e2e_p50_ms": 6.0,
        "e2e_p99_ms": 7.0,
    }
    level = {"system": "s", "rate": 2.0, "concurrency": None, "trace": "/x/r2", "simulated": sim}
    p = load_data.predicted_points({"levels": [level]}).iloc[0]
    assert [p[c] for c in load_data.COLUMNS[3:10]] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert p["load"] == "rate 2/s" and p["trace"] == "r2"


def test_load_curve_runs_along_throughput_with_a_dash_per_kind():
    """(Mutants: the curve sorted by latency, the x axis titled by y, one dash for every kind.)"""
    pts = pd.DataFrame(
        {
            "system": ["s"] * 3 + ["s"],
            "kind": ["measured"] * 3 + ["simulated (batch-1 calibration)"],
            "load": ["a", "b", "c", "a"],
            "request_throughput": [3.0, 1.0, 2.0, 1.0],
            "e2e_ms_p50": [5.0, 10.0, 1.0, 4.0],
        }
    )
    fig = load_figures.load_curve_figure(pts)
    measured, simulated = fig.data
    assert list(measured.x) == [1.0, 2.0, 3.0] and list(measured.y) == [10.0, 1.0, 5.0]
    assert fig.layout.xaxis.title.text == load_figures.LABELS["request_throughput"]
    assert (measured.line.dash, simulated.line.dash) == ("solid", "dash")


def test_whatif_point_in_ms_with_the_source_quality_for_a_structure_replay():
    """Requests of 1, 3 and 8 s (ttft 0.1, 0.2, 0.6 s), 10, 30 and 50 output tokens, no quality of their own.
    (Mutants: seconds not ms, the source trace's quality not carried, throughput over the longest
    request not the sum, median TTFT the mean, median E2E the mean, peak KV the mean.)"""
    reqs = pd.DataFrame(
        {
            "e2e_s": [1.0, 3.0, 8.0],
            "ttft_s": [0.1, 0.2, 0.6],
            "output_tokens": [10, 30, 50],
            "quality_score": [np.nan] * 3,
            "peak_kv_bytes": [1.0, 2.0, 6.0],
        }
    )
    trace = _serving(pd.DataFrame({"quality_score": [0.25, 0.75]}), meta={})
    p = whatif_data.whatif_point(trace, reqs, "h100-sxm", None, "x")
    assert p["quality"] == 0.5 and p["e2e_ms_mean"] == pytest.approx(4000.0) and p["e2e_ms_p50"] == 3000.0
    assert p["ttft_ms_p50"] == pytest.approx(200.0) and p["tokens_per_s"] == pytest.approx(7.5)
    assert p["peak_kv_bytes"] == 6.0


def test_deployment_settings_reach_the_cluster_simulation():
    """(Mutants: replicas, the TTFT SLO, the PP schedule or the request count not passed on.)"""
    d = {"tp": 2, "pp": 2, "pp_schedule": "interleave", "replicas": 3, "slo_ttft_ms": 50.0, "num_requests": 7}
    cfg, cluster = whatif_data._deployment_configs(8, 2048, 1.5, d)
    assert (cfg.max_seqs, cfg.max_batch_tokens, cfg.rate, cfg.num_requests) == (8, 2048, 1.5, 7)
    assert cluster.replicas == 3 and cluster.slo_ttft_ms == 50.0 and cluster.parallelism.schedule == "interleave"


def test_deployment_inputs_set_the_price_and_scale_the_workload_files_arrivals(trace_folder):
    """A time scale of 2: arrivals twice as fast. (Mutants: the price dropped, the time scale not applied to the file's arrivals.)"""
    from simulator.cluster.workload_file import WORKLOADS_DIR

    t = read_trace(trace_folder / "seq")
    csv = str(sorted(WORKLOADS_DIR.glob("*.csv"))[0])
    _, part, w1 = whatif_data._deployment_inputs(t, "h100-sxm", None, {"price_per_gpu_hour": 2.5, "workload": csv})
    _, _, w2 = whatif_data._deployment_inputs(t, "h100-sxm", None, {"workload": csv, "time_scale": 2.0})
    assert part.price_per_gpu_hour == 2.5
    assert w2.arrival_s[-1] == pytest.approx(w1.arrival_s[-1] / 2) and w1.arrival_s[-1] > 0


def test_whatif_rate_and_gemm_calibration_reach_the_simulation(trace_folder, tmp_path):
    """Requests arriving 1000/s queue behind each other, the more so with 8 batched tokens; a CAL.json of a third of the efficiency slows
    a deployment (TP 2) as it does one GPU. (Mutants: the rate or max batched tokens not passed to
    the replay, the calibrated part not passed to the deployment.)"""
    import json

    from simulator.gemm import GemmParams

    t = read_trace(trace_folder / "seq")
    own = whatif_data.whatif_run(t, "h100-sxm", "llama-3-8b", 8, 2048, None)["point"]["e2e_ms_mean"]
    busy = whatif_data.whatif_run(t, "h100-sxm", "llama-3-8b", 8, 2048, 1000.0)["point"]["e2e_ms_mean"]
    tight = whatif_data.whatif_run(t, "h100-sxm", "llama-3-8b", 8, 8, 1000.0)["point"]["e2e_ms_mean"]
    assert busy > own and tight > busy  # 8 tokens a pass: the 5-7 token prompts prefill one at a time
    cal = tmp_path / "h100.json"
    params = {**GemmParams().to_json(), "tensor_eff": 0.3, "memory_eff": 0.3}
    cal.write_text(
        json.dumps({"format": "solm-gemm-calibration", "version": 1, "hardware": "h100-sxm", "params": params})
    )
    tp2 = {"tp": 2}
    plain = whatif_data.whatif_run(t, "h100-sxm", "llama-3-8b", 8, 2048, None, tp2)["point"]["e2e_ms_mean"]
    slow = whatif_data.whatif_run(t, "h100-sxm", "llama-3-8b", 8, 2048, None, tp2, str(cal))["point"]["e2e_ms_mean"]
    assert slow > plain


# ---- pages (Streamlit's AppTest, no server) ---------------------------------------------------
pytest.importorskip("streamlit")


def _plain(v):
    """A chart spec with plotly's typed arrays ({"dtype", "bdata"}) decoded to lists."""
    import base64

    if isinstance(v, dict) and "bdata" in v and "dtype" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return [_plain(x) for x in v] if isinstance(v, list) else v


def _charts(at) -> list[dict]:
    import json

    return [_plain(json.loads(c.proto.spec)) for c in at.get("plotly_chart")]


def test_pareto_page_draws_quality_against_memory_beside_latency(app):
    """(Mutant: the right chart drawing latency again.)"""
    app.switch_page("views/pareto.py").run()
    left, right = _charts(app)
    assert left["layout"]["xaxis"]["title"]["text"] == figures.AXIS["e2e_ms_mean"]
    assert right["layout"]["xaxis"]["title"]["text"] == figures.AXIS["peak_kv_bytes"]


def test_timeline_page_shows_the_requests_e2e_and_aligns_kv_with_the_gantt(app):
    """The seq trace's request 0 takes 0.4 s in 12 passes. (Mutants: the e2e metric showing TTFT, the
    KV chart's time range not the Gantt's.)"""
    app.switch_page("views/timeline.py").run()
    labels = app.selectbox(key="timeline_trace").options
    app.selectbox(key="timeline_trace").set_value(next(i for i, lab in enumerate(labels) if lab.endswith("· seq")))
    app.run()
    assert {m.label: m.value for m in app.metric}["e2e"] == "400.0 ms"
    gantt, kv, _ = _charts(app)
    starts = [b + x for t in gantt["data"] for b, x in zip(t["base"], t["x"])]
    assert kv["layout"]["xaxis"]["range"] == pytest.approx([0.0, max(starts)])


def test_whatif_page_draws_memory_measured_ms_and_the_deployments_figures(app):
    """(Mutants: the memory chart drawing latency, the measured latencies in seconds on an ms axis,
    weights per GPU showing the KV pool, the TPOT SLO dropped or not counted as a deployment, max
    sequences not passed on.)"""
    app.switch_page("views/whatif.py").run()
    _, memory, latency = _charts(app)
    assert memory["layout"]["xaxis"]["title"]["text"] == figures.AXIS["peak_kv_bytes"]
    measured = next(t for t in latency["data"] if t["name"] == "sequential measured")
    assert measured["y"] == pytest.approx([400.0, 600.0, 500.0])
    app.number_input(key="whatif_rate").set_value(1000.0).run()
    wide = app.dataframe[0].value["mean_e2el_ms"].copy()
    app.number_input(key="whatif_max_seqs").set_value(1).run()
    narrow = app.dataframe[0].value["mean_e2el_ms"]
    assert (narrow >= wide).all() and (narrow > wide).any()  # one at a time: requests wait
    app.number_input(key="whatif_slo_tpot").set_value(1e5).run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    shown = {m.label: m.value for m in app.metric}
    row = app.dataframe[0].value.iloc[0]
    assert shown["goodput"].endswith("req/s")
    assert shown["weights per GPU"] == f"{row['weight_bytes_per_gpu'] / 2**30:.1f} GiB"
    assert shown["weights per GPU"] != shown["KV pool per GPU"]
