"""dashboard.data and dashboard.whatif_data: pure pandas, no Streamlit."""

from __future__ import annotations

import pandas as pd
import pytest

from dashboard import data, figures, whatif_data
from profiler.diff import diff_traces
from profiler.reader import read_trace
from tests.dashboard.traces import make_trace


def test_find_and_load_keep_going_past_a_corrupt_trace(trace_folder):
    dirs = data.find_trace_dirs([trace_folder])
    assert {p.name for p in dirs} == {"seq", "pasta", "seq-h100", "broken"}
    traces, errors = data.load_traces(dirs)
    assert len(traces) == 3 and len(errors) == 1
    assert errors.iloc[0]["path"].endswith("broken") and "not valid JSON" in errors.iloc[0]["error"]
    table = data.overview_table(traces, errors)
    assert table["status"].tolist().count("error") == 1
    assert set(table.loc[table["status"] == "ok", "kind"]) == {"measured", "simulated"}


def test_pareto_front():
    df = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0, 2.5], "y": [0.2, 0.5, 0.4, 0.9, float("nan")]})
    assert data.pareto_front(df, "x", "y").index.tolist() == [0, 1, 3]


def test_timeline_frames(trace_folder):
    t = read_trace(trace_folder / "pasta")
    g = data.gantt_frame(data.request_steps(t, 0))
    # pass 0 is the prefill of stream 0; passes 1..3 carry the main stream and 2 threads
    assert len(g) == 1 + 3 * 3 and set(g["stream"]) == {"stream 0", "stream 1", "stream 2"}
    kv = data.kv_frame(data.request_steps(t, 0))
    assert kv["live_kv_tokens"].is_monotonic_increasing and len(kv) == 4
    seq = read_trace(trace_folder / "seq")
    c = data.counters_frame(seq, data.request_steps(seq, 0))
    assert {"power_w", "cpu_percent"} <= set(c["counter"])


def test_graph_layout_layers_by_dependence(trace_folder):
    t = read_trace(trace_folder / "pasta")
    nodes, edges = data.graph_layout(t.graphs[0])
    x = dict(zip(nodes["id"], nodes["x"]))
    assert x == {"prompt": 0, "main:0": 1, "thread:1": 2, "thread:2": 2, "main:1": 3}
    assert len(edges) == 5


def test_whatif_is_faster_on_a_faster_part(trace_folder):
    t = read_trace(trace_folder / "seq")
    # a real model size: the toy model's microsecond GEMMs are latency-bound, where a higher-clocked
    # small part may legitimately edge out a big one (simulator.gemm: per-tile pipeline fill)
    slow = whatif_data.whatif_run(t, "l4", "llama-3-8b", 8, 2048, None)
    fast = whatif_data.whatif_run(t, "h100-sxm", "llama-3-8b", 8, 2048, None)
    assert fast["point"]["e2e_ms_mean"] < slow["point"]["e2e_ms_mean"]
    reqs = fast["requests"].set_index("request_id").sort_index()
    assert (reqs["e2e_s"] < slow["requests"].set_index("request_id").sort_index()["e2e_s"]).all()
    assert (reqs["ttft_s"] <= reqs["e2e_s"]).all()
    p = fast["point"]
    assert p["quality"] == pytest.approx(0.6) and p["kind"] == "simulated" and p["hardware"] == "h100-sxm"


def test_whatif_run_redraws_with_settings(trace_folder):
    t = read_trace(trace_folder / "seq")
    a = whatif_data.whatif_run(t, "l4", None, 8, 2048, None)
    b = whatif_data.whatif_run(t, "h200", "llama-3-8b", 8, 2048, None)
    assert a["point"]["e2e_ms_mean"] != b["point"]["e2e_ms_mean"]
    assert len(a["requests"]) == 3 and a["engine"]


def test_sweep_tables_become_points(trace_folder):
    files = data.find_sweep_tables([trace_folder])
    assert [f.parent.name for f in files] == ["sweep1"]
    p = data.sweep_points(files)
    assert p["kind"].tolist() == ["sweep", "sweep"]  # the error row is left out
    assert p["label"].tolist() == [
        "sequential on a100-80g (tiny-2l) seqs=8 rate=None",
        "sequential on h100-sxm (tiny-2l) seqs=8 rate=None",
    ]
    assert p["e2e_ms_mean"].tolist() == [12.0, 9.0]


