"""Perfetto export: valid Chrome trace JSON, the required fields, counters equal to the samples."""

from __future__ import annotations

import json
import math

import pytest

from profiler.perfetto import PID_BLOCK, export_perfetto, to_chrome_trace
from profiler.reader import read_trace
from tests.dashboard.traces import make_trace

FIELDS = ("ph", "ts", "dur", "pid", "tid")


@pytest.fixture()
def traces(tmp_path):
    seq = make_trace(tmp_path / "seq", e2e_s=[1.0, 2.0], counters="nvml")
    par = make_trace(tmp_path / "par", e2e_s=[0.5, 0.5], threads=[2, 1], system="pasta", kind="simulated")
    return seq, par


def test_export_is_valid_json_with_required_fields(traces, tmp_path):
    out = tmp_path / "t.json"
    s = export_perfetto([traces[0]], out)
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    assert s["events"] == len(events) and events
    for e in events:
        assert all(k in e for k in FIELDS), e
        assert e["ph"] in ("X", "C", "M")
    complete = [e for e in events if e["ph"] == "X"]
    t = read_trace(traces[0])
    steps = t.steps
    # one event per pass on the "forward passes" track, one per (pass, stream) on stream tracks
    assert sum(e["cat"] == "step" for e in complete) == len(steps)
    assert sum(e["cat"] == "stream" for e in complete) == sum(len(x.split(",")) for x in steps["streams"])
    first = steps.iloc[0]
    ev = next(e for e in complete if e["cat"] == "step")
    assert ev["ts"] == pytest.approx(first["start_s"] * 1e6) and ev["dur"] == pytest.approx(first["duration_s"] * 1e6)
    assert ev["name"] == first["phase"] and ev["pid"] == 1  # request 0 of trace 0


def test_counter_events_match_samples(traces):
    t = read_trace(traces[0])
    events = to_chrome_trace([t])["traceEvents"]
    counters = [e for e in events if e["ph"] == "C" and e["cat"] == "counter"]
    for col in ("power_w", "energy_mj", "gpu_memory_used_bytes", "cpu_percent", "rss_bytes"):
        got = [(e["ts"], e["args"][col]) for e in counters if e["name"] == col]
        want = [(round(ts * 1e6, 3), v) for ts, v in zip(t.counters["t_s"], t.counters[col]) if not math.isnan(v)]
        assert got == want and got, col
    assert len(counters) == int(t.counters.drop(columns=["t_s", "source"]).notna().sum().sum())


def test_several_traces_side_by_side(traces):
    doc = to_chrome_trace([read_trace(p) for p in traces])
    pids = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert {1, 2} <= pids and {PID_BLOCK + 1, PID_BLOCK + 2} <= pids
    kinds = [o["kind"] for o in doc["otherData"]["solm_traces"]]
    assert kinds == ["measured", "simulated"]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"forward passes", "stream 0", "stream 1", "stream 2"} <= names


def test_tracks_counters_and_summary_agree_with_the_steps(traces, tmp_path):
    """Each stream has its own track (never the forward-pass track), the KV counters are sampled at
    each pass's end, notes travel with the pass, passes come in time order whatever the steps
    table's row order, the counters process names its source, and the export's summary counts
    what it wrote."""
    t = read_trace(traces[1])
    t.steps = t.steps.sample(frac=1.0, random_state=0)  # rows out of order
    t.steps.loc[t.steps.index[0], "note"] = "hello"
    events = to_chrome_trace([t])["traceEvents"]
    steps = t.steps.sort_values(["request_id", "start_s", "step_index"])
    for rid, group in steps.groupby("request_id"):
        pid = int(rid) + 1
        passes = [e for e in events if e["pid"] == pid and e["ph"] == "X" and e["cat"] == "step"]
        assert [e["ts"] for e in passes] == [round(s * 1e6, 3) for s in group["start_s"]]
        assert [e["args"]["step_index"] for e in passes] == group["step_index"].tolist()
        ends = [round((a + b) * 1e6, 3) for a, b in zip(group["start_s"], group["duration_s"])]
        for name, col in (("live KV", "live_kv_tokens"), ("KV bytes held", "kv_bytes_allocated")):
            kv = [(e["ts"], e["args"][col]) for e in events if e["pid"] == pid and e["name"] == name]
            assert kv == list(zip(ends, group[col].tolist())), name
        for e in events:
            if e["pid"] == pid and e["ph"] == "X" and e["cat"] == "stream":
                assert e["tid"] == e["args"]["stream"] + 1 != 0
                assert e["args"]["step_index"] == next(x["args"]["step_index"] for x in passes if x["ts"] == e["ts"])
                assert e["name"].endswith(f" s{e['args']['stream']}")
    noted = [e for e in events if e["ph"] == "X" and e["cat"] == "step" and e["args"].get("note") == "hello"]
    assert len(noted) == 1
    sorts = [e for e in events if e["ph"] == "M" and e["name"].endswith("sort_index")]
    assert {e["name"] for e in sorts if e["tid"] == 0 and e["args"]["sort_index"] == e["pid"]} == {"process_sort_index"}

    seq = read_trace(traces[0])
    counters = to_chrome_trace([seq])["traceEvents"]
    name = next(e["args"]["name"] for e in counters if e["ph"] == "M" and e["pid"] == 0 and e["name"] == "process_name")
    assert name.endswith("counters (nvml)")
    out = tmp_path / "both.json"
    s = export_perfetto(list(traces), out)
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    assert s["complete_events"] == sum(e["ph"] == "X" for e in ev) < s["events"] == len(ev)
    both = [seq, read_trace(traces[1])]
    assert s["counter_events"] == sum(int(x.counters.drop(columns=["t_s", "source"]).notna().sum().sum()) for x in both)
    assert s["requests"] == sum(len(x.requests) for x in both) == 4
    assert [o["pid_base"] for o in doc["otherData"]["solm_traces"]] == [0, PID_BLOCK]


