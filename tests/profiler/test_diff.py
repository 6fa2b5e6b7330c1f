"""Trace diff: zero deltas against itself, the speedup two traces imply, matching, clear refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from profiler.diff import diff_paths, diff_traces, graph_diff, text_diff, text_diffs
from profiler.reader import TraceError, read_trace
from profiler.validate import problems
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


# ---- a second hand mutation round (kills mutants that survived every test above) ----


def _failed(trace, rid: int):
    """`trace` with request `rid` failed as the server fails one (runtime/server.py `_fail`): no
    pass, no token, an empty graph, quality and TTFT unknown; checked valid."""
    req = trace.requests.copy()
    at = req["request_id"] == rid
    failed = {"output_tokens": 0, "steps": 0, "critical_path_tokens": 0, "peak_live_kv_tokens": 0, "peak_kv_bytes": 0}
    failed |= {"theoretical_speedup": 0.0, "quality_score": math.nan, "ttft_s": math.nan}
    failed |= {"status": "error", "stop_reason": "kv_pool", "output_text": ""}
    for col, v in failed.items():
        req.loc[at, col] = v
    trace.requests = req
    trace.steps = trace.steps[trace.steps["request_id"] != rid].reset_index(drop=True)
    trace.tokens = trace.tokens[trace.tokens["request_id"] != rid].reset_index(drop=True)
    trace.graphs[rid] = {"directed": True, "multigraph": False, "graph": {}, "nodes": [], "links": []}
    assert problems(trace) == []
    return trace


def test_a_request_that_failed_in_b(tmp_path):
    """B's request 2 failed at once: a figure it does not have is None (never NaN: strict JSON), a
    ratio is 0 where B has 0 of what A had, a mean is over the requests that have the figure, its
    whole output is deleted and every chunk removed."""
    a = read_trace(make_trace(tmp_path / "a", e2e_s=[1.0, 2.0, 4.0], passes=4))
    b = _failed(read_trace(make_trace(tmp_path / "b", e2e_s=[1.0, 2.0, 0.0], passes=4)), 2)  # refused at once
    d = diff_traces(a, b)
    s = d.summary()
    json.dumps(s, allow_nan=False)
    r = s["requests"][2]
    assert r["e2e_s"] == {"a": 4.0, "b": 0.0, "delta": -4.0, "ratio": 0.0} and r["speedup"] is None
    assert r["ttft_s"] == {"a": 1.0, "b": None, "delta": None, "ratio": None}
    assert r["steps"] == {"a": 4.0, "b": 0.0, "delta": -4.0, "ratio": 0.0}
    assert r["quality_score"] == {"a": 0.5, "b": None, "delta": None, "ratio": None}
    assert r["attained_parallelism"]["b"] is None and r["mean_live_kv_tokens"]["b"] is None
    m = s["overall"]["metrics"]
    assert m["ttft_s"]["b"] == pytest.approx((0.25 + 0.5) / 2)  # over B's two requests with a first token
    assert m["steps"]["b"] == pytest.approx(8 / 3)  # a failed request ran no pass: 0 of them counts
    assert r["text"]["deleted_tokens"] == 4 and r["text"]["b_tokens"] == 0
    assert r["graph"]["removed"] == ["main:0", "prompt"] and r["graph"]["added"] == []
    assert r["graph"]["edges_removed"] == 1 and r["graph"]["edges_added"] == 0
    assert s["overall"]["text_similarity_mean"] == pytest.approx(2 / 3)  # the mean over requests: 1, 1 and 0


def test_every_request_failed_in_b_and_an_unscored_a(tmp_path):
    """A figure one side lacks altogether (no TTFT in B, no quality in A, no time in B): None, not
    an error."""
    a = read_trace(make_trace(tmp_path / "a", e2e_s=[1.0, 2.0], quality=math.nan))
    b = read_trace(make_trace(tmp_path / "b", e2e_s=[0.0, 0.0]))  # both refused at once
    for rid in (0, 1):
        _failed(b, rid)
    o = diff_traces(a, b).summary()["overall"]
    assert o["speedup"] is None and o["tokens_per_s_b"] is None and o["speedup_geomean"] is None
    assert o["e2e_s_total_b"] == 0.0 and o["tokens_per_s_a"] == pytest.approx(8 / 3)
    assert o["metrics"]["ttft_s"] == {"a": pytest.approx(0.375), "b": None, "delta": None, "ratio": None}
    assert o["metrics"]["quality_score"] == {"a": None, "b": None, "delta": None, "ratio": None}
    a2 = read_trace(make_trace(tmp_path / "a2", e2e_s=[1.0, 2.0], quality=math.nan))
    m = diff_traces(a2, read_trace(make_trace(tmp_path / "b2", e2e_s=[1.0, 2.0]))).summary()["overall"]["metrics"]
    assert m["quality_score"] == {"a": None, "b": 0.5, "delta": None, "ratio": None}


def test_an_unscored_trace_against_itself_is_identical(tmp_path):
    t = make_trace(tmp_path / "t", e2e_s=[1.0, 2.0], quality=math.nan)
    s = diff_paths(t, t).summary()
    assert s["overall"]["metrics"]["quality_score"]["delta"] is None and s["identical"] is True


def test_summary_per_request_figures(tmp_path):
    """Each request of the summary: its id in each trace, every metric's A, B, B - A and B / A, the
    speedup A/B, the text counts without the opcodes."""
    a = make_trace(tmp_path / "a", e2e_s=[1.0, 2.0], passes=4)
    b = make_trace(tmp_path / "b", e2e_s=[0.5, 4.0], threads=[1, 0], passes=4, first_id=10)
    s = diff_paths(a, b).summary()
    assert [(r["a_id"], r["b_id"]) for r in s["requests"]] == [(0, 10), (1, 11)]
    r0, r1 = s["requests"]
    assert r0["e2e_s"] == {"a": 1.0, "b": 0.5, "delta": -0.5, "ratio": 0.5} and r0["speedup"] == 2.0
    assert r1["e2e_s"] == {"a": 2.0, "b": 4.0, "delta": 2.0, "ratio": 2.0} and r1["speedup"] == 0.5
    assert r0["output_tokens"] == {"a": 4.0, "b": 8.0, "delta": 4.0, "ratio": 2.0}
    assert r0["attained_parallelism"] == {"a": 1.0, "b": 2.0, "delta": 1.0, "ratio": 2.0}
    # live KV per pass: prompt + 1 after the prefill, + 1 per stream's token after each decode pass
    assert r0["mean_live_kv_tokens"] == {"a": 7.5, "b": (6 + 8 + 10 + 12) / 4, "delta": 1.5, "ratio": 1.2}
    assert r1["mean_live_kv_tokens"]["a"] == r1["mean_live_kv_tokens"]["b"] == 8.5
    assert r1["graph"]["identical"] and not r0["graph"]["identical"]
    o = s["overall"]
    assert o["tokens_per_s_a"] == pytest.approx(8 / 3) and o["tokens_per_s_b"] == pytest.approx(12 / 4.5)
    assert "ops" not in r0["text"] and r0["text"]["inserted_tokens"] + r0["text"]["replaced_tokens"] > 0


def test_attained_parallelism_is_tokens_per_forward_pass(tmp_path):
    """Output tokens over the forward passes the request took, which may be more than its critical
    path (a preempted request runs some again): 12 tokens of a 3-token critical path in 6 passes."""
    path = make_trace(tmp_path / "a", e2e_s=[1.0], threads=[3], passes=3)
    b = read_trace(path)
    req = b.requests.copy()
    req["steps"], req["theoretical_speedup"], req["e2e_s"] = 6, 4.0, 2.0
    b.requests = req
    again = b.steps.assign(step_index=b.steps["step_index"] + 3, start_s=b.steps["start_s"] + 1.0)
    b.steps = pd.concat([b.steps, again], ignore_index=True)
    assert problems(b) == []
    m = diff_traces(read_trace(path), b).summary()["requests"][0]
    assert m["attained_parallelism"] == {"a": 4.0, "b": 2.0, "delta": -2.0, "ratio": 0.5}
    assert m["theoretical_speedup"] == {"a": 4.0, "b": 4.0, "delta": 0.0, "ratio": 1.0}


def test_json_safe_figures():
    from profiler.diff import _delta, _num

    assert [_num(x) for x in (math.inf, -math.inf, math.nan, None, np.float32(2.5))] == [None, None, None, None, 2.5]
    assert _delta(1.0, math.inf) == (None, None) and _delta(math.nan, 1.0) == (None, None)


def _drop(trace, rid: int):
    """`trace` without request `rid` (as a run of fewer requests), checked valid."""
    trace.requests = trace.requests[trace.requests["request_id"] != rid].reset_index(drop=True)
    trace.steps = trace.steps[trace.steps["request_id"] != rid].reset_index(drop=True)
    trace.tokens = trace.tokens[trace.tokens["request_id"] != rid].reset_index(drop=True)
    del trace.graphs[rid]
    assert problems(trace) == []
    return trace


def test_a_trace_against_part_of_itself_has_the_same_outputs(tmp_path):
    """B: A without its middle request. The outputs both have are the same token for token (A's
    rows of the matched requests are not one run: the unmatched one lies between them)."""
    path = make_trace(tmp_path / "a", e2e_s=[1.0, 1.0, 1.0], passes=5)
    d = diff_traces(read_trace(path), _drop(read_trace(path), 1))
    assert [t["identical"] for t in d.text.values()] == [True, True] and d.identical
    assert d.unmatched_a == [1] and d.unmatched_b == []


def test_matched_by_prompt_with_requests_on_each_side_only(tmp_path):
    """Ids that differ, prompts of A and B overlapping in part: the pairs, in A's id order
    whatever the order of A's rows, and what each side has alone."""
    p0, p1, p2, p3 = "reverse: abc,de", "reverse: fgh,ij,kl", "reverse: mno", "reverse: pq,rs,tu,vw"
    a = read_trace(make_trace(tmp_path / "a", e2e_s=[1.0, 1.0, 1.0], prompts=(p0, p1, p2)))
    a.requests = a.requests.iloc[::-1].reset_index(drop=True)  # rows in another order than the ids
    b = read_trace(make_trace(tmp_path / "b", e2e_s=[1.0, 1.0, 1.0], prompts=(p1, p0, p3), first_id=10))
    d = diff_traces(a, b)
    assert d.matched_by == "prompt"
    assert list(zip(d.requests["a_id"], d.requests["b_id"])) == [(0, 11), (1, 10)]
    assert d.unmatched_a == [2] and d.unmatched_b == [12]


