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
