"""Trace format v1: write, read back, validate; atomic per request; corrupt traces fail clearly."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pyarrow.parquet as pq
import pytest

from profiler.reader import TraceError, read_trace
from profiler.schema import BASE_TABLES, CHUNK_NOTE, SCHEMA_VERSION
from profiler.validate import problems, validate
from profiler.writer import TraceWriter


def _rows(rid: int, n_steps: int = 2) -> tuple[dict, list[dict], list[dict], dict]:
    req = {f.name: None for f in BASE_TABLES["requests"]}  # a v1.0 row: the reader fills the minor columns
    req.update(
        request_id=rid,
        prompt=f"p{rid}",
        reference="r",
        prompt_tokens=3,
        output_tokens=n_steps,
        output_text="ab",
        quality_score=0.5,
        arrival_s=0.0,
        start_s=0.0,
        ttft_s=0.1,
        e2e_s=0.2,
        steps=n_steps,
        critical_path_tokens=n_steps,
        theoretical_speedup=1.0,
        peak_live_kv_tokens=4,
        peak_kv_bytes=64,
        status="ok",
        stop_reason="stop_token",
        error="",
        events="[]",
    )
    steps = [
        dict(
            request_id=rid,
            step_index=i,
            batch_index=i,
            phase="prefill" if i == 0 else "decode",
            start_s=0.1 * i,
            duration_s=0.1,
            streams="0",
            active_streams=1,
            query_tokens=3 if i == 0 else 1,
            kv_tokens_read=6,
            live_kv_tokens=3 + i,
            kv_bytes_allocated=64,
            emitted_tokens=1,
            evicted_tokens=0,
            freed_kv_bytes=0,
            device_memory_bytes=-1,
            note="",
        )
        for i in range(n_steps)
    ]
    toks = [
        dict(
            request_id=rid,
            token_index=i,
            token_id=97 + i,
            token_text="ab"[i % 2],
            stream=0,
            step_index=i,
            position_id=3 + i,
            kv_slot=3 + i,
            kind="content",
            visible_streams=[-1, 0],
            evicted_at_step=-1,
        )
        for i in range(n_steps)
    ]
    graph = {
        "directed": True,
        "multigraph": False,
        "graph": {},
        "nodes": [{"id": "prompt"}, {"id": "main:0"}],
        "links": [{"source": "prompt", "target": "main:0"}],
    }
    return req, steps, toks, graph


META = {
    "kind": "measured",
    "system": "sequential",
    "model": {"name": "m"},
    "device": {"name": "cpu"},
    "created_at": "2026-01-01T00:00:00+00:00",
}


def test_roundtrip_equals_what_was_written(tmp_path):
    w = TraceWriter(tmp_path / "t", META)
    written = [_rows(i) for i in range(3)]
    for r in written:
        w.add_request(*r)
    w.set_counters(
        [
            {
                "t_s": 0.0,
                "source": "host",
                "gpu_memory_used_bytes": float("nan"),
                "gpu_utilization_percent": float("nan"),
                "power_w": float("nan"),
                "energy_mj": float("nan"),
                "sm_clock_mhz": float("nan"),
                "temperature_c": float("nan"),
                "cpu_percent": 50.0,
                "rss_bytes": 1e6,
            }
        ]
    )
    w.close()
    t = read_trace(tmp_path / "t")
    assert t.complete and t.meta["schema_version"] == SCHEMA_VERSION and not (tmp_path / "t" / "parts").exists()
    exp_req = pd.DataFrame([r[0] for r in written])
    pd.testing.assert_frame_equal(t.requests[exp_req.columns], exp_req, check_dtype=False)
    exp_steps = pd.DataFrame([s for r in written for s in r[1]])
    pd.testing.assert_frame_equal(t.steps[exp_steps.columns], exp_steps, check_dtype=False)
    assert t.tokens["visible_streams"].map(list).tolist() == [[-1, 0]] * 6
    assert t.graphs[1] == written[1][3]
    assert t.counters["cpu_percent"].tolist() == [50.0]
    assert problems(t) == []


def test_run_cut_short_keeps_finished_requests(tmp_path):
    w = TraceWriter(tmp_path / "t", META)
    w.add_request(*_rows(0))
    w.add_request(*_rows(1))
    # a third request half-written when the run died: its steps landed, its commit marker did not
    (tmp_path / "t" / "parts" / "steps-00000002.parquet").write_bytes(b"garbage")
    t = read_trace(tmp_path / "t")
    assert not t.complete and t.requests["request_id"].tolist() == [0, 1] and len(t.steps) == 4


def test_writer_refuses_to_clobber(tmp_path):
    TraceWriter(tmp_path / "t", META)
    with pytest.raises(FileExistsError):
        TraceWriter(tmp_path / "t", META)
    TraceWriter(tmp_path / "t", META, overwrite=True)


def _complete(tmp_path):
    w = TraceWriter(tmp_path / "t", META)
    w.add_request(*_rows(0))
    return w.close()


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda p: shutil.rmtree(p), "no such directory"),
        (lambda p: (p / "meta.json").unlink(), "no meta.json"),
        (lambda p: (p / "meta.json").write_text("{not json"), "not valid JSON"),
        (lambda p: (p / "meta.json").write_text(json.dumps({**META, "schema_version": 99})), "schema version 99"),
        (lambda p: (p / "steps.parquet").write_bytes((p / "steps.parquet").read_bytes()[:100]), "unreadable Parquet"),
        (
            lambda p: pq.write_table(pq.read_table(p / "requests.parquet").drop(["e2e_s"]), p / "requests.parquet"),
            "missing columns e2e_s",
        ),
        (lambda p: (p / "tokens.parquet").unlink(), "missing tokens.parquet"),
    ],
)
def test_corrupt_traces_raise_one_clear_error(tmp_path, damage, match):
    p = _complete(tmp_path)
    damage(p)
    with pytest.raises(TraceError, match=match):
        read_trace(p)
    assert validate(p) and match.split()[0] in validate(p)[0]


def test_validator_catches_cross_table_problems(tmp_path):
    w = TraceWriter(tmp_path / "t", META)
    req, steps, toks, graph = _rows(0)
    req["output_tokens"] = 5
    w.add_request(req, steps, toks, graph)
    t = read_trace(w.close())
    assert any("output_tokens" in p for p in problems(t))


def _drop(frame: pd.DataFrame, mask) -> pd.DataFrame:
    return frame[~mask].reset_index(drop=True)


def _set(frame: pd.DataFrame, row: int, col: str, value) -> pd.DataFrame:
    frame = frame.copy()
    frame.loc[row, col] = value
    return frame


def _with_link(t, source, target) -> None:
    t.graphs[0]["links"].append({"source": source, "target": target})


def _damage_steps(col: str, value):
    return lambda t: setattr(t, "steps", _set(t.steps, 1, col, value))


VALIDATOR_DAMAGE = {  # one problem each, the validator's words for it
    "requests: duplicate request_id": lambda t: setattr(t, "requests", pd.concat([t.requests, t.requests.iloc[[1]]])),
    "steps: rows for unknown requests [9]": lambda t: setattr(
        t, "steps", pd.concat([t.steps, t.steps.iloc[[0]].assign(request_id=9)], ignore_index=True)
    ),
    "steps: negative kv_tokens_read": lambda t: setattr(t, "steps", _set(t.steps, 0, "kv_tokens_read", -1)),
    # were: valid (inspect --validate), and simulate replayed the trace, exit 0
    **{
        f"steps: negative {col}": _damage_steps(col, -3)
        for col in ("emitted_tokens", "evicted_tokens", "freed_kv_bytes")
    },
    "steps: device_memory_bytes below -1": lambda t: setattr(t, "steps", _set(t.steps, 0, "device_memory_bytes", -2)),
    "request 0: step_index not 0..n-1": lambda t: setattr(t, "steps", _set(t.steps, 1, "step_index", 5)),
    "request 0: no steps": lambda t: setattr(t, "steps", _drop(t.steps, t.steps["request_id"] == 0)),
    "request 0: token rows do not match": lambda t: setattr(t, "tokens", _drop(t.tokens, t.tokens.index == 1)),
    "request 0: ttft_s > e2e_s": lambda t: setattr(t, "requests", _set(t.requests, 0, "ttft_s", 0.7)),
    "requests: e2e_s infinite, negative or missing (or over 1e+15 s) for requests [0]": lambda t: setattr(
        t, "requests", _set(t.requests, 0, "e2e_s", float("nan"))
    ),
    "graph 0: duplicate node ids": lambda t: t.graphs[0]["nodes"].append({"id": "prompt"}),
    "graph 0: node 'prompt': tokens must be an integer >= 0, got True": lambda t: t.graphs[0]["nodes"][0].update(
        tokens=True
    ),
    "graph 0: the dependence graph has a cycle": lambda t: _with_link(t, "main:0", "main:0"),
    # were: read as figures (inspect's "peak KV ... -5 bytes", a negative diff ratio), exit 0
    "requests: negative peak_kv_bytes for requests [1]": lambda t: setattr(
        t, "requests", _set(t.requests, 1, "peak_kv_bytes", -5)
    ),
    "requests: negative prompt_tokens for requests [0]": lambda t: setattr(
        t, "requests", _set(t.requests, 0, "prompt_tokens", -1)
    ),
    "requests: theoretical_speedup infinite or negative for requests [0]": lambda t: setattr(
        t, "requests", _set(t.requests, 0, "theoretical_speedup", -1.0)
    ),
    "requests: theoretical_speedup infinite or negative for requests [1]": lambda t: setattr(
        t, "requests", _set(t.requests, 1, "theoretical_speedup", float("inf"))
    ),
    # was: valid, and inspect printed a geomean speedup of 5.6e18x (one request of 1e300 among 16)
    "requests: theoretical_speedup is not output_tokens / critical_path_tokens for requests [1]": lambda t: setattr(
        t, "requests", _set(t.requests, 1, "theoretical_speedup", 1e300)
    ),
    "steps: streams must be comma-separated stream ids, got 'x'": lambda t: setattr(
        t, "steps", _set(t.steps, 0, "streams", "x")
    ),
    "graph 0: not a directed graph": lambda t: t.graphs[0].update(directed=False),
    "counters: t_s infinite, negative or NaN": lambda t: setattr(t, "counters", pd.DataFrame({"t_s": [float("nan")]})),
}


@pytest.mark.parametrize("needle", sorted(VALIDATOR_DAMAGE))
def test_validator_names_each_problem(tmp_path, needle):
    w = TraceWriter(tmp_path / "t", META)
    for rid in (0, 1):
        w.add_request(*_rows(rid))
    t = read_trace(w.close())
    assert problems(t) == []
    VALIDATOR_DAMAGE[needle](t)
    found = problems(t)
    assert any(p.startswith(needle) for p in found), found


def test_captured_trace_is_valid(small_trace):
    t = read_trace(small_trace)
    assert problems(t) == []
    assert len(t.requests) == 3 and t.meta["counters_source"] == "host" and t.meta["nvml"] is False
    assert t.meta["nvml_reason"]
    assert (t.steps.groupby("request_id").size() == t.requests.set_index("request_id")["steps"]).all()
    assert t.tokens["kv_slot"].ge(-1).all() and set(t.steps["phase"]) == {"prefill", "decode"}
    assert (t.requests["ttft_s"] <= t.requests["e2e_s"]).all()


def test_every_shipped_trace_reads_with_the_minor_columns_filled():
    """Traces written before schema_minor 1 read back with its columns at their defaults."""
    from pathlib import Path

    from profiler.reader import read_trace
    from profiler.schema import MINOR_COLUMNS

    root = Path(__file__).resolve().parents[2] / "traces"
    dirs = [d for d in sorted(root.iterdir()) if (d / "meta.json").exists()]
    assert dirs
    for d in dirs:
        tr = read_trace(d)
        steps = tr.steps if hasattr(tr.steps, "column_names") else None
        cols = steps.column_names if steps is not None else list(tr.steps.columns)
        for f, _ in MINOR_COLUMNS["steps"]:
            assert f.name in cols
        if tr.meta.get("schema_minor", 0) == 0:
            s = tr.steps.to_pandas() if steps is not None else tr.steps
            assert (s["batch_requests"] == 1).all() and (s["batch_query_tokens"] == s["query_tokens"]).all()
            assert (s["attention_kv_tokens"] == s["kv_tokens_read"]).all() and not s["chunk"].any()


# found by a hand mutation round on profiler/validate.py (each entry fails on the mutant named): damage
# that shares a needle with VALIDATOR_DAMAGE, or sits on a boundary the entries above do not reach
MORE_DAMAGE = [
    # tokens rows are checked for unknown requests too, not only steps rows (mutant: steps only)
    (
        "tokens: rows for unknown requests [9]",
        lambda t: setattr(t, "tokens", pd.concat([t.tokens, t.tokens.iloc[[0]].assign(request_id=9)])),
    ),
    # a graph for a request the trace does not have (was: kept, read by nothing, the trace valid)
    ("graph.json: graphs for unknown requests [9]", lambda t: t.graphs.update({9: t.graphs[0]})),
    ("steps: unknown phases ['bogus']", _damage_steps("phase", "bogus")),  # mutant: phase check dropped
    ("tokens: unknown kinds ['bogus']", lambda t: setattr(t, "tokens", _set(t.tokens, 0, "kind", "bogus"))),
    # -1 is allowed on chunk rows only: on a pass it is a negative count (mutant: passes allowed -1 too)
    *((f"steps: negative {col}", _damage_steps(col, -1)) for col in ("live_kv_tokens", "kv_bytes_allocated")),
    *((f"steps: negative {col}", _damage_steps(col, -1)) for col in ("emitted_tokens", "freed_kv_bytes")),
    # a pass computes at least one query row of at least one stream (mutant: < 0 instead of < 1)
    ("steps: 1 passes with query_tokens < 1", _damage_steps("query_tokens", 0)),
    ("steps: 1 passes with active_streams < 1", _damage_steps("active_streams", 0)),
    # steps 1, 1 end at n-1 but do not start at 0 (mutant: the min == 0 test dropped)
    ("request 0: step_index not 0..n-1", lambda t: setattr(t, "steps", _set(t.steps, 0, "step_index", 1))),
]


@pytest.mark.parametrize("needle,damage", MORE_DAMAGE, ids=[n for n, _ in MORE_DAMAGE])
def test_validator_names_more_problems(tmp_path, needle, damage):
    w = TraceWriter(tmp_path / "t", META)
    for rid in (0, 1):
        w.add_request(*_rows(rid))
    t = read_trace(w.close())
    assert problems(t) == []
    damage(t)
    found = problems(t)
    assert any(p.startswith(needle) for p in found), found


def _chunked_rows(rid: int):
    """_rows with a serving capture's prefill-chunk row (runtime.serve_capture.step_rows) before the
    prefill pass: step_index -1, no query rows or streams, -1 for its KV figures."""
    req, steps, toks, graph = _rows(rid)
    chunk = dict(
        steps[0],
        step_index=-1,
        streams="",
        active_streams=0,
        query_tokens=0,
        kv_tokens_read=0,
        live_kv_tokens=-1,
        kv_bytes_allocated=-1,
        emitted_tokens=0,
        note=CHUNK_NOTE,
    )
    return req, [chunk, *steps], toks, graph


def _chunked_trace(tmp_path):
    w = TraceWriter(tmp_path / "t", META)
    for rid in (0, 1):
        w.add_request(*_chunked_rows(rid))
    return read_trace(w.close())


def test_prefill_chunk_rows_are_valid(tmp_path):
    """A chunk row's -1 KV figures, zero query rows and step_index -1 are not problems, and it is not
    counted among the request's passes (mutants: chunk rows read as passes, in the negative-count, the
    query-row or the step_index check)."""
    t = _chunked_trace(tmp_path)
    assert len(t.steps) == 6 and problems(t) == []


@pytest.mark.parametrize("col", ["query_tokens", "kv_tokens_read", "live_kv_tokens", "kv_bytes_allocated"])
def test_a_chunk_row_below_minus_one_is_a_problem(tmp_path, col):
    """-1 marks a chunk row's missing figure; -2 is a negative count (mutant: chunk rows allowed -2)."""
    t = _chunked_trace(tmp_path)
    t.steps = _set(t.steps, 0, col, -2)
    assert f"steps: negative {col}" in problems(t)


