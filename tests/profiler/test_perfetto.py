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
