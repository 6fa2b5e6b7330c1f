from __future__ import annotations

import time

from profiler.counters import CounterSampler
from profiler.recorder import Recorder


class FakeStep:
    def __init__(self, i):
        self.i = i

    def as_row(self):
        return {"step_index": self.i, "emitted_tokens": 1 if self.i > 0 else 0}


def fake_engine(n):
    for i in range(n):
        time.sleep(0.002)
        yield FakeStep(i)
    return "done"


def test_recorder_times_each_step_and_keeps_the_result():
    rec = Recorder().run(fake_engine(4))
    assert rec.result == "done" and len(rec.step_rows) == 4
    assert all(r["duration_s"] >= 0.0015 for r in rec.step_rows)
    starts = [r["start_s"] for r in rec.step_rows]
    assert starts == sorted(starts)
    # the first token came from step 1 (step 0 emitted nothing)
    assert rec.first_token_s == rec.step_rows[1]["start_s"] + rec.step_rows[1]["duration_s"]
    assert rec.end_s >= rec.first_token_s


def _nvml_present() -> bool:
    """Whether NVML starts on this machine, asked directly (not through the code under test)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    finally:
        pynvml.nvmlShutdown()


def test_host_counters_record_reason_and_samples():
    """Host counters (a CPU capture: NVML not used even where present), on any machine."""
    s = CounterSampler(interval_s=0.01, use_nvml=False).start()
    time.sleep(0.08)
    rows = s.stop()
    meta = s.meta()
    assert meta["counters_source"] == "host" and meta["nvml"] is False and meta["nvml_reason"].startswith("CPU capture")
    assert len(rows) >= 3 and all(r["rss_bytes"] > 0 and r["source"] == "host" for r in rows)
    assert [r["t_s"] for r in rows] == sorted(r["t_s"] for r in rows)


def test_default_source_follows_nvml():
    """NVML where it starts (GPU fields filled), else host counters with the reason NVML did not start."""
    s = CounterSampler(interval_s=0.01).start()
    time.sleep(0.08)
    rows = s.stop()
    meta = s.meta()
    assert len(rows) >= 3
    if _nvml_present():
        assert meta["counters_source"] == "nvml" and meta["nvml"] is True and meta["nvml_reason"] == ""
        assert all(r["source"] == "nvml" and r["gpu_memory_used_bytes"] >= 0 for r in rows)  # NaN fails too
    else:
        assert meta["counters_source"] == "host" and meta["nvml"] is False
        assert meta["nvml_reason"].startswith(("NVML unavailable", "pynvml not importable")), meta
        assert all(r["source"] == "host" and r["rss_bytes"] > 0 for r in rows)