def test_a_re_prefill_chunk_after_a_preemption_is_not_back_in_time(tmp_path):
    """A request preempted after its pass 0 is re-prefilled in chunks (rows of step_index -1) before
    its pass 1: the chunk rows come after pass 0 in time. Was: sorted by step_index, the chunk at
    0.05 s went before pass 0 at 0 s, "start_s goes back in time" (every --chunked-prefill capture
    that preempted was refused by inspect --validate, simulate, diff and export)."""
    req, (chunk, *passes), toks, graph = _chunked_rows(0)
    w = TraceWriter(tmp_path / "p", META)
    w.add_request(req, [passes[0], {**chunk, "start_s": 0.05}, passes[1]], toks, graph)
    t = read_trace(w.close())
    assert t.steps["step_index"].tolist() == [0, -1, 1] and t.steps["start_s"].tolist() == [0.0, 0.05, 0.1]
    assert problems(t) == []
    t.steps = t.steps.assign(start_s=[0.1, 0.05, 0.0])  # pass 1 before pass 0: still found
    assert problems(t) == ["steps: start_s goes back in time between passes of requests [0]"]


@pytest.mark.parametrize("streams", ["", "0", "0,1", " -1 , 2 "])
def test_streams_any_comma_separated_integers_are_valid(tmp_path, streams):
    """steps.streams holds what int() reads, signs and spaces included (mutant: the regex's '-?' dropped)."""
    w = TraceWriter(tmp_path / "t", META)
    w.add_request(*_rows(0))
    t = read_trace(w.close())
    t.steps = _set(t.steps, 0, "streams", streams)
    assert problems(t) == []


