"""profiler/perfetto.py (and profiler/stats.py): tests that kill the mutants a mutation round found
the rest of the suite let through (each test names the mutant it kills: the code as it would be,
mutated). Every stats.py mutant of the round was killed by tests/profiler/test_stats.py. Two perfetto
mutants are equivalent: P13, a batch of the streamed document flushed at `>= batch` for `== batch`
(the pending list grows by one and is emptied on reaching the batch, so never exceeds it); P21, the
KV counters on tid 1 for tid 0 (a Chrome trace's counter events belong to the process; Perfetto and
chrome://tracing ignore their tid)."""

from __future__ import annotations

import numpy as np
import pytest

from profiler.perfetto import to_chrome_trace
from profiler.reader import read_trace
from tests.dashboard.traces import make_trace


@pytest.fixture()
def pasta(tmp_path):
    """2 PASTA-shaped requests (2 and 1 threads), 4 passes each, passes a whole number of microseconds."""
    return read_trace(make_trace(tmp_path / "par", e2e_s=[0.5, 0.5], threads=[2, 1], system="pasta", counters=None))


def _passes(events: list[dict], pid: int | None = None) -> list[dict]:
    return [e for e in events if e["ph"] == "X" and e["cat"] == "step" and (pid is None or e["pid"] == pid)]


def test_times_keep_their_fraction_of_a_microsecond(pasta):
    """A pass starting 1.2345 us past a whole microsecond and lasting 0.25 us more: ts and dur keep
    the nanoseconds (3 decimals of a microsecond), the KV counters at its end too (kills P0: times
    rounded to whole microseconds; the suite's traces start and last whole microseconds only)."""
    pasta.steps = pasta.steps.assign(
        start_s=pasta.steps["start_s"] + 1.2345e-6, duration_s=pasta.steps["duration_s"] + 2.5e-7
    )
    events = to_chrome_trace([pasta])["traceEvents"]
    steps = pasta.steps.sort_values(["request_id", "start_s", "step_index"])
    passes = _passes(events)
    assert [e["ts"] for e in passes] == [round(s * 1e6, 3) for s in steps["start_s"]]
    assert [e["dur"] for e in passes] == [round(d * 1e6, 3) for d in steps["duration_s"]]
    assert all(e["ts"] % 1 for e in passes) and all(e["dur"] % 1 for e in passes)
    ends = [e["ts"] for e in events if e["name"] == "live KV"]
    assert ends == [round((s + d) * 1e6, 3) for s, d in zip(steps["start_s"], steps["duration_s"])]