def test_the_file_is_the_document_written_in_pieces(traces, tmp_path):
    """The export streams its events to the file in batches; the bytes are json.dumps of the whole
    document, whatever the batch size (one event per piece, a few, all of them at once)."""
    from profiler.perfetto import _document

    ts = [read_trace(p) for p in traces]
    whole = json.dumps(to_chrome_trace(ts), separators=(",", ":"))
    for batch in (1, 3, 10**9):
        counts = dict.fromkeys(("events", "complete_events", "counter_events"), 0)
        assert "".join(_document(ts, counts, batch)) == whole, batch
        assert counts["events"] == len(to_chrome_trace(ts)["traceEvents"])
    out = tmp_path / "both.json"
    export_perfetto(list(traces), out)
    assert out.read_text() == whole


def test_any_request_ids_stay_in_their_own_process_and_block(traces):
    """A request's process is its rank among the trace's ids plus one: ids -1 and 1,500,000 (was:
    -1 landed in the counters process 0, and 1,500,000 in the next trace's block)."""
    seq, par = (read_trace(p) for p in traces)
    new_ids = {0: -1, 1: 1_500_000}
    for frame in ("requests", "steps", "tokens"):
        table = getattr(seq, frame)
        setattr(seq, frame, table.assign(request_id=table["request_id"].map(new_ids)))
    events = to_chrome_trace([seq, par])["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[1].endswith("request -1") and names[2].endswith("request 1500000")
    assert names[0].endswith("counters (nvml)") and names[PID_BLOCK + 1].endswith("request 0")
    steps = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert sorted({e["pid"] for e in steps}) == [1, 2, PID_BLOCK + 1, PID_BLOCK + 2]
    assert sum(e["pid"] == 1 for e in steps) == int((seq.steps["request_id"] == -1).sum())


def test_a_failed_stream_leaves_the_file_as_it_was(tmp_path):
    """write_chunks_atomic: a piece that raises leaves what was at the path, and no temporary file."""
    from profiler.outdir import write_chunks_atomic

    out = tmp_path / "t.json"
    out.write_text("the user's file")

    def pieces():
        yield "partial"
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError, match="disk gone"):
        write_chunks_atomic(out, pieces())
    assert out.read_text() == "the user's file" and [p.name for p in tmp_path.iterdir()] == ["t.json"]
    write_chunks_atomic(out, ["a", b"b", "c"])
    assert out.read_text() == "abc"


def test_a_trace_with_more_requests_than_a_block_is_refused(traces, monkeypatch):
    """Each trace's processes take one block of PID_BLOCK ids (its counters process and one per
    request): a trace with more requests would run into the next trace's block."""
    from profiler import perfetto
    from profiler.errors import UsageError

    t = read_trace(traces[0])  # 2 requests: ids 1 and 2 of a block of 3 fit
    monkeypatch.setattr(perfetto, "PID_BLOCK", 3)
    assert perfetto.to_chrome_trace([t])["traceEvents"]
    monkeypatch.setattr(perfetto, "PID_BLOCK", 2)
    with pytest.raises(UsageError, match="2 requests; an export holds at most 1 per trace"):
        perfetto.to_chrome_trace([t])


def test_rows_are_the_same_read_in_chunks_of_any_size(traces):
    """The steps table is read a chunk of rows at a time; the rows are the same at any chunk size."""
    import numpy as np

    from profiler.perfetto import _rows

    steps = read_trace(traces[1]).steps
    pids = np.arange(len(steps)) + 1
    whole = list(_rows(steps, pids, chunk=10**6))
    assert len(whole) == len(steps) > 2
    for chunk in (1, 2, len(steps) - 1):
        assert list(_rows(steps, pids, chunk=chunk)) == whole, chunk


def test_each_request_names_its_own_tracks_once_and_events_carry_the_pass(traces):
    """Every request's process names each of its tracks exactly once, the stream tracks of every
    request (stream 0 of request 1 as well as of request 0); a pass's event carries its streams
    cell and its exact microseconds; a request's process follows its id's rank whatever the order
    of the requests table's rows (mutation round on the streamed export: tracks named on every
    pass, or only in the first request; streams dropped from args; dur off by a nanosecond; the
    ids not sorted before ranking)."""
    t = read_trace(traces[1])
    t.requests = t.requests.iloc[::-1]
    events = to_chrome_trace([t])["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[1].endswith("request 0") and names[2].endswith("request 1")
    tracks = [(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert len(tracks) == len(set(tracks))
    used = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    assert used <= set(tracks) and {pid for pid, tid in used if tid == 1} == {1, 2}
    steps = t.steps.sort_values(["request_id", "start_s", "step_index"])
    passes = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert [e["args"]["streams"] for e in passes] == steps["streams"].tolist()
    assert [e["dur"] for e in passes] == [round(d * 1e6, 3) for d in steps["duration_s"]]