def test_a_simulated_trace_is_not_held_to_the_measured_step_rules(tmp_path):
    """A simulated trace's steps need not number 0..n-1 nor match requests.steps (its passes are the
    simulator's, not the runtime's count); a measured one must (mutants: the kind test inverted/dropped)."""
    w = TraceWriter(tmp_path / "t", META)
    w.add_request(*_rows(0))
    t = read_trace(w.close())
    t.steps = pd.concat([t.steps, t.steps.iloc[[1]].assign(step_index=7, start_s=0.5)], ignore_index=True)
    measured = problems(t)
    assert "request 0: 3 step rows but steps=2" in measured and "request 0: step_index not 0..n-1" in measured
    t.meta["kind"] = "simulated"
    assert problems(t) == []


def _three_step_trace(tmp_path):
    w = TraceWriter(tmp_path / "t", META)
    w.add_request(*_rows(0, n_steps=3))
    t = read_trace(w.close())
    assert problems(t) == []
    return t


def test_step_indices_must_be_distinct(tmp_path):
    """Steps 0, 2, 2 have n rows, min 0 and max n-1 but are not 0..n-1 (was: valid, the check read count,
    min and max only)."""
    t = _three_step_trace(tmp_path)
    t.steps = _set(t.steps, 1, "step_index", 2)
    assert "request 0: step_index not 0..n-1" in problems(t)


