"""dashboard/data.py's finding, labelling and table helpers, each test killing mutants a mutation
round on it left alive (named in the docstrings)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from dashboard import data
from profiler.reader import read_trace
from profiler.summary import summarize
from tests.dashboard.traces import make_trace


def test_traces_are_found_to_the_depth_asked_and_not_inside_hidden_folders_or_other_traces(tmp_path):
    """Depth 2 finds root/a/b but not root/a/b/c; a trace's own subfolders are not searched (a
    trace inside a trace is not another row) and hidden folders are skipped. (Mutants: the depth
    test off by one, hidden folders walked, the walk descending into a trace.)"""
    make_trace(tmp_path / "a" / "b", e2e_s=[0.1])
    make_trace(tmp_path / "x" / "y" / "z", e2e_s=[0.1])  # one level too deep
    make_trace(tmp_path / ".cache" / "t", e2e_s=[0.1])
    make_trace(tmp_path / "a" / "b" / "inner", e2e_s=[0.1])
    found = data.find_trace_dirs([tmp_path], depth=2)
    assert [p.relative_to(tmp_path.resolve()).as_posix() for p in found] == ["a/b"]
    assert len(data.find_trace_dirs([tmp_path], depth=3)) == 2  # x/y/z, and still not a/b/inner


def test_a_folder_that_loops_holds_no_traces_rather_than_a_problem(tmp_path):
    """A symlink loop is a folder that cannot be opened (ELOOP): no problem line, as a missing one.
    (Mutant: only ENOENT and ENOTDIR taken as "holds no traces".)"""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert data.path_problem(str(tmp_path / "loop" / "x")) is None
    assert data.path_problem(str(tmp_path / "missing")) is None
    assert data.path_problem("a\0b") == "not a path (it holds a NUL byte)"


def test_folders_outside_the_allowed_ones_are_returned_as_refused(tmp_path):
    """(Mutant: the refused list always empty, so the sidebar never says which folders it dropped.)"""
    inside, outside = tmp_path / "in", tmp_path / "out"
    assert data.split_allowed([str(inside / "t"), str(outside)], [str(inside)]) == ([str(inside / "t")], [str(outside)])
    assert data.split_allowed([str(outside)], None) == ([str(outside)], [])


def test_the_cache_key_changes_when_a_trace_is_rewritten(tmp_path):
    """(Mutant: the key without meta.json's modification time: a rewritten trace kept its old pages.)"""
    make_trace(tmp_path / "t", e2e_s=[0.1])
    before = data.signature([tmp_path / "t"])
    meta = tmp_path / "t" / "meta.json"
    st = meta.stat()
    os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert data.signature([tmp_path / "t"]) != before
    assert data.signature([tmp_path / "gone"]) == ((str(tmp_path / "gone"), 0),)


def test_knobs_label_is_sorted_comma_separated_without_sampling_settings():
    """(Mutants: max_tokens shown, knobs in insertion order, joined by spaces.)"""
    meta = {"knobs": {"threads": 4, "max_tokens": 64, "budget": 2, "temperature": 0.7, "nested": {"a": 1}}}
    assert data.knobs_label(meta) == "budget=2,threads=4"
    assert data.knobs_label({}) == ""


@pytest.fixture()
def trace(tmp_path):
    make_trace(tmp_path / "run", e2e_s=[0.2, 0.3, 0.2], threads=[2, 2, 1], system="pasta", passes=4)
    return read_trace(tmp_path / "run")


def test_hardware_label_prefers_the_simulated_part(trace):
    """A simulated trace is labelled by the part it was replayed on, given as a name or a spec; a
    measured one by its device. (Mutant: the simulation's part ignored.)"""
    for hw in ("b200", {"name": "b200", "num_sms": 148}):
        simulated = dataclasses.replace(trace, meta={**trace.meta, "simulation": {"hardware": hw}})
        assert data.hardware_label(simulated) == "b200"
    measured = dataclasses.replace(trace, meta={**trace.meta, "device": {"name": "cpu-x"}})
    assert data.hardware_label(measured) == "cpu-x"


def test_labels_tell_apart_traces_of_one_folder_name(trace):
    """Two traces named `run` in folders a and b are labelled a/run and b/run; the same trace twice
    gets a number each. (Mutants: the parent folders never added; labels left equal.)"""
    a = dataclasses.replace(trace, path=Path("/x/a/run"))
    b = dataclasses.replace(trace, path=Path("/x/b/run"))
    la, lb = data.trace_labels([a, b])
    assert la.endswith("· a/run") and lb.endswith("· b/run")
    twice = data.trace_labels([a, a])
    assert len(set(twice)) == 2 and twice[0].endswith("(0)") and twice[1].endswith("(1)")


def test_overview_and_pareto_figures_are_the_summary_s_in_ms(trace):
    """Latencies 0.2, 0.3, 0.2 s: the p50 (200 ms) is not the mean (233 ms); the TTFT in ms; an
    incomplete trace says so. (Mutants: the overview's p50 from the mean, the Pareto TTFT left in
    seconds, every trace "ok".)"""
    s = summarize(trace)
    row = data.overview_table([trace], data.pd.DataFrame()).iloc[0]
    assert row["status"] == "ok" and row["e2e_ms_p50"] == pytest.approx(200.0)
    point = data.pareto_points([trace]).iloc[0]
    assert point["ttft_ms_p50"] == pytest.approx(s["ttft_s_p50"] * 1e3) and s["ttft_s_p50"] * 1e3 > 1
    partial = dataclasses.replace(trace, complete=False)
    assert data.overview_table([partial], data.pd.DataFrame()).iloc[0]["status"] == "incomplete"


def test_identical_points_are_one_point_of_the_front():
    """Two runs with the same figures: one point of the front, the first. (Mutant: both kept.)"""
    df = data.pd.DataFrame({"x": [1.0, 1.0, 2.0], "y": [0.5, 0.5, 0.4]})
    assert data.pareto_front(df, "x", "y").index.tolist() == [0]


def test_sweep_tables_are_found_at_every_level_to_the_depth(tmp_path):
    """A sweep table at the root, one and two levels down, not three. (Mutant: one level only.)"""
    for sub in ("", "a", "a/b", "a/b/c"):
        folder = tmp_path / sub
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "sweep.parquet").write_bytes(b"")
    found = data.find_sweep_tables([tmp_path], depth=2)
    assert [p.parent.relative_to(tmp_path.resolve()).as_posix() for p in found] == [".", "a", "a/b"]