def test_load_keeps_aggregated_columns_and_reads_the_rest_when_shown(trace_folder):
    """The dashboard holds requests and two steps columns; a page reads one request's steps or
    the token texts when it shows them, and gets what a full read has."""
    lean, _ = data.load_traces(data.find_trace_dirs([trace_folder]))
    full = [read_trace(t.path) for t in lean]
    for t, f in zip(lean, full):
        assert list(t.steps.columns) == list(data.STEPS_LOADED) and not t.tokens_loaded and len(t.tokens) == 0
        for rid in data.request_ids(t):
            assert data.request_steps(t, rid).equals(data.request_steps(f, rid))
    assert data.overview_table(lean, pd.DataFrame()).equals(data.overview_table(full, pd.DataFrame()))
    assert data.pareto_points(lean).equals(data.pareto_points(full))
    by_name = {t.name: t for t in lean}
    d = diff_traces(by_name["seq"], by_name["pasta"])  # token texts read now, from the files
    want = diff_traces(*(f for name in ("seq", "pasta") for f in full if f.name == name))
    assert d.text == want.text
    # the same letters in both; requests 0 and 1 are 12 tokens long in both, request 2 is 12 vs 8
    assert [d.text[r]["identical"] for r in (0, 1, 2)] == [True, True, False] and d.text[2]["b_tokens"] == 8
    assert not by_name["seq"].tokens_loaded  # read for the diff, not kept in the trace


def test_latency_figure_draws_means_of_consecutive_requests_past_max_bars():
    n = 3 * (figures.MAX_BARS - 1)  # 3 requests a bar
    df = pd.DataFrame({"request_id": range(n), "e2e_ms": [float(i) for i in range(n)], "series": "A"})
    fig = figures.latency_figure(df)
    bar = fig.data[0]
    assert len(bar.x) == n // 3 and bar.x[0] == "0-2" and bar.x[-1] == f"{n - 3}-{n - 1}"
    assert list(bar.y[:2]) == [1.0, 4.0] and list(bar.customdata[:2]) == [2.0, 5.0]  # means; largest on hover
    assert "mean of 3" in fig.layout.title.text
    small = figures.latency_figure(df.head(5))
    assert list(small.data[0].x) == ["0", "1", "2", "3", "4"] and "mean" not in small.layout.title.text


def test_a_gpu_capture_folder_is_found_as_its_traces(tmp_path):
    """bench/gpu_capture.py's folder (meta.json of kind gpu_capture over one trace per system, and
    reference/ traces below): its traces are rows, at the folder's own depth, not the folder
    itself as an unreadable trace (the shipped traces/gpu-h200 showed two error rows and none of
    their eight traces)."""
    import json

    cap = tmp_path / "gpu" / "llama"
    make_trace(cap / "sequential", e2e_s=[0.1])
    make_trace(cap / "pasta", e2e_s=[0.1], system="pasta", threads=[2])
    make_trace(cap / "reference" / "pasta", e2e_s=[0.1], system="pasta", threads=[2])
    (cap / "meta.json").write_text(json.dumps({"kind": "gpu_capture", "systems": {}}))
    found = [p.relative_to(tmp_path.resolve()).as_posix() for p in data.find_trace_dirs([tmp_path], depth=2)]
    assert found == ["gpu/llama/pasta", "gpu/llama/sequential"]  # reference/ is one level deeper
    found = [p.relative_to(cap.resolve()).as_posix() for p in data.find_trace_dirs([cap], depth=2)]
    assert found == ["pasta", "reference/pasta", "sequential"]
    lean, errors = data.load_traces(data.find_trace_dirs([tmp_path], depth=2))
    assert errors.empty and len(lean) == 2
    (cap / "meta.json").write_text(json.dumps({"kind": "measured"}))  # a trace's meta: the folder is a row
    assert [p.name for p in data.find_trace_dirs([tmp_path], depth=2)] == ["llama"]