@pytest.mark.parametrize("indices", [[0, 2, 2], [0, 0, 1]])
def test_token_indices_must_be_distinct(tmp_path, indices):
    """Tokens 0, 2, 2 (was: valid) or 0, 0, 1 (mutant: max <= n-1 instead of == n-1)."""
    t = _three_step_trace(tmp_path)
    t.tokens = t.tokens.assign(token_index=indices)
    assert "request 0: token rows do not match output_tokens=3" in problems(t)


def test_a_truncated_request_without_steps_is_a_problem(tmp_path):
    """Only a request that never ran ("error") may have no steps (mutant: only "ok" ones must)."""
    t = _three_step_trace(tmp_path)
    t.requests = _set(t.requests, 0, "status", "truncated")
    assert problems(t) == []
    t.steps = t.steps.iloc[:0]
    assert "request 0: no steps" in problems(t)


def test_a_request_that_never_ran_is_valid(tmp_path):
    """An "error" request: no steps, no token rows for its 0 output tokens, no times (mutants: token rows
    required for 0 output tokens; times required of every request that is not "ok"; the speedup checked
    against output / critical path in a simulated trace)."""
    w = TraceWriter(tmp_path / "t", META)
    w.add_request(*_rows(0))
    req, _, _, graph = _rows(1)
    req.update(status="error", error="boom", output_tokens=0, steps=0, critical_path_tokens=0, output_text="")
    req.update(theoretical_speedup=float("nan"), ttft_s=float("nan"), e2e_s=float("nan"), quality_score=float("nan"))
    w.add_request(req, [], [], graph)
    t = read_trace(w.close())
    assert problems(t) == []


