"""The capturing machine's CPU, read once at capture and recorded in the trace (`meta.json`
`device.cpu`), so that a CPU trace is replayed on the CPU that measured it, not on whichever
machine validates it later (`simulator.hardware.cpu_spec`)."""

from __future__ import annotations

import os
import platform


def _cpu_flops_per_cycle(flags: set[str]) -> int:
    """fp32 FLOP per cycle per core from the ISA: two FMA pipes x lanes x 2 FLOP."""
    if "avx512f" in flags:
        return 64  # 2 x 16 lanes x 2
    if "avx2" in flags and "fma" in flags:
        return 32  # 2 x 8 lanes x 2
    return 8  # SSE: 4 lanes, separate add and multiply


def usable_cores() -> int:
    """The cores this process may use (its CPU affinity; all logical cores where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def read_host_cpu() -> dict:
    """This machine's CPU as a capture records it (`meta.json` `device.cpu`): model name, logical
    cores, the cores this process may use, the current clock (the fastest core's, MHz; None if
    unknown), fp32 FLOP per cycle per core from the ISA, and RAM."""
    usable = usable_cores()
    flags: set[str] = set()
    clocks_mhz: list[float] = []
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags" and not flags:
                    flags = set(value.split())
                elif key == "model name" and not model:
                    model = value.strip()
                elif key == "cpu MHz":
                    clocks_mhz.append(float(value))
    except (OSError, ValueError):
        pass
    try:
        ram_bytes: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram_bytes = None
    return {
        "model": model or platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count() or 1,
        "usable_cores": usable,
        "clock_mhz": max(clocks_mhz) if clocks_mhz else None,
        "flops_per_cycle": _cpu_flops_per_cycle(flags) if flags else 32,
        "ram_bytes": ram_bytes,
    }
