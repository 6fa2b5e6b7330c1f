"""A mutation round on simulator/hardware.py (twenty-fourth session): 26 hand mutants run against
the catalog, host-CPU, cost and GEMM tests (14 killed there, none equivalent); each test here
fails on one of the 12 that survived them (named in its docstring)."""

from __future__ import annotations

import dataclasses

import pytest

from profiler.errors import UsageError
from simulator.hardware import cpu_spec, get_hardware, override


def test_an_efficiency_of_exactly_one_is_a_part_the_catalog_accepts() -> None:
    """The efficiencies are fractions in (0, 1]: a what-if at full efficiency is allowed (mutant:
    the upper bound exclusive, `--set matmul_efficiency=1` refused)."""
    assert override("h100-sxm", matmul_efficiency=1.0).matmul_efficiency == 1.0
    assert override("h100-sxm", memory_efficiency=1).memory_efficiency == 1
    with pytest.raises(UsageError, match="matmul_efficiency must be a number in"):
        override("h100-sxm", matmul_efficiency=1.0001)


@pytest.mark.parametrize(
    "fit",
    [
        (("tensor_eff",),),  # mutant: a pair of any length >= 1
        (("tensor_eff", 0.8, 1.0),),
        (("tensor_eff", True),),  # mutant: a bool taken for a number
    ],
    ids=["one", "three", "bool"],
)
def test_gemm_fit_takes_field_number_pairs_only(fit) -> None:
    with pytest.raises(ValueError, match="gemm_fit takes"):
        dataclasses.replace(get_hardware("a100-80g"), name="a100-fit", gemm_fit=fit)
    ok = dataclasses.replace(get_hardware("a100-80g"), name="a100-fit", gemm_fit=(("tensor_eff", 0.8),))
    assert ok.gemm_fit == (("tensor_eff", 0.8),)


def test_a_part_always_has_a_pcie_generation_and_may_lack_nvlink() -> None:
    """NVLink None is "no NVLink"; PCIe None is no part (mutant: None allowed for both)."""
    assert dataclasses.replace(get_hardware("h100-sxm"), name="x", nvlink_generation=None).nvlink_generation is None
    with pytest.raises(ValueError, match="pcie_generation must be a whole number in 1..7"):
        dataclasses.replace(get_hardware("h100-sxm"), name="x", pcie_generation=None)


def test_the_newest_generation_is_the_last_accepted() -> None:
    """NVLink 6 and PCIe 7 exist, 7 and 8 do not (mutant: one past the top accepted)."""
    assert override("b200", nvlink_generation=6).nvlink_generation == 6
    assert override("h100-sxm", pcie_generation=7).pcie_generation == 7
    with pytest.raises(UsageError, match="nvlink_generation must be a whole number in 1..6"):
        override("b200", nvlink_generation=7)
    with pytest.raises(UsageError, match="pcie_generation must be a whole number in 1..7"):
        override("h100-sxm", pcie_generation=8)


def test_a_huge_pcie_generation_is_one_clear_error() -> None:
    """The bandwidth is derived only for a generation that exists (mutant: the upper bound dropped,
    2 ** (10**6 - 5) overflowed: an OverflowError, a traceback, instead of the one line)."""
    with pytest.raises(UsageError, match="pcie_generation must be a whole number in 1..7"):
        override("h100-sxm", pcie_generation=10**6)


def test_an_nvlink_generation_scales_from_the_parts_own() -> None:
    """B200 is NVLink 5 (100 GB/s a link): at 6 (200) its bandwidth doubles (mutant: scaled from
    generation 4's 50 GB/s, 4x); the H100 tests elsewhere start from 4, where both agree."""
    b200 = get_hardware("b200")
    assert override("b200", nvlink_generation=6).interconnect_bytes_per_s == 2 * b200.interconnect_bytes_per_s
    assert override("b200", nvlink_generation=4).interconnect_bytes_per_s == b200.interconnect_bytes_per_s / 2


def test_more_tensor_flop_per_sm_clock_scales_the_peak() -> None:
    """The peak is SMs x FLOP per SM-clock x sustained clock: doubling the middle one doubles it
    (mutant: only SMs and the clock scale it, a what-if tensor core left at the catalog's peak)."""
    h100 = get_hardware("h100-sxm")
    assert h100.tensor_flops_per_sm_per_clock is not None
    twice = override("h100-sxm", tensor_flops_per_sm_per_clock=2 * h100.tensor_flops_per_sm_per_clock)
    assert twice.peak_flops_per_s == pytest.approx(2 * h100.peak_flops_per_s)
    assert twice.sm_peak_flops_per_s == pytest.approx(2 * h100.sm_peak_flops_per_s)


RECORD = {"model": "Some CPU", "logical_cores": 16, "usable_cores": 4, "flops_per_cycle": 8, "ram_bytes": 2**30}


def test_a_cpu_record_counts_the_cores_the_process_may_use() -> None:
    """A process pinned to 4 of 16 cores computes on 4 (mutant: logical cores first, 4x the peak)."""
    hw = cpu_spec({**RECORD, "clock_mhz": 2000.0})
    assert hw.name == "host-cpu-4c" and hw.peak_flops_per_s == pytest.approx(4 * 2e9 * 8)
    assert cpu_spec({**RECORD, "usable_cores": None, "clock_mhz": 2000.0}).name == "host-cpu-16c"
    assert cpu_spec({**RECORD, "clock_mhz": 2000.0}, cores=2).name == "host-cpu-2c"  # the caller's count wins


def test_an_unknown_cpu_clock_is_taken_as_3_ghz() -> None:
    """The module's documented default (mutant: 2 GHz)."""
    hw = cpu_spec({**RECORD, "clock_mhz": None})
    assert hw.peak_flops_per_s == pytest.approx(4 * 3e9 * 8) and "3.00 GHz" in hw.source


def test_an_unknown_flop_per_cycle_is_taken_as_32() -> None:
    """An AVX2-FMA core's fp32 FLOP per cycle, the default `read_host_cpu` records too (mutant: 16)."""
    hw = cpu_spec({**RECORD, "clock_mhz": 1000.0, "flops_per_cycle": None})
    assert hw.peak_flops_per_s == pytest.approx(4 * 1e9 * 32) and "x 32 FLOP/cycle" in hw.source


def test_the_ridge_is_peak_over_bandwidth() -> None:
    """The arithmetic intensity where the roofline turns, printed by `python -m simulator.hardware`
    (mutant: halved)."""
    h100 = get_hardware("h100-sxm")
    assert h100.ridge_flops_per_byte == pytest.approx(h100.peak_flops_per_s / h100.hbm_bytes_per_s)
    assert 250 < h100.ridge_flops_per_byte < 350  # 989 TFLOP/s over 3.35 TB/s