def test_each_forward_pass_track_sorts_first_in_its_process(pasta):
    """Every request's "forward passes" track (tid 0) carries thread_sort_index 0, so Perfetto shows
    it above the stream tracks (kills P2: the track named without its sort index)."""
    events = to_chrome_trace([pasta])["traceEvents"]
    pids = {e["pid"] for e in _passes(events)}
    sorted_first = {
        e["pid"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_sort_index" and e["tid"] == 0 and e["args"]["sort_index"] == 0
    }
    assert pids == sorted_first == {1, 2}
    streams = {(e["pid"], e["tid"], e["args"]["sort_index"]) for e in events if e["name"] == "thread_sort_index"}
    assert all(sort == tid for _, tid, sort in streams)


def test_a_pass_of_no_stream_in_memory_has_no_stream_events(pasta):
    """A steps table built in memory whose streams cell is missing (NaN, read as "nan") for a pass
    that had no query row: the pass is exported, with no stream event (kills P3: "nan" read as a
    stream id, a ValueError out of the export)."""
    pasta.steps = pasta.steps.astype({"streams": object})
    pasta.steps.loc[pasta.steps.index[0], "streams"] = np.nan
    events = to_chrome_trace([pasta])["traceEvents"]
    assert len(_passes(events)) == len(pasta.steps)
    first = pasta.steps.iloc[0]
    ts = round(first["start_s"] * 1e6, 3)
    assert not [e for e in events if e.get("cat") == "stream" and e["pid"] == 1 and e["ts"] == ts]


def test_a_re_prefill_chunk_stays_in_time_order(pasta):
    """A serving capture's prefill chunk rows have step_index -1 (schema: `chunk`); one that
    re-prefills a preempted request comes late in its run. The request's passes are exported in
    time order, the chunk where it ran (kills P9: sorted by step_index before start time, which
    moved the late chunk to the front)."""
    steps = pasta.steps.copy()
    late = steps.index[(steps["request_id"] == 0) & (steps["step_index"] == 2)][0]
    steps.loc[late, ["step_index", "streams", "note"]] = [-1, "", "prefill chunk"]
    pasta.steps = steps
    passes = _passes(to_chrome_trace([pasta])["traceEvents"], pid=1)
    assert [e["ts"] for e in passes] == sorted(e["ts"] for e in passes)
    assert [e["args"]["step_index"] for e in passes] == [0, 1, -1, 3]


def test_a_pass_without_a_note_carries_none(pasta):
    """`args.note` only on a pass that has one: an empty note (what the writers leave) or a missing
    one adds nothing (kills P16: every pass given a `note: ""`)."""
    pasta.steps = pasta.steps.astype({"note": object})
    pasta.steps.loc[pasta.steps.index[1], "note"] = None
    pasta.steps.loc[pasta.steps.index[2], "note"] = "resumed"
    passes = _passes(to_chrome_trace([pasta])["traceEvents"])
    assert [e["args"]["note"] for e in passes if "note" in e["args"]] == ["resumed"]


def test_request_processes_sort_by_their_pid_and_stream_events_span_the_pass(pasta):
    """Each request's process carries process_sort_index = its pid, so requests show in id order
    (kills P17: the request's sort index dropped; the counters process alone had one); each stream
    event lasts as long as its pass (kills P20: stream events of no duration)."""
    pasta.steps = pasta.steps.assign(duration_s=pasta.steps["duration_s"] + 2.5e-7)
    events = to_chrome_trace([pasta])["traceEvents"]
    sorts = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    assert sorts == {1: 1, 2: 2}
    passes = {(e["pid"], e["ts"]): e["dur"] for e in _passes(events)}
    streams = [e for e in events if e["ph"] == "X" and e["cat"] == "stream"]
    assert len(streams) == sum(len(s.split(",")) for s in pasta.steps["streams"])
    assert all(e["dur"] == passes[e["pid"], e["ts"]] > 0 for e in streams)


def test_processes_are_labelled_with_the_traces_kind_system_and_every_counter_source(tmp_path):
    """A request's process names its trace's kind and system (kills P25: the kind left out, a
    measured and a simulated trace of one system read alike); the counters process names every
    source its samples came from (kills P22: the sources cut to one 4-letter name)."""
    t = read_trace(make_trace(tmp_path / "sim", e2e_s=[0.5], system="pasta", kind="simulated", counters="nvml"))
    t.counters = t.counters.assign(source=["host"] + ["nvml"] * (len(t.counters) - 1))
    names = {e["pid"]: e["args"]["name"] for e in to_chrome_trace([t])["traceEvents"] if e["name"] == "process_name"}
    assert names[1] == "sim [simulated pasta] request 0"
    assert names[0] == "sim [simulated pasta] counters (host,nvml)"


def test_a_missing_note_in_memory_is_no_note(pasta):
    """A steps table built in memory may hold NaN for a missing note (pandas' missing value): no
    `note` is exported for it (was: `note: NaN`, which no JSON reader accepts)."""
    import json

    pasta.steps = pasta.steps.astype({"note": object})
    pasta.steps.loc[pasta.steps.index[0], "note"] = np.nan
    doc = to_chrome_trace([pasta])
    assert not [e for e in _passes(doc["traceEvents"]) if "note" in e["args"]]
    json.loads(json.dumps(doc, allow_nan=False))