def test_matched_by_id_in_a_id_order_whatever_the_order_of_the_rows(tmp_path):
    """Matching by id lists the pairs in id order, as matching by prompt does, not in the order of
    A's rows."""
    path = make_trace(tmp_path / "a", e2e_s=[1.0, 2.0, 3.0])
    a = read_trace(path)
    a.requests = a.requests.iloc[[2, 0, 1]].reset_index(drop=True)
    d = diff_traces(a, read_trace(path))
    assert d.matched_by == "request_id" and d.requests["a_id"].tolist() == [0, 1, 2]
    assert d.requests["b_id"].tolist() == [0, 1, 2]


def test_shared_ids_with_some_prompts_changed_match_by_prompt(tmp_path):
    p0, p1, p2 = "reverse: abc,de", "reverse: fgh,ij,kl", "reverse: mno"
    d = diff_paths(
        make_trace(tmp_path / "a", e2e_s=[1.0, 1.0, 1.0], prompts=(p0, p1, p2)),
        make_trace(tmp_path / "b", e2e_s=[1.0, 1.0, 1.0], prompts=(p0, p2, p1)),
    )
    assert d.matched_by == "prompt" and list(zip(d.requests["a_id"], d.requests["b_id"])) == [(0, 0), (1, 2), (2, 1)]