def test_a_request_without_its_graph_is_a_problem(tmp_path):
    """(mutant: the graph check skipped)"""
    t = _three_step_trace(tmp_path)
    del t.graphs[0]
    assert "request 0: no dependence graph" in problems(t)


def test_request_problems_are_listed_request_by_request(tmp_path):
    """The per-request checks run as columns over every request at once; the problems are still
    listed request by request, each request's in the checks' order, values printed as counts."""
    w = TraceWriter(tmp_path / "t", META)
    w.add_request(*_rows(0, n_steps=3))
    w.add_request(*_rows(1, n_steps=3))
    t = read_trace(w.close())
    assert problems(t) == []
    del t.graphs[0], t.graphs[1]
    t.requests = _set(_set(t.requests, 0, "ttft_s", 0.7), 1, "quality_score", 1.5)
    t.steps = _set(t.steps, 1, "step_index", 7)
    assert [p for p in problems(t) if p.startswith("request ")] == [
        "request 0: step_index not 0..n-1",
        "request 0: no dependence graph",
        "request 0: ttft_s > e2e_s",
        "request 1: no dependence graph",
        "request 1: quality_score 1.5 outside 0..1",
    ]
    t.requests = _set(t.requests, 0, "steps", 9)
    assert "request 0: 3 step rows but steps=9" in problems(t)


