"""dashboard.data: pure pandas, no Streamlit."""

from __future__ import annotations

import pandas as pd
import pytest

from dashboard import data
from profiler.reader import read_trace


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
    g = data.gantt_frame(t, 0)
    # pass 0 is the prefill of stream 0; passes 1..3 carry the main stream and 2 threads
    assert len(g) == 1 + 3 * 3 and set(g["stream"]) == {"stream 0", "stream 1", "stream 2"}
    kv = data.kv_frame(t, 0)
    assert kv["live_kv_tokens"].is_monotonic_increasing and len(kv) == 4
    c = data.counters_frame(read_trace(trace_folder / "seq"), 0)
    assert {"power_w", "cpu_percent"} <= set(c["counter"])


def test_graph_layout_layers_by_dependence(trace_folder):
    t = read_trace(trace_folder / "pasta")
    nodes, edges = data.graph_layout(t.graphs[0])
    x = dict(zip(nodes["id"], nodes["x"]))
    assert x == {"prompt": 0, "main:0": 1, "thread:1": 2, "thread:2": 2, "main:1": 3}
    assert len(edges) == 5


def test_whatif_recost_is_faster_on_a_faster_part(trace_folder):
    t = read_trace(trace_folder / "seq")
    # a real model size: the toy model's microsecond GEMMs are latency-bound, where a higher-clocked
    # small part may legitimately edge out a big one (simulator.gemm: per-tile pipeline fill)
    slow = data.whatif_recost(t, "l4", "llama-3-8b")
    fast = data.whatif_recost(t, "h100-sxm", "llama-3-8b")
    assert (fast["e2e_s"] < slow["e2e_s"]).all() and (fast["ttft_s"] <= fast["e2e_s"]).all()
    p = data.whatif_point(t, fast, "h100-sxm", None, "x")
    assert p["quality"] == pytest.approx(0.6) and p["kind"] == "simulated"


def test_whatif_run_redraws_with_settings(trace_folder):
    t = read_trace(trace_folder / "seq")
    a = data.whatif_run(t, "l4", None, 8, 2048, None)
    b = data.whatif_run(t, "h200", "llama-3-8b", 8, 2048, None)
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