def test_token_rows_out_of_order_within_a_request(tmp_path):
    """Token rows sorted by request but not by index within it (and a request of two tokens
    written last first) are read in index order."""
    path = make_trace(tmp_path / "a", e2e_s=[1.0, 1.0], passes=4)
    shuffled = read_trace(path)
    shuffled.tokens = shuffled.tokens.sort_values(["request_id", "token_index"], ascending=[True, False])
    d = diff_traces(read_trace(path), shuffled)
    assert [t["identical"] for t in d.text.values()] == [True, True]
    two = make_trace(tmp_path / "two", e2e_s=[1.0], passes=2)
    backwards = read_trace(two)
    backwards.tokens = backwards.tokens.iloc[::-1].reset_index(drop=True)
    assert diff_traces(read_trace(two), backwards).text[0]["identical"]


def test_a_first_token_that_differs_is_in_its_own_request(tmp_path):
    path = make_trace(tmp_path / "a", e2e_s=[1.0, 1.0, 1.0], passes=4)
    b = read_trace(path)
    tok = b.tokens.copy()
    tok.loc[(tok["request_id"] == 1) & (tok["token_index"] == 0), "token_text"] = "Z"
    b.tokens = tok
    d = diff_traces(read_trace(path), b)
    assert [t["identical"] for t in d.text.values()] == [True, False, True]
    assert d.text[1]["replaced_tokens"] == 1 and d.text[1]["ops"][0] == ("replace", "b", "Z")