@pytest.mark.parametrize("q,valid", [(float("nan"), True), (0.0, True), (1.0, True), (1.5, False), (-0.1, False)])
def test_quality_score_is_nan_or_within_zero_to_one(tmp_path, q, valid):
    """NaN (no reference) and both ends are valid (mutants: NaN refused; 1.0 refused)."""
    t = _three_step_trace(tmp_path)
    t.requests = _set(t.requests, 0, "quality_score", q)
    assert (problems(t) == []) is valid, problems(t)


def test_a_truncated_request_cut_before_its_first_token_is_valid(tmp_path):
    """Only an "ok" request must have a TTFT and E2E (mutants: every request but an "error" one must have
    times; ttft_s <= e2e_s asked of every request but an "error" one, where a NaN TTFT fails it)."""
    t = _three_step_trace(tmp_path)
    t.requests = _set(_set(t.requests, 0, "status", "truncated"), 0, "ttft_s", float("nan"))
    assert problems(t) == []


@pytest.mark.parametrize("ttft_above_e2e,valid", [(0.0, True), (1e-12, True), (1e-6, False)])
def test_ttft_may_equal_e2e_within_rounding(tmp_path, ttft_above_e2e, valid):
    """A one-token request's TTFT is its E2E, give or take float rounding (mutants: < for <=; the 1e-9 s
    tolerance dropped)."""
    t = _three_step_trace(tmp_path)
    t.requests = _set(t.requests, 0, "ttft_s", float(t.requests["e2e_s"][0]) + ttft_above_e2e)
    assert (problems(t) == []) is valid, problems(t)


def test_only_a_measured_trace_has_its_speedup_recomputed(tmp_path):
    """A simulated trace keeps its source request's speedup (mutant: held to output / critical path too)."""
    t = _three_step_trace(tmp_path)
    t.requests = _set(t.requests, 0, "theoretical_speedup", 5.0)
    assert any(p.startswith("requests: theoretical_speedup is not") for p in problems(t))
    t.meta["kind"] = "simulated"
    assert problems(t) == []


