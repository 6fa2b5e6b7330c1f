"""Trace diff: zero deltas against itself, the speedup two traces imply, matching, clear refusals."""

from __future__ import annotations

import json
import math

import pytest

from profiler.diff import diff_paths, graph_diff, text_diff
from profiler.reader import TraceError
from tests.dashboard.traces import make_trace


def _deltas(summary: dict) -> list:
    out = [m["delta"] for m in summary["overall"]["metrics"].values()]
    for r in summary["requests"]:
        out += [r[m]["delta"] for m in r if isinstance(r[m], dict) and "delta" in r[m]]
    out += [c["delta"] for c in summary["counters"].values()]
    return out


def test_self_diff_of_a_capture_is_zero(small_trace):
    s = diff_paths(small_trace, small_trace).summary()
    assert s["identical"] is True and s["matched"] == 3 and s["matched_by"] == "request_id"
    assert all(d in (0.0, None) for d in _deltas(s))
    assert s["overall"]["speedup"] == pytest.approx(1.0)
    assert all(r["text"]["identical"] and r["graph"]["identical"] for r in s["requests"])
    json.dumps(s)  # JSON-safe throughout (NaN became None)


def test_sequential_vs_parallel_reports_the_implied_speedup(tmp_path):
    seq = make_trace(tmp_path / "seq", e2e_s=[1.0, 2.0, 3.0], passes=12, counters="nvml")
    par = make_trace(
        tmp_path / "par", e2e_s=[0.5, 0.5, 1.0], threads=[2, 2, 1], system="pasta", passes=4, counters="nvml"
    )
    d = diff_paths(seq, par)
    o = d.summary()["overall"]
    assert o["speedup"] == pytest.approx(6.0 / 2.0)
    assert o["speedup_geomean"] == pytest.approx((2.0 * 4.0 * 3.0) ** (1 / 3))
    assert d.requests["speedup"].tolist() == pytest.approx([2.0, 4.0, 3.0])
    m = o["metrics"]
    assert m["steps"]["a"] == 12 and m["steps"]["b"] == 4 and m["steps"]["ratio"] == pytest.approx(1 / 3)
    assert m["attained_parallelism"]["b"] == pytest.approx((3 + 3 + 2) / 3)
    assert m["theoretical_speedup"]["delta"] == pytest.approx((3 + 3 + 2) / 3 - 1)
    g = d.graphs[0]
    assert g["added"] == ["main:1", "thread:1", "thread:2"] and g["removed"] == []
    assert g["changed_length"][0]["chunk"] == "main:0" and not g["identical"]
    assert {"mean_power_w", "energy_mj", "peak_gpu_memory_used_bytes"} <= set(d.counters)
    assert d.counters["energy_mj"]["a"] == pytest.approx(50_000.0 * 12)  # 6 s of samples every 0.5 s
    assert not d.identical


def test_requests_matched_by_prompt_when_ids_differ(tmp_path):
    a = make_trace(tmp_path / "a", e2e_s=[1.0, 2.0])
    b = make_trace(tmp_path / "b", e2e_s=[2.0, 1.0], prompts=("reverse: fgh,ij,kl", "reverse: abc,de"), first_id=10)
    d = diff_paths(a, b)
    assert d.matched_by == "prompt"
    assert list(zip(d.requests["a_id"], d.requests["b_id"])) == [(0, 11), (1, 10)]


def test_partial_overlap_lists_the_unmatched(tmp_path):
    a = make_trace(tmp_path / "a", e2e_s=[1.0, 1.0, 1.0])
    b = make_trace(tmp_path / "b", e2e_s=[1.0, 1.0])
    s = diff_paths(a, b).summary()
    assert s["matched"] == 2 and s["unmatched_a"] == [2] and s["unmatched_b"] == []


def test_no_overlap_is_a_clear_error(tmp_path):
    a = make_trace(tmp_path / "a", e2e_s=[1.0])
    b = make_trace(tmp_path / "b", e2e_s=[1.0], prompts=("something else",), first_id=5)
    with pytest.raises(TraceError, match="no requests in common"):
        diff_paths(a, b)


def test_different_schema_versions_are_named(tmp_path):
    a = make_trace(tmp_path / "a", e2e_s=[1.0])
    b = make_trace(tmp_path / "b", e2e_s=[1.0], schema_version=2)
    with pytest.raises(TraceError, match=r"different schema versions: .*a is v1, .*b is v2"):
        diff_paths(a, b)


def test_text_and_graph_diff_units():
    t = text_diff(list("abcd"), list("abXd"))
    assert t["equal_tokens"] == 3 and t["replaced_tokens"] == 1 and not t["identical"]
    assert ("replace", "c", "X") in t["ops"] and math.isclose(t["similarity"], 0.75)
    ga = {"nodes": [{"id": "p", "tokens": 3}, {"id": "m", "tokens": 5}], "links": [{"source": "p", "target": "m"}]}
    gb = {
        "nodes": [{"id": "p", "tokens": 3}, {"id": "m", "tokens": 5}, {"id": "t", "tokens": 2}],
        "links": [{"source": "t", "target": "m"}],
    }
    g = graph_diff(ga, gb)
    assert g["added"] == ["t"] and g["changed_dependence"] == [
        {"chunk": "m", "a_depends_on": ["p"], "b_depends_on": ["t"]}
    ]
    assert g["edges_added"] == 1 and g["edges_removed"] == 1