def test_two_empty_outputs_are_identical_with_no_opcode(tmp_path):
    path = make_trace(tmp_path / "a", e2e_s=[1.0, 1.0])
    d = diff_traces(_failed(read_trace(path), 1), _failed(read_trace(path), 1))
    assert d.text[1] == text_diff([], []) and d.text[1]["ops"] == [] and d.identical


def test_text_diff_counts_and_opcodes():
    ins = text_diff(list("abc"), list("abXYc"))
    assert (ins["inserted_tokens"], ins["deleted_tokens"], ins["equal_tokens"]) == (2, 0, 3)
    dele = text_diff(list("abXYc"), list("abc"))
    assert (dele["inserted_tokens"], dele["deleted_tokens"], dele["equal_tokens"]) == (0, 2, 3)
    a = list("ab" * 150)
    b = [c if i % 2 else "Z" for i, c in enumerate(a)]  # every other token replaced: 300 opcodes
    many = text_diff(a, b)
    assert len(many["ops"]) == 200 and many["replaced_tokens"] == 150
    long_a = [str(i % 7) for i in range(300)]  # popular tokens in an output of over 200: no junk heuristic
    long_b = long_a[:150] + ["X"] + long_a[151:]
    one = text_diff(long_a, long_b)
    assert one["equal_tokens"] == 299 and one["replaced_tokens"] == 1 and one["similarity"] == pytest.approx(299 / 300)


def test_same_figures_other_output_or_graph_is_not_identical(tmp_path):
    path = make_trace(tmp_path / "a", e2e_s=[1.0, 2.0])
    other_text = read_trace(path)
    other_text.tokens = other_text.tokens.copy()
    other_text.tokens.loc[
        (other_text.tokens["request_id"] == 1) & (other_text.tokens["token_index"] == 0), "token_text"
    ] = "Z"
    d = diff_traces(read_trace(path), other_text)
    assert all(v["delta"] in (0.0, None) for v in d.overall["metrics"].values())
    assert not d.identical and d.summary()["identical"] is False and d.overall["text_identical_requests"] == 1
    other_graph = read_trace(path)
    g = other_graph.graphs[1]
    g["nodes"] = [dict(n, tokens=n["tokens"] + 1) if n["id"] == "main:0" else n for n in g["nodes"]]
    d = diff_traces(read_trace(path), other_graph)
    assert not d.identical and d.overall["graph_identical_requests"] == 1


def test_graph_diff_lists_only_what_changed():
    ga = {
        "nodes": [{"id": "p", "tokens": 3}, {"id": "m", "tokens": 5}, {"id": "x", "tokens": 1}],
        "links": [{"source": "p", "target": "m"}, {"source": "p", "target": "x"}],
    }
    threads = [f"t{i}" for i in range(8)]
    gb = {
        "nodes": [{"id": "p", "tokens": 3}, {"id": "m", "tokens": 6}, {"id": "x", "tokens": 1}]
        + [{"id": t, "tokens": 1} for t in threads],
        "links": [{"source": "p", "target": "m"}, {"source": "p", "target": "x"}]
        + [{"source": t, "target": "x"} for t in threads],
    }
    g = graph_diff(ga, gb)
    assert g["changed_length"] == [{"chunk": "m", "a_tokens": 5, "b_tokens": 6}]
    assert g["changed_dependence"] == [{"chunk": "x", "a_depends_on": ["p"], "b_depends_on": ["p", *threads]}]
    assert (g["a_chunks"], g["b_chunks"], g["a_edges"], g["b_edges"]) == (3, 11, 2, 10)
    assert (g["edges_added"], g["edges_removed"]) == (8, 0) and g["added"] == threads and g["removed"] == []
    as_edges = {"nodes": gb["nodes"], "edges": gb["links"]}  # networkx's node_link_data(edges="edges")
    assert graph_diff(gb, as_edges)["identical"]