def test_sweep_points_take_the_median_latency_and_output_throughput(trace_folder):
    """The fixture's sweep table: finished rows' p50 latency from median_e2el_ms (11, 8), not the
    mean (12, 9), and tokens/s from output_throughput. (Mutants: the p50 from the mean, the token
    rate from total_token_throughput, absent there.)"""
    points = data.sweep_points(data.find_sweep_tables([trace_folder]))
    assert points["e2e_ms_p50"].tolist() == [11.0, 8.0] and points["e2e_ms_mean"].tolist() == [12.0, 9.0]
    assert points["tokens_per_s"].tolist() == [900.0, 1200.0]


STEPS = data.pd.DataFrame(  # a request's passes, the later one first
    {
        "step_index": [1, 0],
        "phase": ["decode", "prefill"],
        "start_s": [0.2, 0.0],
        "duration_s": [0.1, 0.15],
        "streams": ["0,1", "0"],
        "query_tokens": [2, 5],
        "live_kv_tokens": [7, 5],
        "kv_bytes_allocated": [4096, 4096],
        "evicted_tokens": [0, 0],
    }
)


def test_timeline_bars_and_kv_points_end_where_their_passes_end():
    """(Mutants: a bar's end at its start, the KV sampled at a pass's start, the KV points in the
    given order rather than by time.)"""
    g = data.gantt_frame(STEPS)
    assert g["end_ms"].tolist() == pytest.approx([300.0, 300.0, 150.0])
    assert g["stream"].tolist() == ["stream 0", "stream 1", "stream 0"]
    kv = data.kv_frame(STEPS)
    assert kv["t_ms"].tolist() == pytest.approx([150.0, 300.0]) and kv["live_kv_tokens"].tolist() == [5, 7]


