from __future__ import annotations

import time

import pytest

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


class FakeNVML:
    """A stand-in `pynvml`: a 1 GB, 200 W device; energy counter (mJ) only if `energy`."""

    class NVMLError(Exception):
        pass

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self, energy: bool) -> None:
        self.energy, self.total_mj, self.shut = energy, 5_000_000.0, 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("Mem", (), {"used": 10**9})()

    def nvmlDeviceGetUtilizationRates(self, h):
        return type("Util", (), {"gpu": 50})()

    def nvmlDeviceGetPowerUsage(self, h):
        return 200_000  # mW

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1500

    def nvmlDeviceGetTemperature(self, h, kind):
        return 60

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.energy:
            raise self.NVMLError("not supported")
        self.total_mj += 1000.0
        return self.total_mj


def test_nvml_counters_from_a_fake_device(monkeypatch):
    """The NVML path without a GPU: units (W, bytes), energy relative to the first sample, and
    where the energy counter is unsupported, power integrated over the samples' times (mJ)."""
    import math
    import sys

    for energy in (True, False):
        fake = FakeNVML(energy)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        s = CounterSampler(interval_s=1.0, origin=0.0)
        assert s.meta()["counters_source"] == "nvml" and s.meta()["nvml"] is True
        for _ in range(3):
            s.rows.append(s.sample_once())
        rows = s.stop()
        assert fake.shut == 1 and len(rows) == 4  # the final sample at stop, then NVML shut down
        assert all(r["power_w"] == 200.0 and r["gpu_memory_used_bytes"] == 1e9 for r in rows)
        assert all(math.isnan(r["cpu_percent"]) for r in rows)
        energy_mj = [r["energy_mj"] for r in rows]
        if energy:
            assert energy_mj == [0.0, 1000.0, 2000.0, 3000.0]
        else:
            want = [200.0 * (r["t_s"] - rows[0]["t_s"]) * 1000.0 for r in rows]
            assert energy_mj == pytest.approx(want) and energy_mj[-1] > 0
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(True))
    cpu = CounterSampler(use_nvml=False)
    assert cpu.source == "host" and sys.modules["pynvml"].shut == 1  # NVML present, not used: shut down
    with pytest.raises(ValueError, match="interval"):
        CounterSampler(interval_s=0.0)


def test_an_interval_beyond_threadings_longest_wait_keeps_the_sampler_alive(monkeypatch):
    """Was: `capture --counters-hz 1e-300` (an interval of 1e300 s): the sampler thread died of an
    OverflowError in Event.wait after its first row, a traceback on stderr, the capture exit 0."""
    import threading

    died: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    s = CounterSampler(interval_s=1e300, use_nvml=False).start()
    while not s.rows:  # the first sample taken: the thread waits next (or dies)
        time.sleep(0.01)
    s._thread.join(timeout=1)  # the buggy thread dies at once; a sound one is still waiting
    alive = s._thread.is_alive()
    s.stop()
    assert died == [] and alive


@pytest.mark.parametrize("interval", [0.0, -1.0, float("inf"), float("nan")])
def test_an_interval_that_is_not_a_positive_finite_number_is_refused(interval):
    with pytest.raises(ValueError, match="finite number > 0"):
        CounterSampler(interval_s=interval, use_nvml=False)