def test_requests_sharing_a_graph_are_diffed_against_their_own(tmp_path):
    """A's requests share one graph object (as a simulated trace's structures do); B's differ: each
    request is diffed against its own graph in B."""
    a = read_trace(make_trace(tmp_path / "a", e2e_s=[1.0, 1.0]))
    a.graphs[1] = a.graphs[0]
    b = read_trace(make_trace(tmp_path / "b", e2e_s=[1.0, 1.0]))
    b.graphs[0] = a.graphs[0]
    d = diff_traces(a, b)
    assert d.graphs[0]["identical"] and not d.graphs[1]["identical"]
    assert d.graphs[1]["changed_length"] == [{"chunk": "prompt", "a_tokens": 5, "b_tokens": 6}]
    assert d.overall["graph_identical_requests"] == 1


def test_counter_summaries():
    from profiler.diff import counter_summary

    nan = math.nan
    c = pd.DataFrame(
        {
            "gpu_memory_used_bytes": [nan, nan, nan],  # a host trace: no GPU samples, no GPU figure
            "rss_bytes": [3.0, 9.0, 5.0],  # the peak, not the last sample
            "energy_mj": [nan, 100.0, 400.0],  # the energy between the first and last samples that have it
            "cpu_percent": [10.0, nan, 20.0],
        }
    )
    assert counter_summary(c) == {"peak_rss_bytes": 9.0, "energy_mj": 300.0, "mean_cpu_percent": 15.0}


def test_counters_compared_are_those_both_traces_have(tmp_path):
    gpu = make_trace(tmp_path / "gpu", e2e_s=[1.0, 1.0], counters="nvml")
    host = make_trace(tmp_path / "host", e2e_s=[2.0, 2.0], counters="host")
    d = diff_paths(gpu, host)
    assert set(d.counters) == {"mean_cpu_percent", "peak_rss_bytes"}
    assert d.counters["peak_rss_bytes"] == {
        "a": 3e8 + 4e6,
        "b": 3e8 + 8e6,
        "delta": 4e6,
        "ratio": pytest.approx((3e8 + 8e6) / (3e8 + 4e6)),
    }


def test_an_invalid_trace_is_refused(tmp_path):
    good = make_trace(tmp_path / "good", e2e_s=[1.0])
    bad = make_trace(tmp_path / "bad", e2e_s=[1.0], quality=2.0)
    with pytest.raises(TraceError, match="not a valid trace: request 0: quality_score 2.0 outside 0..1"):
        diff_paths(good, bad)


def test_requests_whose_figures_changed_are_not_identical_whatever_the_means(tmp_path):
    """Was: `identical` (and `solm diff`'s "identical: zero deltas") looked at the means only, so
    two requests that traded latencies (1 s and 2 s in A, 2 s and 1 s in B) made an identical diff.
    A figure only one side has (a quality score B has, A not) is a change too; one neither has is not."""
    traded = diff_paths(make_trace(tmp_path / "a", e2e_s=[1.0, 2.0]), make_trace(tmp_path / "b", e2e_s=[2.0, 1.0]))
    assert traded.overall["metrics"]["e2e_s"]["delta"] == 0.0 and traded.requests["speedup"].tolist() == [0.5, 2.0]
    assert not traded.identical and traded.summary()["identical"] is False
    unscored = make_trace(tmp_path / "unscored", e2e_s=[1.0, 2.0], quality=math.nan)
    assert not diff_paths(unscored, make_trace(tmp_path / "scored", e2e_s=[1.0, 2.0])).identical
    assert diff_paths(unscored, unscored).identical
