"""Trace diff: zero deltas against itself, the speedup two traces imply, matching, clear refusals."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from profiler.diff import diff_paths, graph_diff, text_diff, text_diffs
from profiler.reader import TraceError, read_trace
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


def test_text_diffs_of_all_pairs_equal_text_diff_of_each(tmp_path):
    """The vectorised identity check gives what `text_diff` gives request by request: outputs equal,
    equal in length but different, of other lengths, and empty; token rows out of order; the
    per-token rows read from the file when the trace was read without them."""
    a = make_trace(tmp_path / "a", e2e_s=[1.0, 1.0, 1.0, 1.0], passes=6)
    b = make_trace(tmp_path / "b", e2e_s=[1.0, 1.0, 1.0, 1.0], threads=[0, 0, 1, 0], passes=6)
    ta, tb = read_trace(a), read_trace(b)
    tok = tb.tokens
    tok.loc[(tok["request_id"] == 1) & (tok["token_index"] == 2), "token_text"] = "X"  # same length, one differs
    tb.tokens = tok[tok["request_id"] != 3].sample(frac=1.0, random_state=0)  # request 3 empty in B; shuffled
    ta.tokens = ta.tokens[ta.tokens["request_id"] != 2]  # request 2: empty in A, 12 tokens in B
    pairs = pd.DataFrame({"a_id": [0, 1, 2, 3], "b_id": [0, 1, 2, 3]})

    def texts(t, rid):
        rows = t.tokens[t.tokens["request_id"] == rid].sort_values("token_index")
        return rows["token_text"].tolist()

    want = {r: text_diff(texts(ta, r), texts(tb, r)) for r in range(4)}
    got = text_diffs(ta, tb, pairs)
    assert got == want
    assert [got[r]["identical"] for r in range(4)] == [True, False, False, False]
    assert got[2]["b_tokens"] == 12 and got[3]["a_tokens"] == 6 and got[3]["b_tokens"] == 0
    assert got[0]["ops"] == [("equal", "".join(texts(ta, 0)), "".join(texts(ta, 0)))]
    lean, full = read_trace(a, tokens=False), read_trace(a)
    assert text_diffs(lean, lean, pairs) == {r: text_diff(texts(full, r), texts(full, r)) for r in range(4)}


# ---- focused checks added by hand-made mutants (each fails on a mutant the tests above let through) ----
def test_figures_users_read_tokens_per_s_and_ratios_of_zeros(tmp_path):
    from profiler.diff import _delta

    a = make_trace(tmp_path / "a", e2e_s=[1.0, 2.0, 3.0], quality=0.0)
    b = make_trace(tmp_path / "b", e2e_s=[0.5, 0.5, 1.0], quality=0.0)
    d = diff_paths(a, b)
    o = d.summary()["overall"]
    tokens_b = float(d.requests["output_tokens_b"].sum())
    assert o["tokens_per_s_b"] == pytest.approx(tokens_b / 2.0)  # B's tokens over B's total latency
    assert d.requests["quality_score_ratio"].tolist() == [1.0, 1.0, 1.0]  # 0 / 0: unchanged, not undefined
    assert _delta(0.0, 0.0) == (0.0, 1.0) and _delta(0.0, 2.0) == (2.0, None) and _delta(4.0, 2.0) == (-2.0, 0.5)


def test_replaced_tokens_count_the_longer_side():
    t = text_diff(list("abcd"), list("aXYZd"))
    assert t["replaced_tokens"] == 3 and t["equal_tokens"] == 2


def test_shared_ids_with_other_prompts_match_by_prompt_and_repeats_pair_in_order(tmp_path):
    p0, p1 = "reverse: abc,de", "reverse: fgh,ij,kl"
    swapped = diff_paths(
        make_trace(tmp_path / "a", e2e_s=[1.0, 2.0], prompts=(p0, p1)),
        make_trace(tmp_path / "b", e2e_s=[1.0, 2.0], prompts=(p1, p0)),
    )
    assert swapped.matched_by == "prompt"
    assert list(zip(swapped.requests["a_id"], swapped.requests["b_id"])) == [(0, 1), (1, 0)]
    repeats = diff_paths(
        make_trace(tmp_path / "ra", e2e_s=[1.0, 2.0], prompts=(p0, p0)),
        make_trace(tmp_path / "rb", e2e_s=[1.0, 2.0], prompts=(p0, p0), first_id=10),
    )
    assert list(zip(repeats.requests["a_id"], repeats.requests["b_id"])) == [(0, 10), (1, 11)]  # k-th with k-th


def test_counter_span_and_unsorted_request_means():
    import numpy as np

    from profiler.diff import _mean_by_request, counter_summary

    counters = pd.DataFrame({"energy_mj": [100.0, 150.0, 400.0], "power_w": [10.0, 20.0, 30.0]})
    assert counter_summary(counters) == {"energy_mj": 300.0, "mean_power_w": 20.0}  # energy: last - first
    means = _mean_by_request(np.array([1, 0, 1, 0]), np.array([1.0, 2.0, 3.0, 6.0]))  # interleaved requests
    assert means.to_dict() == {0: 4.0, 1: 2.0}
