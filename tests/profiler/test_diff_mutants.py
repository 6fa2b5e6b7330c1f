"""profiler/diff.py: a third hand mutation round. Each test fails on a mutant every test before it
let through (named in its docstring); hand-made traces of a few requests, each diffed in well under
a second."""

from __future__ import annotations

import json

from profiler.diff import diff_paths, diff_traces, graph_diff
from profiler.reader import read_trace
from profiler.validate import problems
from tests.dashboard.traces import make_trace


def test_each_side_is_described_by_its_model_name_and_request_count(tmp_path):
    """The A/B lines of `solm diff` (summary()["a"], ["b"]): the model's name, not its whole
    meta, and the trace's own request count, unmatched ones included. Kills: "model" the meta
    dict; "requests" a constant."""
    a = make_trace(tmp_path / "a", e2e_s=[1.0, 1.0, 1.0])
    b = make_trace(tmp_path / "b", e2e_s=[1.0, 1.0], system="pasta", kind="simulated")
    s = diff_paths(a, b).summary()
    assert s["a"] == {"trace": str(a), "kind": "measured", "system": "sequential", "model": "tiny-2l", "requests": 3}
    assert s["b"] == {"trace": str(b), "kind": "simulated", "system": "pasta", "model": "tiny-2l", "requests": 2}


def test_a_ratio_beyond_the_floats_is_none_in_strict_json(tmp_path):
    """A request B finished in a subnormal time: its speedup A/B overflows to infinity, which the
    summary gives as None (strict JSON), as it gives NaN; the geomean leaves it out. Kills `_nums`
    blanking NaN only (`~np.isfinite` -> `np.isnan`)."""
    path = make_trace(tmp_path / "a", e2e_s=[1.0, 2.0])
    b = read_trace(path)
    req = b.requests.copy()
    req.loc[req["request_id"] == 0, ["e2e_s", "ttft_s"]] = 1e-320
    b.requests = req
    assert problems(b) == []
    s = diff_traces(read_trace(path), b).summary()
    json.dumps(s, allow_nan=False)
    r0 = s["requests"][0]
    assert r0["speedup"] is None and r0["e2e_s"]["b"] == 1e-320
    assert s["requests"][1]["speedup"] == 1.0 and s["overall"]["speedup_geomean"] == 1.0


def test_changed_chunks_are_listed_in_id_order():
    """Chunks whose length or dependence changed are listed sorted by id (a set's order, which
        changes from run to run with the string hash, was not), and so is what each depends on. Kills
    `common` taken unsorted, and A's predecessors listed unsorted."""
    ids = [f"c{i}" for i in range(10)]
    ga = {"nodes": [{"id": n, "tokens": 1} for n in ids], "links": []}
    gb = {
        "nodes": [{"id": n, "tokens": 2} for n in ids],
        "links": [{"source": "c0", "target": n} for n in ids[1:]],
    }
    g = graph_diff(ga, gb)
    assert [c["chunk"] for c in g["changed_length"]] == ids
    assert [c["chunk"] for c in g["changed_dependence"]] == ids[1:]
    assert all(c["a_depends_on"] == [] and c["b_depends_on"] == ["c0"] for c in g["changed_dependence"])
    fan_in = {"nodes": gb["nodes"], "links": [{"source": n, "target": "c0"} for n in reversed(ids[1:])]}
    (dep,) = graph_diff(ga, fan_in)["changed_dependence"]  # c0 now waits on the nine others
    assert dep == {"chunk": "c0", "a_depends_on": [], "b_depends_on": ids[1:]}
    assert graph_diff(fan_in, ga)["changed_dependence"][0]["a_depends_on"] == ids[1:]
    assert (g["a_edges"], g["b_edges"]) == (0, 9)


def test_counters_are_listed_by_name(tmp_path):
    """`solm diff` prints the counters both traces have in name order, the same in every run (the
    names' set intersection iterates in the string hash's order, which changes from run to run).
    Kills `_counter_diffs` returning them unsorted."""
    a = make_trace(tmp_path / "a", e2e_s=[1.0, 1.0], counters="nvml")
    b = make_trace(tmp_path / "b", e2e_s=[2.0, 2.0], counters="nvml")
    names = list(diff_paths(a, b).counters)
    assert len(names) >= 6 and names == sorted(names)


def test_outputs_matched_by_prompt_are_read_at_b_s_own_ids(tmp_path):
    """Requests matched by prompt under other ids in B: each output is compared with its own
    request's in B (found by B's id), the same outputs identical, others not. Kills B's tokens
    looked up at A's ids (`np.searchsorted(ids_b, a_id)`), which compared A's requests with B's
    first one."""
    a = make_trace(tmp_path / "a", e2e_s=[1.0, 1.0, 1.0], passes=3)
    same = diff_paths(a, make_trace(tmp_path / "b", e2e_s=[1.0, 1.0, 1.0], passes=3, first_id=10))
    assert same.matched_by == "prompt" and same.requests["b_id"].tolist() == [10, 11, 12]
    assert [t["identical"] for t in same.text.values()] == [True, True, True] and same.identical
    p0, p1, p2 = "reverse: abc,de", "reverse: fgh,ij,kl", "reverse: mno"
    swapped = diff_paths(
        a, make_trace(tmp_path / "s", e2e_s=[1.0, 1.0, 1.0], passes=3, prompts=(p1, p0, p2), first_id=10)
    )
    assert swapped.requests["b_id"].tolist() == [11, 10, 12]
    # make_trace's request i writes "abcdefg" from letter i: B's 11 (A's 0's prompt) starts at "b"
    assert [t["identical"] for t in swapped.text.values()] == [False, False, True]