def test_counters_of_a_request_are_its_window_padded_without_gaps(trace):
    """A request from 1.0 to 2.0 s: samples within 0.1 s of it (the window's tenth), the NaN ones
    left out. (Mutants: no padding, the 2.05 s sample lost; NaN samples kept as values.)"""
    counters = data.pd.DataFrame(
        {
            "t_s": [0.0, 1.0, 2.05, 10.0],
            "power_w": [100.0, float("nan"), 120.0, 130.0],
            "cpu_percent": [float("nan")] * 4,
        }
    )
    steps = data.pd.DataFrame({"start_s": [1.0], "duration_s": [1.0]})
    c = data.counters_frame(dataclasses.replace(trace, counters=counters), steps)
    assert c[["t_ms", "counter", "value"]].values.tolist() == [[2050.0, "power_w", 120.0]]


def test_graph_layout_centres_each_layer_by_stream_and_lays_a_cycle_out_in_a_line():
    """(Mutants: a layer's nodes from y = 0 up, not centred; their order as the graph lists them, not
    by stream; a cyclic graph's nodes all in one layer.) These graphs do not say "multigraph", which
    solm's validation does not ask for: was a ValueError (networkx then reads a multigraph)."""
    graph = {
        "directed": True,
        "nodes": [
            {"id": "p", "kind": "prompt", "stream": -1},
            {"id": "t2", "kind": "async", "stream": 2},
            {"id": "t1", "kind": "async", "stream": 1},
        ],
        "links": [{"source": "p", "target": "t2"}, {"source": "p", "target": "t1"}],
    }
    nodes, _ = data.graph_layout(graph)
    assert dict(zip(nodes["id"], zip(nodes["x"], nodes["y"]))) == {"p": (0, 0.0), "t1": (1, -0.5), "t2": (1, 0.5)}
    cycle = {
        "directed": True,
        "nodes": [{"id": "a"}, {"id": "b"}],
        "links": [{"source": "a", "target": "b"}, {"source": "b", "target": "a"}],
    }
    nodes, edges = data.graph_layout(cycle)
    assert nodes["x"].tolist() == [0, 1] and len(edges) == 2


def test_diff_tables_show_each_side_and_each_graph_change(trace_folder):
    """PASTA against sequential: B's latencies are B's; the graphs differ; the threads are removed
    chunks and main:0's length is A's -> B's. (Mutants: B's column from A's, every graph identical,
    removed chunks not listed, the lengths swapped.)"""
    from profiler.diff import diff_traces

    d = diff_traces(read_trace(trace_folder / "pasta"), read_trace(trace_folder / "seq"))
    table = data.diff_requests_table(d)
    assert table["e2e_ms_b"].tolist() == pytest.approx([400.0, 600.0, 500.0])
    assert table["e2e_ms_a"].tolist() == pytest.approx([200.0, 300.0, 200.0])
    assert not table["graph_identical"].any()
    rows = data.diff_graph_rows(d, 0)
    assert {"thread:1", "thread:2"} <= set(rows.loc[rows["change"] == "removed", "chunk"])
    (length,) = [c for c in d.graphs[0]["changed_length"] if c["chunk"] == "main:0"]
    assert length["a_tokens"] < length["b_tokens"]
    detail = rows.loc[(rows["change"] == "length") & (rows["chunk"] == "main:0"), "detail"].tolist()
    assert detail == [f"{length['a_tokens']} -> {length['b_tokens']} tokens"]


def test_overview_names_how_a_measured_traces_attention_ran(trace):
    """The attention strategy a measured trace recorded (runtime/attention.py), `auto` for one
    captured before it was recorded; a simulated trace ran no attention kernel."""
    plain = dataclasses.replace(trace, meta={**trace.meta, "device": {"name": "cpu-x"}})
    efficient = dataclasses.replace(trace, meta={**trace.meta, "device": {"name": "gpu", "sdpa": "efficient"}})
    simulated = dataclasses.replace(trace, meta={**trace.meta, "kind": "simulated"})
    rows = data.overview_table([plain, efficient, simulated], data.pd.DataFrame())
    assert rows["attention"].tolist() == ["auto", "efficient", ""]
    assert rows.columns.tolist().index("attention") == rows.columns.tolist().index("device") + 1
