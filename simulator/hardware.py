"""Hardware catalog: the parts the simulator can replay a trace on.

What: `HardwareSpec`, a frozen record of what a roofline cost model needs to know about one
accelerator (peak dense FLOP/s, memory bandwidth and capacity, interconnect, per-kernel launch
overhead, and priors for the fraction of peak that real kernels reach), and `HARDWARE`, a table of
real parts keyed by a short name.

Why: what-if questions ("this trace on an H200?", "an H100 with 6 TB/s?") need the numbers in one
place, each with its source. An unknown part is an error that lists the known ones, never a guess;
a hypothetical part is an explicit `override` of a real one (STYLE 7, after nanochat
`get_peak_flops` and vidur `device_sku_config.py`).

Conventions:
- `peak_flops_per_s` is the dense (no 2:4 sparsity) BF16/FP16 tensor-core peak from the vendor
  datasheet. Datasheets often print the sparse figure; those are halved here and say so.
- Bandwidths are decimal (1 GB/s = 1e9 B/s), as vendors state them.
- `hbm_capacity_bytes` reads datasheet "GB" as GiB: HBM/GDDR stacks come in binary sizes (the
  driver reports an A100 40GB as 40960 MiB). The driver reserves a little of it.
- `interconnect_bytes_per_s` is the datasheet GPU-to-GPU figure, which for NVLink/Infinity Fabric
  is the bidirectional aggregate per GPU; collectives see about half of it in each direction.

Run `python -m simulator.hardware` to print the table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from profiler.host import read_host_cpu

GIB = 2**30


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (or the host CPU) as the cost model sees it."""

    name: str
    kind: str  # "gpu" or "cpu"
    peak_flops_per_s: float  # dense BF16/FP16 tensor peak (fp32 vector peak for CPUs)
    hbm_bytes_per_s: float  # device memory bandwidth (HBM, GDDR or host DRAM)
    hbm_capacity_bytes: int
    interconnect_bytes_per_s: float  # device-to-device, datasheet aggregate (see module doc)
    interconnect_latency_s: float  # per ring step (hop) of a collective
    launch_overhead_s: float  # fixed cost of one kernel / eager op
    matmul_efficiency: float  # prior: achieved fraction of peak FLOP/s on large GEMMs
    memory_efficiency: float  # prior: achieved fraction of bandwidth when streaming
    source: str = ""

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from memory- to compute-bound."""
        return self.peak_flops_per_s / self.hbm_bytes_per_s


_POSITIVE_FIELDS = (
    "peak_flops_per_s",
    "hbm_bytes_per_s",
    "hbm_capacity_bytes",
    "interconnect_bytes_per_s",
)
_NON_NEGATIVE_FIELDS = ("interconnect_latency_s", "launch_overhead_s")
_FRACTION_FIELDS = ("matmul_efficiency", "memory_efficiency")


def _validate(spec: HardwareSpec) -> None:
    """Raise ValueError (one line) for a spec no real part could have."""
    if spec.kind not in ("gpu", "cpu"):
        raise ValueError(f"hardware {spec.name!r}: kind must be 'gpu' or 'cpu', got {spec.kind!r}")
    for field in _POSITIVE_FIELDS:
        value = getattr(spec, field)
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"hardware {spec.name!r}: {field} must be > 0, got {value!r}")
    for field in _NON_NEGATIVE_FIELDS:
        value = getattr(spec, field)
        if not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"hardware {spec.name!r}: {field} must be >= 0, got {value!r}")
    for field in _FRACTION_FIELDS:
        value = getattr(spec, field)
        if not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ValueError(f"hardware {spec.name!r}: {field} must be in (0, 1], got {value!r}")


# Priors shared by the NVIDIA data-centre parts. Matmul 0.70: the vidur A100 data reaches about
# 220 of 312 TFLOP/s on a 4096-token Llama-2-7B MLP (shared/data/vidur-a100/README.md). Memory
# 0.76: the same data streams Llama-2-7B MLP weights at about 1.55 of 2.04 TB/s at one token.
# Launch 4 us: the smallest kernels in that data (a 1-token add or norm) take 2-5 us.
_NV_MATMUL_EFF = 0.70
_NV_MEMORY_EFF = 0.76
_NV_LAUNCH_S = 4e-6
# Per ring step (hop) of a collective; a small NCCL all-reduce on 8 NVLink GPUs takes ~15-30 us,
# i.e. 1-2 us for each of its 2 (8 - 1) = 14 steps. PCIe hops go through the host bridge (prior).
_NVLINK_LATENCY_S = 2e-6
_PCIE_LATENCY_S = 5e-6

HARDWARE: dict[str, HardwareSpec] = {
    # NVIDIA A100 datasheet (A100 40GB/80GB SXM): BF16 tensor 312 TFLOP/s dense (624 sparse);
    # HBM2 1,555 GB/s (40GB), HBM2e 2,039 GB/s (80GB SXM); NVLink 600 GB/s.
    "a100-40g": HardwareSpec(
        "a100-40g", "gpu", 312e12, 1.555e12, 40 * GIB, 600e9, _NVLINK_LATENCY_S,
        _NV_LAUNCH_S, _NV_MATMUL_EFF, _NV_MEMORY_EFF, "NVIDIA A100 datasheet (SXM4 40GB)",
    ),
    "a100-80g": HardwareSpec(
        "a100-80g", "gpu", 312e12, 2.039e12, 80 * GIB, 600e9, _NVLINK_LATENCY_S,
        _NV_LAUNCH_S, _NV_MATMUL_EFF, _NV_MEMORY_EFF, "NVIDIA A100 datasheet (SXM4 80GB)",
    ),
    # NVIDIA A10 datasheet: BF16 tensor 125 TFLOP/s dense (250 sparse), GDDR6 600 GB/s, 24 GB,
    # PCIe Gen4 x16 64 GB/s.
    "a10": HardwareSpec(
        "a10", "gpu", 125e12, 600e9, 24 * GIB, 64e9, _PCIE_LATENCY_S,
        _NV_LAUNCH_S, _NV_MATMUL_EFF, _NV_MEMORY_EFF, "NVIDIA A10 datasheet",
    ),
    # NVIDIA A40 datasheet: BF16 tensor 149.7 TFLOP/s dense (299.4 sparse), GDDR6 696 GB/s,
    # 48 GB, NVLink bridge 112.5 GB/s bidirectional.
    "a40": HardwareSpec(
        "a40", "gpu", 149.7e12, 696e9, 48 * GIB, 112.5e9, _NVLINK_LATENCY_S,
        _NV_LAUNCH_S, _NV_MATMUL_EFF, _NV_MEMORY_EFF, "NVIDIA A40 datasheet",
    ),
    # NVIDIA L4 datasheet: BF16 tensor 242 TFLOP/s with sparsity -> 121 dense; GDDR6 300 GB/s,
    # 24 GB; PCIe Gen4 x16 64 GB/s.
    "l4": HardwareSpec(
        "l4", "gpu", 121e12, 300e9, 24 * GIB, 64e9, _PCIE_LATENCY_S,
        _NV_LAUNCH_S, _NV_MATMUL_EFF, _NV_MEMORY_EFF, "NVIDIA L4 datasheet (242 sparse / 2)",
    ),
    # NVIDIA L40S datasheet: BF16 tensor 362.05 TFLOP/s dense (733 sparse), GDDR6 864 GB/s,
    # 48 GB; PCIe Gen4 x16 64 GB/s bidirectional, no NVLink.
    "l40s": HardwareSpec(
        "l40s", "gpu", 362.05e12, 864e9, 48 * GIB, 64e9, _PCIE_LATENCY_S,
        _NV_LAUNCH_S, _NV_MATMUL_EFF, _NV_MEMORY_EFF, "NVIDIA L40S datasheet",
    ),
    # NVIDIA H100 datasheet (SXM5): BF16 tensor 1,979 TFLOP/s with sparsity -> 989.4 dense;
    # HBM3 3.35 TB/s, 80 GB; NVLink 900 GB/s.
    "h100-sxm": HardwareSpec(
        "h100-sxm", "gpu", 989.4e12, 3.35e12, 80 * GIB, 900e9, _NVLINK_LATENCY_S,
        _NV_LAUNCH_S, _NV_MATMUL_EFF, _NV_MEMORY_EFF, "NVIDIA H100 datasheet (SXM)",
    ),
    # NVIDIA H100 datasheet (PCIe): BF16 tensor 1,513 TFLOP/s sparse -> 756 dense; HBM2e 2.0 TB/s,
    # 80 GB; NVLink bridge 600 GB/s (PCIe Gen5 128 GB/s without it).
    "h100-pcie": HardwareSpec(
        "h100-pcie", "gpu", 756e12, 2.0e12, 80 * GIB, 600e9, _NVLINK_LATENCY_S,
        _NV_LAUNCH_S, _NV_MATMUL_EFF, _NV_MEMORY_EFF, "NVIDIA H100 datasheet (PCIe)",
    ),
    # NVIDIA H200 datasheet (SXM): BF16 tensor 1,979 sparse -> 989 dense (same die as H100);
    # HBM3e 4.8 TB/s, 141 GB; NVLink 900 GB/s.
    "h200": HardwareSpec(
        "h200", "gpu", 989.4e12, 4.8e12, 141 * GIB, 900e9, _NVLINK_LATENCY_S,
        _NV_LAUNCH_S, _NV_MATMUL_EFF, _NV_MEMORY_EFF, "NVIDIA H200 datasheet (SXM)",
    ),
    # NVIDIA HGX B200 spec (1,000 W): BF16 tensor 4.5 PFLOP/s sparse -> 2.25 dense; HBM3e 8 TB/s,
    # 192 GB physical (the DGX B200 datasheet lists 1,440 GB for 8 GPUs, i.e. 180 GB usable);
    # NVLink 5 1.8 TB/s.
    "b200": HardwareSpec(
        "b200", "gpu", 2.25e15, 8.0e12, 192 * GIB, 1.8e12, _NVLINK_LATENCY_S,
        _NV_LAUNCH_S, _NV_MATMUL_EFF, _NV_MEMORY_EFF, "NVIDIA HGX B200 datasheet",
    ),
    # AMD Instinct MI300X datasheet: BF16 matrix 1,307.4 TFLOP/s dense (2,614.9 sparse); HBM3
    # 5.3 TB/s, 192 GB; Infinity Fabric 896 GB/s aggregate (7 links x 128 GB/s).
    # Matmul prior 0.50 (not 0.70): public GEMM benchmarks (SemiAnalysis, Dec 2024) found
    # MI300X BF16 GEMMs reaching roughly half of the datasheet peak; kernel launch on ROCm is
    # of the same order as CUDA.
    "mi300x": HardwareSpec(
        "mi300x", "gpu", 1307.4e12, 5.3e12, 192 * GIB, 896e9, _NVLINK_LATENCY_S,
        _NV_LAUNCH_S, 0.50, 0.70, "AMD Instinct MI300X datasheet",
    ),
    # A generic capturing host, for replaying CPU traces: 8 cores x 3.0 GHz x 32 fp32 FLOP/cycle
    # (AVX2: two 8-lane FMA units, 2 FLOP per FMA) = 768 GFLOP/s; dual-channel DDR4-3200
    # = 51.2 GB/s; 32 GiB. PyTorch eager dispatch costs ~10 us per op on CPU (prior). Cores
    # talk through DRAM, so the "interconnect" is the memory bus. Use `host_cpu_spec()` for
    # the machine actually running.
    "host-cpu": HardwareSpec(
        "host-cpu", "cpu", 8 * 3.0e9 * 32, 51.2e9, 32 * GIB, 51.2e9, 1e-6,
        10e-6, 0.5, 0.6, "generic AVX2 host (assumed; see comment)",
    ),
}


def get_hardware(name: str) -> HardwareSpec:
    """Exact lookup; `KeyError` naming the valid parts for an unknown one."""
    try:
        return HARDWARE[name]
    except KeyError:
        raise KeyError(
            f"unknown hardware {name!r}; valid names: {', '.join(sorted(HARDWARE))}"
        ) from None


def override(base_name: str, /, **fields: object) -> HardwareSpec:
    """A hypothetical part: a catalog part with some fields replaced and validated again.

    `override("h100-sxm", hbm_bytes_per_s=6e12)` is an H100 with 6 TB/s, named
    "h100-sxm-custom" unless `name=` is given. Unknown fields or impossible values raise
    ValueError with one line.
    """
    base = get_hardware(base_name)
    valid = {f.name for f in dataclasses.fields(HardwareSpec)}
    unknown = sorted(set(fields) - valid)
    if unknown:
        raise ValueError(
            f"unknown hardware field(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}"
        )
    fields.setdefault("name", f"{base_name}-custom")
    return dataclasses.replace(base, **fields)  # __post_init__ validates


def cpu_spec(cpu: dict, cores: int | None = None, origin: str = "this host") -> HardwareSpec:
    """The `host-cpu` entry rescaled to a CPU described as `read_host_cpu` returns it (a trace's
    recorded `device.cpu`, or this machine's): `cores` (default: the usable ones) x clock x FLOP per
    cycle; 3 GHz when the clock is unknown. Memory bandwidth cannot be read from the OS, so it keeps
    the generic DRAM figure."""
    base = HARDWARE["host-cpu"]
    try:
        cores = int(cores or cpu.get("usable_cores") or cpu.get("logical_cores") or 1)
        clock_hz = float(cpu["clock_mhz"]) * 1e6 if cpu.get("clock_mhz") else 3.0e9
        per_cycle = int(cpu.get("flops_per_cycle") or 32)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"CPU record {cpu!r}: cores, clock_mhz and flops_per_cycle must be numbers") from None
    if not (cores >= 1 and 0 < clock_hz < 1e11 and per_cycle >= 1):
        raise ValueError(f"CPU record {cpu!r}: impossible cores ({cores}), clock ({clock_hz:g} Hz) or FLOP/cycle")
    return dataclasses.replace(
        base,
        name=f"host-cpu-{cores}c",
        peak_flops_per_s=cores * clock_hz * per_cycle,
        hbm_capacity_bytes=int(cpu.get("ram_bytes") or base.hbm_capacity_bytes),
        source=f"{origin}: {cpu.get('model') or 'cpu'}, {cores} cores x {clock_hz / 1e9:.2f} GHz x {per_cycle} FLOP/cycle",
    )


def host_cpu_spec(cores: int | None = None) -> HardwareSpec:
    """The `host-cpu` entry rescaled to the running machine (cores, ISA, current clock, RAM)."""
    return cpu_spec(read_host_cpu(), cores)


if __name__ == "__main__":
    for spec in HARDWARE.values():
        print(
            f"{spec.name:10s} {spec.peak_flops_per_s / 1e12:8.1f} TFLOP/s "
            f"{spec.hbm_bytes_per_s / 1e12:6.3f} TB/s {spec.hbm_capacity_bytes / GIB:6.0f} GiB "
            f"ridge {spec.ridge_flops_per_byte:6.1f} FLOP/B  ({spec.source})"
        )