@pytest.mark.parametrize(
    "col", ["output_tokens", "steps", "critical_path_tokens", "peak_live_kv_tokens", "preemptions", "recompute_tokens"]
)
def test_every_request_count_is_checked(tmp_path, col):
    """(mutant: a column left out of REQUEST_COUNTS)"""
    t = _three_step_trace(tmp_path)
    t.requests = _set(t.requests, 0, col, -1)
    assert f"requests: negative {col} for requests [0]" in problems(t)


@pytest.mark.parametrize(
    "speedup,crit,valid",
    [
        (float("nan"), 3, True),  # no speedup figured (mutant: NaN held to output / critical path)
        (3.0, 0, True),  # output / max(1, critical path) (mutant: / 0, an infinite expected speedup)
        (1.0 + 1e-12, 3, True),
        (1.0 + 1e-6, 3, False),  # mutant: rtol 1e-3
    ],
)
def test_measured_speedup_is_output_over_critical_path(tmp_path, speedup, crit, valid):
    t = _three_step_trace(tmp_path)
    t.requests = _set(_set(t.requests, 0, "theoretical_speedup", speedup), 0, "critical_path_tokens", crit)
    assert (problems(t) == []) is valid, problems(t)


def test_an_infinite_speedup_is_one_problem(tmp_path):
    """(mutant: a measured trace's infinite speedup also reported as not output / critical path)"""
    t = _three_step_trace(tmp_path)
    t.requests = _set(t.requests, 0, "theoretical_speedup", float("inf"))
    assert problems(t) == ["requests: theoretical_speedup infinite or negative for requests [0]"]


TIMING_DAMAGE = [
    # mutant: MAX_TIME_S ten times higher
    ("requests: e2e_s infinite, negative or missing (or over 1e+15 s)", "requests", "e2e_s", 2e15),
    ("steps: 1 rows with start_s infinite, negative or NaN", "steps", "start_s", float("nan")),  # mutants: NaN allowed
    ("steps: 1 rows with duration_s infinite, negative or NaN", "steps", "duration_s", -0.1),  # mutant: not checked
    ("steps: 1 rows with duration_s infinite, negative or NaN", "steps", "duration_s", float("inf")),
    ("steps: start_s goes back in time between passes of requests [0]", "steps", "start_s", 0.05),  # pass 2 < 1
]


@pytest.mark.parametrize("needle,table,col,value", TIMING_DAMAGE)
def test_timing_problems(tmp_path, needle, table, col, value):
    t = _three_step_trace(tmp_path)
    setattr(t, table, _set(getattr(t, table), 2 if table == "steps" else 0, col, value))
    found = problems(t)
    assert any(p.startswith(needle) for p in found), found


def test_infinite_counter_values_are_a_problem(tmp_path):
    """(mutant: the counters' values not checked, only t_s)"""
    t = _three_step_trace(tmp_path)
    t.counters = pd.DataFrame({"t_s": [0.0, 1.0], "source": "host", "cpu_percent": [1.0, float("inf")]})
    assert problems(t) == ["counters: infinite values in cpu_percent"]


def test_steps_rows_in_any_order_are_checked_in_pass_order(tmp_path):
    """Rows not in (request, step) order are sorted before the back-in-time test; passes of different
    requests overlap freely (mutants: no sort; request ids left unsorted; the same-request test dropped)."""
    w = TraceWriter(tmp_path / "t", META)
    for rid in (0, 1, 2):
        w.add_request(*_rows(rid, n_steps=3))
    t = read_trace(w.close())
    t.steps = t.steps.iloc[[4, 0, 8, 2, 6, 1, 3, 7, 5]].reset_index(drop=True)
    assert problems(t) == []
    t.steps = _set(t.steps, 0, "start_s", 0.25)  # request 1's pass 1 now starts after its pass 2
    assert problems(t) == ["steps: start_s goes back in time between passes of requests [1]"]


