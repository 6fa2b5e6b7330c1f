"""A CPU trace records its own CPU at capture; validation replays it on that CPU, not on whichever
machine validates it later (older traces fall back on this machine, and say so)."""

from __future__ import annotations

import pytest

from profiler.errors import TraceError
from profiler.host import read_host_cpu
from simulator.hardware import cpu_spec, host_cpu_spec
from simulator.validation import trace_hardware, validate


def test_capture_records_its_cpu(small_trace):
    import json

    meta = json.loads((small_trace / "meta.json").read_text())
    cpu = meta["device"]["cpu"]
    assert set(cpu) == {"model", "logical_cores", "usable_cores", "clock_mhz", "flops_per_cycle", "ram_bytes"}
    assert cpu["logical_cores"] >= cpu["usable_cores"] >= 1 and cpu["flops_per_cycle"] in (8, 32, 64)
    v = validate(small_trace)
    assert v["hardware_source"].startswith("recorded at capture")


def test_validation_uses_the_recorded_cpu_not_this_machine():
    recorded = {
        "model": "Some CPU",
        "logical_cores": 64,
        "usable_cores": 64,
        "clock_mhz": 1234.0,
        "flops_per_cycle": 8,
        "ram_bytes": 2**30,
    }
    hw = trace_hardware({"device": {"type": "cpu", "threads": 2, "cpu": recorded}})
    assert hw.name == "host-cpu-2c" and hw.peak_flops_per_s == pytest.approx(2 * 1234e6 * 8)
    assert hw.hbm_capacity_bytes == 2**30 and "recorded at capture: Some CPU" in hw.source
    here = {**recorded, "clock_mhz": 2 * 1234.0}  # the same record at another clock gives another spec
    assert cpu_spec(here, 2).peak_flops_per_s == pytest.approx(2 * hw.peak_flops_per_s)


def test_old_trace_falls_back_on_this_machine_and_says_so():
    hw = trace_hardware({"device": {"type": "cpu", "threads": 2}})
    assert hw.peak_flops_per_s == pytest.approx(host_cpu_spec(2).peak_flops_per_s)
    assert "records no CPU" in hw.source and "this machine now" in hw.source


@pytest.mark.parametrize(
    "bad", [{"clock_mhz": "fast"}, {"clock_mhz": -5}, {"flops_per_cycle": [1]}, {"clock_mhz": float("inf")}]
)
def test_a_broken_cpu_record_is_one_clear_error(bad):
    with pytest.raises(TraceError, match="CPU record"):
        cpu_spec({**read_host_cpu(), **bad}, 2)


@pytest.mark.parametrize("ram", ["x", float("nan"), float("inf"), -1, 1e-300])
def test_a_cpu_record_whose_ram_is_not_a_size_is_one_trace_error(ram):
    """Was: int() of device.cpu.ram_bytes outside cpu_spec's check (a ValueError, an OverflowError,
    or the HardwareSpec's own ValueError of a size <= 0), `solm validate` exit 1; found by fuzzing."""
    record = {"usable_cores": 2, "clock_mhz": 2400.0, "flops_per_cycle": 32, "ram_bytes": 8 << 30}
    assert cpu_spec(record).hbm_capacity_bytes == 8 << 30
    with pytest.raises(TraceError, match="CPU record"):
        cpu_spec({**record, "ram_bytes": ram})