GRAPH_DAMAGE = {  # mutants of graph_problems, each named
    "not node-link": lambda g: g.update(links=None),  # `and` for `or`
    "a node without an id": lambda g: g["nodes"].append({"tokens": 1}),  # the id test dropped
    "a link without source and target": lambda g: g["links"].append({"source": "prompt"}),  # target not asked
    "link 'prompt' -> 'gone' names a missing node": lambda g: g["links"].append({"source": "prompt", "target": "gone"}),
    "not a directed graph": lambda g: g.pop("directed"),  # `is False` for `is not True`
    "node 'main:0': tokens must be an integer >= 0, got -1": lambda g: g["nodes"][1].update(tokens=-1),
}


@pytest.mark.parametrize("needle", sorted(GRAPH_DAMAGE))
def test_graph_problems(needle):
    from profiler.validate import graph_problems

    g = _rows(0)[3]
    g["nodes"][1]["tokens"] = 0  # a count may be 0 (mutant: > 0)
    assert graph_problems(g) == []
    GRAPH_DAMAGE[needle](g)
    assert any(p.startswith(needle) for p in graph_problems(g)), graph_problems(g)


def test_a_shared_graph_is_checked_once_when_asked(tmp_path):
    """each_once: a graph object several requests share is reported under the first only (the dashboard's
    use); by default under each request (mutants: the skip dropped; each_once inverted)."""
    from profiler.validate import graphs_problems

    w = TraceWriter(tmp_path / "t", META)
    for rid in (0, 1):
        w.add_request(*_rows(rid))
    t = read_trace(w.close())
    t.graphs[0]["directed"] = False
    t.graphs[1] = t.graphs[0]
    assert [p.split(":")[0] for p in graphs_problems(t)] == ["graph 0", "graph 1"]
    assert [p.split(":")[0] for p in graphs_problems(t, each_once=True)] == ["graph 0"]


def test_not_valid_names_the_first_problem_and_counts_the_rest():
    """(mutants: "(and N more" with one problem; N counting the first too)"""
    from profiler.validate import not_valid

    assert not_valid("t", ["a"]) == "t: not a valid trace: a"
    assert not_valid("t", ["a", "b", "c"]) == "t: not a valid trace: a (and 2 more: solm inspect t --validate)"
    assert not_valid("t", ["a", "b"], " in X") == "t: not a valid trace: a (and 1 more in X)"


def test_read_valid_trace_refuses_a_trace_with_one_problem(tmp_path):
    """(mutant: refused only with two or more)"""
    from profiler.validate import read_valid_trace

    w = TraceWriter(tmp_path / "t", META)
    req, steps, toks, graph = _rows(0)
    w.add_request(req, steps, toks, {**graph, "directed": False})
    p = w.close()
    with pytest.raises(
        TraceError, match=r"not a valid trace: graph 0: not a directed graph \(node-link 'directed' must be true\)$"
    ):
        read_valid_trace(p)
    w = TraceWriter(tmp_path / "u", META)
    w.add_request(*_rows(0))
    assert len(read_valid_trace(w.close()).requests) == 1


def test_row_checks_read_every_row_in_any_order(tmp_path):
    """The per-request checks follow each request, not the table's row order, and the unknown
    status and token kind checks read every row, not the first (mutation round on the columnar
    checks: the counts lined up with sorted ids; one output token and no token rows passing; only
    the first row's status or kind read)."""
    w = TraceWriter(tmp_path / "t", META)
    for rid in (0, 1):
        w.add_request(*_rows(rid, n_steps=1))
    t = read_trace(w.close())
    t.requests = t.requests.iloc[::-1]  # request 1 first
    assert problems(t) == []
    t.tokens = _drop(t.tokens, t.tokens["request_id"] == 0)
    assert [p for p in problems(t) if p.startswith("request ")] == ["request 0: no token rows for 1 output tokens"]
    t = read_trace(tmp_path / "t")
    last = len(t.requests) - 1
    t.requests = _set(t.requests, last, "status", "bogus")
    t.tokens = _set(t.tokens, len(t.tokens) - 1, "kind", "bogus")
    assert {"requests: unknown statuses ['bogus']", "tokens: unknown kinds ['bogus']"} <= set(problems(t))
