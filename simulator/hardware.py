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
- The chip layout of each GPU (`num_sms`, tensor FLOP per SM-clock, boost and sustained clocks,
  L2, GEMM kernel family; the `_CHIP` block, each entry with its source) drives the
  tile-and-wave GEMM model (`simulator.gemm`). The part's peak = SMs x FLOP per SM-clock x
  sustained clock, so `override(..., num_sms=...)` scales it.
- `interconnect_bytes_per_s` is the datasheet GPU-to-GPU figure, which for NVLink/Infinity Fabric
  is the bidirectional aggregate per GPU; collectives see about half of it in each direction.

Run `python -m simulator.hardware` to print the table.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from profiler.errors import TraceError, UnknownName, UsageError, is_count, quoted
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
    launch_overhead_s: float  # fixed cost of one kernel / eager op
    matmul_efficiency: float  # prior: achieved fraction of peak FLOP/s on large GEMMs
    memory_efficiency: float  # prior: achieved fraction of bandwidth when streaming
    source: str = ""
    # ---- chip layout, for the tile-and-wave GEMM model (simulator.gemm); None on CPUs ----
    num_sms: int | None = None  # streaming multiprocessors (AMD: compute units)
    tensor_flops_per_sm_per_clock: float | None = None  # dense BF16/FP16 tensor FLOP per SM
    boost_clock_hz: float | None = None  # the part's maximum SM clock
    sustained_clock_hz: float | None = None  # the clock its tensor peak is rated at (see _CHIP)
    l2_bytes: int | None = None  # last-level on-chip cache shared by all SMs
    arch: str | None = None  # GEMM kernel family: its tile shapes (simulator.gemm.TILES)
    # The tile model's parameters fitted on this part's own measured GEMMs (`solm calibrate`,
    # simulator/gemm_calibration.py) as (field, value) pairs; None: the A100 fit carried by physics.
    gemm_fit: tuple[tuple[str, float], ...] | None = None
    # ---- interconnect and price (simulator/comm.py, simulator/cluster/; see _LINKS below) ----
    nvlink_generation: int | None = None  # None: no NVLink / Infinity Fabric between GPUs
    pcie_generation: int = 4
    pcie_bytes_per_s: float = 64e9  # x16 slot, bidirectional aggregate (as vendors state it)
    network_bytes_per_s: float = 25e9  # inter-node NIC per GPU, per direction (200 Gb/s = 25e9)
    gpus_per_node: int = 8
    topology: str = "nvswitch"  # nvswitch | nvlink_pairs | pcie | mesh (simulator.comm.TOPOLOGIES)
    links_source: str = ""
    price_per_gpu_hour: float | None = None  # user's price (USD); None: results are not costed

    def __post_init__(self) -> None:
        _validate(self)
        _validate_links(self)

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from memory- to compute-bound."""
        return self.peak_flops_per_s / self.hbm_bytes_per_s

    @property
    def has_chip_layout(self) -> bool:
        """True when the tile-and-wave GEMM model can run on this part."""
        return all(getattr(self, name) is not None for name in CHIP_FIELDS)

    @property
    def sm_peak_flops_per_s(self) -> float:
        """Tensor-core peak of one SM at the sustained clock: the part's peak / its SMs.

        For catalog parts this equals tensor_flops_per_sm_per_clock x sustained_clock_hz (the
        catalog test checks it); `override(num_sms=...)` keeps it and scales the part's peak.
        """
        if self.num_sms is None:
            raise ValueError(f"hardware {self.name!r} has no num_sms")
        return self.peak_flops_per_s / self.num_sms


# Fields holding text (a `--set` value for them stays the text given, however numeric it looks).
TEXT_FIELDS = frozenset(f.name for f in dataclasses.fields(HardwareSpec) if f.type in ("str", "str | None"))
_POSITIVE_FIELDS = (
    "peak_flops_per_s",
    "hbm_bytes_per_s",
    "hbm_capacity_bytes",
    "interconnect_bytes_per_s",
)
_NON_NEGATIVE_FIELDS = ("launch_overhead_s",)
_FRACTION_FIELDS = ("matmul_efficiency", "memory_efficiency")
CHIP_FIELDS = ("num_sms", "tensor_flops_per_sm_per_clock", "boost_clock_hz", "sustained_clock_hz", "l2_bytes", "arch")
_CHIP_NUMBERS = CHIP_FIELDS[:-1]
ARCHES = ("ampere", "ada", "hopper", "blackwell", "cdna3")


def _validate(spec: HardwareSpec) -> None:
    """Raise ValueError (one line) for a spec no real part could have."""
    if not isinstance(spec.name, str) or not spec.name.strip() or not spec.name.isprintable():
        raise ValueError(f"hardware name must be printable text on one line, not empty, got {quoted(spec.name)}")
    if spec.kind not in ("gpu", "cpu"):
        raise ValueError(f"hardware {quoted(spec.name)}: kind must be 'gpu' or 'cpu', got {quoted(spec.kind)}")
    for field in _POSITIVE_FIELDS:
        value = getattr(spec, field)
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"hardware {quoted(spec.name)}: {field} must be a number > 0, got {quoted(value)}")
    for field in _NON_NEGATIVE_FIELDS:
        value = getattr(spec, field)
        if not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"hardware {quoted(spec.name)}: {field} must be a number >= 0, got {quoted(value)}")
    for field in _FRACTION_FIELDS:
        value = getattr(spec, field)
        if not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ValueError(f"hardware {quoted(spec.name)}: {field} must be a number in (0, 1], got {quoted(value)}")
    for field in _CHIP_NUMBERS:
        value = getattr(spec, field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ValueError(f"hardware {quoted(spec.name)}: {field} must be a number > 0, got {quoted(value)}")
    if spec.arch is not None and spec.arch not in ARCHES:
        raise ValueError(
            f"hardware {quoted(spec.name)}: arch must be one of {', '.join(ARCHES)}, got {quoted(spec.arch)}"
        )
    for field in ("num_sms", "hbm_capacity_bytes", "l2_bytes"):  # counts of SMs and bytes
        value = getattr(spec, field)
        if value is not None and not float(value).is_integer():
            raise ValueError(f"hardware {quoted(spec.name)}: {field} must be a whole number, got {quoted(value)}")
    if (
        spec.boost_clock_hz is not None
        and spec.sustained_clock_hz is not None
        and spec.sustained_clock_hz > spec.boost_clock_hz * 1.0001
    ):
        raise ValueError(f"hardware {quoted(spec.name)}: sustained_clock_hz exceeds boost_clock_hz")
    if spec.gemm_fit is not None and not (
        spec.has_chip_layout
        and isinstance(spec.gemm_fit, tuple)
        and all(
            isinstance(pair, tuple)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], (int, float))
            and not isinstance(pair[1], bool)
            for pair in spec.gemm_fit
        )
    ):
        raise ValueError(
            f"hardware {quoted(spec.name)}: gemm_fit takes (field, number) pairs from a GEMM calibration "
            f"(solm calibrate), on a part with a chip layout"
        )


TOPOLOGIES = ("nvswitch", "nvlink_pairs", "pcie", "mesh")  # node topologies (simulator.comm)
# NVLink bandwidth per link, bidirectional (NVIDIA NVLink pages and the P100, V100, A100, H100,
# B200 whitepapers: gen 1 40 GB/s; gen 2-4 50 GB/s; gen 5 100 GB/s; gen 6 (Rubin) 200 GB/s).
NVLINK_LINK_BYTES_PER_S = {1: 40e9, 2: 50e9, 3: 50e9, 4: 50e9, 5: 100e9, 6: 200e9}
MAX_PCIE_GENERATION = 7  # PCI-SIG: PCIe 7.0


def _validate_links(spec: HardwareSpec) -> None:
    """ValueError (one line) for impossible interconnect or price fields."""
    if spec.topology not in TOPOLOGIES:
        raise ValueError(
            f"hardware {quoted(spec.name)}: topology must be one of {', '.join(TOPOLOGIES)}, got {quoted(spec.topology)}"
        )
    for name in ("pcie_bytes_per_s", "network_bytes_per_s"):
        value = getattr(spec, name)
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"hardware {quoted(spec.name)}: {name} must be a number > 0, got {quoted(value)}")
    # A what-if part names a generation that exists: NVLink 1-6 (6: Rubin), PCIe 1-7 (`override`
    # derives the bandwidth from a generation given alone).
    for name, top, allowed_none in (
        ("nvlink_generation", max(NVLINK_LINK_BYTES_PER_S), True),
        ("pcie_generation", MAX_PCIE_GENERATION, False),
    ):
        value = getattr(spec, name)
        if value is None and allowed_none:
            continue
        if not is_count(value) or value > top:
            raise ValueError(
                f"hardware {quoted(spec.name)}: {name} must be a whole number in 1..{top}, got {quoted(value)}"
            )
    if not is_count(spec.gpus_per_node):
        raise ValueError(
            f"hardware {quoted(spec.name)}: gpus_per_node must be a positive int, got {quoted(spec.gpus_per_node)}"
        )
    price = spec.price_per_gpu_hour
    if price is not None and (not isinstance(price, (int, float)) or not 0 <= price < math.inf):
        raise ValueError(
            f"hardware {quoted(spec.name)}: price_per_gpu_hour must be a finite number >= 0, got {quoted(price)}"
        )


# Priors shared by the NVIDIA data-centre parts. Matmul 0.70: the vidur A100 data reaches about
# 220 of 312 TFLOP/s on a 4096-token Llama-2-7B MLP (simulator/data/vidur-a100/README.md). Memory
# 0.76: the same data streams Llama-2-7B MLP weights at about 1.55 of 2.04 TB/s at one token.
# Launch 4 us: the smallest kernels in that data (a 1-token add or norm) take 2-5 us.
_NV_MATMUL_EFF = 0.70
_NV_MEMORY_EFF = 0.76
_NV_LAUNCH_S = 4e-6

HARDWARE: dict[str, HardwareSpec] = {
    # NVIDIA A100 datasheet (A100 40GB/80GB SXM): BF16 tensor 312 TFLOP/s dense (624 sparse);
    # HBM2 1,555 GB/s (40GB), HBM2e 2,039 GB/s (80GB SXM); NVLink 600 GB/s.
    "a100-40g": HardwareSpec(
        "a100-40g",
        "gpu",
        312e12,
        1.555e12,
        40 * GIB,
        600e9,
        _NV_LAUNCH_S,
        _NV_MATMUL_EFF,
        _NV_MEMORY_EFF,
        "NVIDIA A100 datasheet (SXM4 40GB)",
    ),
    "a100-80g": HardwareSpec(
        "a100-80g",
        "gpu",
        312e12,
        2.039e12,
        80 * GIB,
        600e9,
        _NV_LAUNCH_S,
        _NV_MATMUL_EFF,
        _NV_MEMORY_EFF,
        "NVIDIA A100 datasheet (SXM4 80GB)",
    ),
    # NVIDIA A10 datasheet: BF16 tensor 125 TFLOP/s dense (250 sparse), GDDR6 600 GB/s, 24 GB,
    # PCIe Gen4 x16 64 GB/s.
    "a10": HardwareSpec(
        "a10",
        "gpu",
        125e12,
        600e9,
        24 * GIB,
        64e9,
        _NV_LAUNCH_S,
        _NV_MATMUL_EFF,
        _NV_MEMORY_EFF,
        "NVIDIA A10 datasheet",
    ),
    # NVIDIA A40 datasheet: BF16 tensor 149.7 TFLOP/s dense (299.4 sparse), GDDR6 696 GB/s,
    # 48 GB, NVLink bridge 112.5 GB/s bidirectional.
    "a40": HardwareSpec(
        "a40",
        "gpu",
        149.7e12,
        696e9,
        48 * GIB,
        112.5e9,
        _NV_LAUNCH_S,
        _NV_MATMUL_EFF,
        _NV_MEMORY_EFF,
        "NVIDIA A40 datasheet",
    ),
    # NVIDIA L4 datasheet: BF16 tensor 242 TFLOP/s with sparsity -> 121 dense; GDDR6 300 GB/s,
    # 24 GB; PCIe Gen4 x16 64 GB/s.
    "l4": HardwareSpec(
        "l4",
        "gpu",
        121e12,
        300e9,
        24 * GIB,
        64e9,
        _NV_LAUNCH_S,
        _NV_MATMUL_EFF,
        _NV_MEMORY_EFF,
        "NVIDIA L4 datasheet (242 sparse / 2)",
    ),
    # NVIDIA L40S datasheet: BF16 tensor 362.05 TFLOP/s dense (733 sparse), GDDR6 864 GB/s,
    # 48 GB; PCIe Gen4 x16 64 GB/s bidirectional, no NVLink.
    "l40s": HardwareSpec(
        "l40s",
        "gpu",
        362.05e12,
        864e9,
        48 * GIB,
        64e9,
        _NV_LAUNCH_S,
        _NV_MATMUL_EFF,
        _NV_MEMORY_EFF,
        "NVIDIA L40S datasheet",
    ),
    # NVIDIA H100 datasheet (SXM5): BF16 tensor 1,979 TFLOP/s with sparsity -> 989.4 dense;
    # HBM3 3.35 TB/s, 80 GB; NVLink 900 GB/s.
    "h100-sxm": HardwareSpec(
        "h100-sxm",
        "gpu",
        989.4e12,
        3.35e12,
        80 * GIB,
        900e9,
        _NV_LAUNCH_S,
        _NV_MATMUL_EFF,
        _NV_MEMORY_EFF,
        "NVIDIA H100 datasheet (SXM)",
    ),
    # NVIDIA H100 datasheet (PCIe): BF16 tensor 1,513 TFLOP/s sparse -> 756 dense; HBM2e 2.0 TB/s,
    # 80 GB; NVLink bridge 600 GB/s (PCIe Gen5 128 GB/s without it).
    "h100-pcie": HardwareSpec(
        "h100-pcie",
        "gpu",
        756e12,
        2.0e12,
        80 * GIB,
        600e9,
        _NV_LAUNCH_S,
        _NV_MATMUL_EFF,
        _NV_MEMORY_EFF,
        "NVIDIA H100 datasheet (PCIe)",
    ),
    # NVIDIA H200 datasheet (SXM): BF16 tensor 1,979 sparse -> 989 dense (same die as H100);
    # HBM3e 4.8 TB/s, 141 GB; NVLink 900 GB/s.
    "h200": HardwareSpec(
        "h200",
        "gpu",
        989.4e12,
        4.8e12,
        141 * GIB,
        900e9,
        _NV_LAUNCH_S,
        _NV_MATMUL_EFF,
        _NV_MEMORY_EFF,
        "NVIDIA H200 datasheet (SXM)",
    ),
    # NVIDIA HGX B200 spec (1,000 W): BF16 tensor 4.5 PFLOP/s sparse -> 2.25 dense; HBM3e 8 TB/s,
    # 192 GB physical (the DGX B200 datasheet lists 1,440 GB for 8 GPUs, i.e. 180 GB usable);
    # NVLink 5 1.8 TB/s.
    "b200": HardwareSpec(
        "b200",
        "gpu",
        2.25e15,
        8.0e12,
        192 * GIB,
        1.8e12,
        _NV_LAUNCH_S,
        _NV_MATMUL_EFF,
        _NV_MEMORY_EFF,
        "NVIDIA HGX B200 datasheet",
    ),
    # AMD Instinct MI300X datasheet: BF16 matrix 1,307.4 TFLOP/s dense (2,614.9 sparse); HBM3
    # 5.3 TB/s, 192 GB; Infinity Fabric 896 GB/s aggregate (7 links x 128 GB/s).
    # Matmul prior 0.50 (not 0.70): public GEMM benchmarks (SemiAnalysis, Dec 2024) found
    # MI300X BF16 GEMMs reaching roughly half of the datasheet peak; kernel launch on ROCm is
    # of the same order as CUDA.
    "mi300x": HardwareSpec(
        "mi300x",
        "gpu",
        1307.4e12,
        5.3e12,
        192 * GIB,
        896e9,
        _NV_LAUNCH_S,
        0.50,
        0.70,
        "AMD Instinct MI300X datasheet",
    ),
    # A generic capturing host, for replaying CPU traces: 8 cores x 3.0 GHz x 32 fp32 FLOP/cycle
    # (AVX2: two 8-lane FMA units, 2 FLOP per FMA) = 768 GFLOP/s; dual-channel DDR4-3200
    # = 51.2 GB/s; 32 GiB. PyTorch eager dispatch costs ~10 us per op on CPU (prior). Cores
    # talk through DRAM, so the "interconnect" is the memory bus. Use `host_cpu_spec()` for
    # the machine actually running.
    "host-cpu": HardwareSpec(
        "host-cpu",
        "cpu",
        8 * 3.0e9 * 32,
        51.2e9,
        32 * GIB,
        51.2e9,
        10e-6,
        0.5,
        0.6,
        "generic AVX2 host (assumed; see comment)",
    ),
}

# ---- chip layout of each GPU (the GEMM model's fields; kept apart from the table above) -------
# (arch, num_sms, tensor FLOP per SM per clock, boost clock, sustained clock, L2 bytes). The sustained
# clock is the one the vendor rates the dense tensor peak at: peak / (SMs x FLOP per SM-clock),
# so the part's peak is derived from these fields. On Hopper and Blackwell it sits below the
# maximum boost clock; under sustained GEMM load power limits can pull the clock lower still
# (docs/cost_model.md). MIB = 2**20: vendors give cache sizes in binary MB.
MIB = 2**20
_CHIP: dict[str, tuple[str, int, float, float, float, int]] = {
    # NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), tables 1 and 3: 108 SMs, 4
    # third-generation tensor cores per SM x 256 FP16 FMA/clock = 2,048 FLOP per SM-clock,
    # boost 1,410 MHz (312 TFLOP/s = 108 x 2,048 x 1.41 GHz), 40 MB L2 (both memory sizes).
    "a100-40g": ("ampere", 108, 2048.0, 1.41e9, 1.41e9, 40 * MIB),
    "a100-80g": ("ampere", 108, 2048.0, 1.41e9, 1.41e9, 40 * MIB),
    # NVIDIA Ampere GA102 GPU Architecture whitepaper (2020): GA102 tensor cores do 128 dense
    # FP16 FMA/clock each, 4 per SM = 1,024 FLOP per SM-clock, 6,144 KB L2. A10 datasheet: 72
    # SMs (9,216 CUDA cores / 128), boost 1,695 MHz (72 x 1,024 x 1.695 GHz = 125 TFLOP/s).
    "a10": ("ampere", 72, 1024.0, 1.695e9, 1.695e9, 6 * MIB),
    # A40 datasheet: 84 SMs (10,752 CUDA cores / 128), boost 1,740 MHz (149.7 TFLOP/s).
    "a40": ("ampere", 84, 1024.0, 1.74e9, 1.74e9, 6 * MIB),
    # NVIDIA Ada GPU Architecture whitepaper (2022): Ada tensor cores, 1,024 dense FP16 FLOP per
    # SM-clock with FP32 accumulate on the professional parts. L4 (AD104) datasheet: 58 SMs
    # (7,424 CUDA cores / 128), boost 2,040 MHz (121 TFLOP/s), 48 MB L2.
    "l4": ("ada", 58, 1024.0, 2.04e9, 2.04e9, 48 * MIB),
    # L40S (AD102) datasheet: 142 SMs (18,176 CUDA cores / 128), boost 2,520 MHz, 96 MB L2; its
    # 362.05 TFLOP/s dense peak is rated at 362.05e12 / (142 x 1,024) = 2.49 GHz.
    "l40s": ("ada", 142, 1024.0, 2.52e9, 362.05e12 / (142 * 1024), 96 * MIB),
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 4 fourth-generation tensor
    # cores per SM, 2x A100's FMA rate per SM-clock = 4,096 FLOP; 50 MB L2. H100 SXM5: 132 SMs,
    # max boost 1,980 MHz; the 989.4 TFLOP/s peak is rated at 989.4e12 / (132 x 4,096) = 1.83 GHz.
    "h100-sxm": ("hopper", 132, 4096.0, 1.98e9, 989.4e12 / (132 * 4096), 50 * MIB),
    # H100 datasheet (PCIe) and the Hopper whitepaper: 114 SMs, max boost 1,755 MHz, 50 MB L2;
    # 756 TFLOP/s rated at 756e12 / (114 x 4,096).
    "h100-pcie": ("hopper", 114, 4096.0, 1.755e9, 756e12 / (114 * 4096), 50 * MIB),
    # H200 datasheet: the H100 SXM5 die (132 SMs, 50 MB L2) with HBM3e; same clocks and peak.
    "h200": ("hopper", 132, 4096.0, 1.98e9, 989.4e12 / (132 * 4096), 50 * MIB),
    # NVIDIA Blackwell architecture technical brief (2024): fifth-generation tensor cores, 2x
    # Hopper's dense FP16 rate per SM-clock (8,192 FLOP). B200: 148 SMs over its two dies and
    # 126 MB L2 (as CUDA's deviceQuery reports them; NVIDIA publishes neither in the datasheet),
    # boost 1,965 MHz; 2.25 PFLOP/s rated at 2.25e15 / (148 x 8,192) = 1.86 GHz.
    "b200": ("blackwell", 148, 8192.0, 1.965e9, 2.25e15 / (148 * 8192), 126 * MIB),
    # AMD CDNA 3 architecture whitepaper (2023) and MI300X datasheet: 304 compute units, 2,048
    # dense FP16/BF16 matrix FLOP per CU-clock, peak engine clock 2,100 MHz (1,307.4 TFLOP/s),
    # 4 MB L2 per XCD x 8 = 32 MB (the 256 MB Infinity Cache behind it is not counted here).
    "mi300x": ("cdna3", 304, 2048.0, 2.1e9, 2.1e9, 32 * MIB),
}
for _name, (_arch, _sms, _per_clock, _boost, _sustained, _l2) in _CHIP.items():
    HARDWARE[_name] = dataclasses.replace(
        HARDWARE[_name],
        arch=_arch,
        num_sms=_sms,
        tensor_flops_per_sm_per_clock=_per_clock,
        boost_clock_hz=_boost,
        sustained_clock_hz=_sustained,
        l2_bytes=_l2,
    )


# ---- interconnect block ------------------------------------------------------------------------
# Per part: NVLink generation (the aggregate NVLink figure is `interconnect_bytes_per_s` above),
# PCIe generation and x16 bandwidth, the inter-node NIC per GPU of the vendor's reference server,
# and the node topology. PCIe x16: Gen4 64 GB/s, Gen5 128 GB/s bidirectional (PCI-SIG).
_GEN4, _GEN5 = {"pcie_generation": 4, "pcie_bytes_per_s": 64e9}, {"pcie_generation": 5, "pcie_bytes_per_s": 128e9}
_LINKS: dict[str, dict] = {
    # DGX A100: NVLink 3 through 6 NVSwitches, 8 x 200 Gb/s HDR InfiniBand (one per GPU).
    "a100-40g": {
        "nvlink_generation": 3,
        **_GEN4,
        "network_bytes_per_s": 25e9,
        "topology": "nvswitch",
        "links_source": "NVIDIA DGX A100 datasheet (NVLink 3, NVSwitch, 8x HDR 200 Gb/s)",
    },
    "a100-80g": {
        "nvlink_generation": 3,
        **_GEN4,
        "network_bytes_per_s": 25e9,
        "topology": "nvswitch",
        "links_source": "NVIDIA DGX A100 datasheet (NVLink 3, NVSwitch, 8x HDR 200 Gb/s)",
    },
    # PCIe-only inference cards: no NVLink; 100 Gb/s Ethernet per GPU assumed for a server of them.
    "a10": {
        **_GEN4,
        "network_bytes_per_s": 12.5e9,
        "topology": "pcie",
        "gpus_per_node": 4,
        "links_source": "NVIDIA A10 datasheet (PCIe Gen4 x16, no NVLink); NIC 100 GbE assumed",
    },
    "l4": {
        **_GEN4,
        "network_bytes_per_s": 12.5e9,
        "topology": "pcie",
        "links_source": "NVIDIA L4 datasheet (PCIe Gen4 x16, no NVLink); NIC 100 GbE assumed",
    },
    "l40s": {
        **_GEN4,
        "network_bytes_per_s": 25e9,
        "topology": "pcie",
        "links_source": "NVIDIA L40S datasheet (PCIe Gen4 x16, no NVLink); NIC 200 Gb/s assumed",
    },
    # A40: NVLink 3 bridge joining two boards.
    "a40": {
        "nvlink_generation": 3,
        **_GEN4,
        "network_bytes_per_s": 25e9,
        "topology": "nvlink_pairs",
        "links_source": "NVIDIA A40 datasheet (NVLink bridge, 2 GPUs, PCIe Gen4); NIC 200 Gb/s assumed",
    },
    # DGX H100 / H200: NVLink 4 through NVSwitch, 8 x 400 Gb/s ConnectX-7 (NDR) per node.
    "h100-sxm": {
        "nvlink_generation": 4,
        **_GEN5,
        "network_bytes_per_s": 50e9,
        "topology": "nvswitch",
        "links_source": "NVIDIA DGX H100 datasheet (NVLink 4, NVSwitch, 8x 400 Gb/s NDR)",
    },
    "h100-pcie": {
        "nvlink_generation": 4,
        **_GEN5,
        "network_bytes_per_s": 50e9,
        "topology": "nvlink_pairs",
        "links_source": "NVIDIA H100 PCIe datasheet (NVLink bridge pairs, PCIe Gen5); NIC 400 Gb/s assumed",
    },
    "h200": {
        "nvlink_generation": 4,
        **_GEN5,
        "network_bytes_per_s": 50e9,
        "topology": "nvswitch",
        "links_source": "NVIDIA DGX H200 datasheet (NVLink 4, NVSwitch, 8x 400 Gb/s NDR)",
    },
    # DGX B200: NVLink 5 (1.8 TB/s per GPU) through NVSwitch, 8 x 400 Gb/s ConnectX-7.
    "b200": {
        "nvlink_generation": 5,
        **_GEN5,
        "network_bytes_per_s": 50e9,
        "topology": "nvswitch",
        "links_source": "NVIDIA DGX B200 datasheet (NVLink 5, NVSwitch, 8x 400 Gb/s)",
    },
    # MI300X platform: 8 GPUs fully connected by Infinity Fabric (7 links each), PCIe Gen5, 400 Gb/s NICs.
    "mi300x": {
        **_GEN5,
        "network_bytes_per_s": 50e9,
        "topology": "mesh",
        "nvlink_generation": None,
        "links_source": "AMD Instinct MI300X platform brief (Infinity Fabric mesh of 8, PCIe Gen5)",
    },
    # Host: processes exchange through DRAM (the interconnect figure above); no NIC assumed beyond 100 GbE.
    "host-cpu": {
        **_GEN4,
        "network_bytes_per_s": 12.5e9,
        "topology": "nvswitch",
        "gpus_per_node": 1,
        "links_source": "generic host (assumed)",
    },
}
HARDWARE = {name: dataclasses.replace(spec, **_LINKS[name]) for name, spec in HARDWARE.items()}


def get_hardware(name: str) -> HardwareSpec:
    """Exact lookup; `KeyError` naming the valid parts for an unknown one."""
    try:
        return HARDWARE[name]
    except KeyError:
        raise UnknownName(f"unknown hardware {quoted(name)}; valid names: {', '.join(sorted(HARDWARE))}") from None


def override(base_name: str, /, **fields: Any) -> HardwareSpec:
    """A hypothetical part: a catalog part with some fields replaced and validated again.

    `override("h100-sxm", hbm_bytes_per_s=6e12)` is an H100 with 6 TB/s, named
    "h100-sxm-custom" unless `name=` is given. Changing `num_sms`,
    `tensor_flops_per_sm_per_clock` or `sustained_clock_hz` scales `peak_flops_per_s` with them
    (unless it is given too), and `pcie_generation` or `nvlink_generation` the link's bandwidth.
    Unknown fields, fields no model reads (`REFERENCE_ONLY`) or impossible values raise UsageError
    (a ValueError) with one line: the fields come from the user (`--set`).
    """
    base = get_hardware(base_name)
    valid = {f.name for f in dataclasses.fields(HardwareSpec)}
    unknown = sorted(set(fields) - valid)
    if unknown:
        raise UsageError(f"unknown hardware field(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}")
    refused = sorted(set(fields) & set(REFERENCE_ONLY))
    if refused:
        name = refused[0]
        raise UsageError(f"{name} is recorded for reference and no model reads it: {REFERENCE_ONLY[name]}")
    fields.setdefault("name", f"{base_name}-custom")
    if fields["name"] in HARDWARE:  # was: name=h200 on an h100-sxm, its figures printed and written as h200's
        raise UsageError(f"name {fields['name']!r} is a catalog part's; a changed part needs a name of its own")
    if "peak_flops_per_s" not in fields and base.has_chip_layout:
        fields["peak_flops_per_s"] = base.peak_flops_per_s * _peak_scale(base, fields)
    sustained = fields.get("sustained_clock_hz")
    if isinstance(sustained, (int, float)) and base.boost_clock_hz is not None:
        # a part rated at a clock reaches at least that clock
        fields["boost_clock_hz"] = max(base.boost_clock_hz, sustained)
    _links_from_generations(base, fields)
    try:
        return dataclasses.replace(base, **fields)  # __post_init__ validates
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None


# Fields of the catalog that describe a part but drive no model: `--set` refuses them rather than
# answer a what-if with the part unchanged.
REFERENCE_ONLY = {
    "boost_clock_hz": "the GEMM model runs the SMs at sustained_clock_hz (the clock the peak is rated at); set that",
    "links_source": "it names where the link figures come from; set the link fields themselves",
}


def _links_from_generations(base: HardwareSpec, fields: dict[str, Any]) -> None:
    """A generation given without its bandwidth sets the bandwidth, as `num_sms` sets the peak:
    PCIe x16 doubles per generation; NVLink keeps the part's link count at the new generation's
    rate per link (a part without NVLink has no link count to keep: its bandwidth must be given)."""
    pcie = fields.get("pcie_generation")
    if (
        "pcie_bytes_per_s" not in fields
        and isinstance(pcie, int)
        and not isinstance(pcie, bool)
        and 1 <= pcie <= MAX_PCIE_GENERATION
    ):
        fields["pcie_bytes_per_s"] = base.pcie_bytes_per_s * 2.0 ** (pcie - base.pcie_generation)
    nvlink = fields.get("nvlink_generation")
    if "interconnect_bytes_per_s" in fields or nvlink not in NVLINK_LINK_BYTES_PER_S or isinstance(nvlink, bool):
        return
    if base.nvlink_generation is None:
        raise UsageError(
            f"nvlink_generation: {base.name} has no NVLink, so there is no link count to carry to generation "
            f"{nvlink}; give interconnect_bytes_per_s too"
        )
    scale = NVLINK_LINK_BYTES_PER_S[nvlink] / NVLINK_LINK_BYTES_PER_S[base.nvlink_generation]
    fields["interconnect_bytes_per_s"] = base.interconnect_bytes_per_s * scale


def _peak_scale(base: HardwareSpec, fields: dict[str, object]) -> float:
    """Factor on the part's peak when SMs, FLOP per SM-clock or the sustained clock change."""
    scale = 1.0
    for name in ("num_sms", "tensor_flops_per_sm_per_clock", "sustained_clock_hz"):
        value = fields.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            scale *= value / getattr(base, name)
    return scale


def cpu_spec(cpu: dict, cores: int | None = None, origin: str = "this host") -> HardwareSpec:
    """The `host-cpu` entry rescaled to a CPU described as `read_host_cpu` returns it (a trace's
    recorded `device.cpu`, or this machine's): `cores` (default: the usable ones) x clock x FLOP per
    cycle; 3 GHz when the clock is unknown; a record that is not numbers is a TraceError. Memory bandwidth cannot be read from the OS, so it keeps
    the generic DRAM figure."""
    base = HARDWARE["host-cpu"]
    try:
        cores = int(cores or cpu.get("usable_cores") or cpu.get("logical_cores") or 1)
        clock_hz = float(cpu["clock_mhz"]) * 1e6 if cpu.get("clock_mhz") else 3.0e9
        per_cycle = int(cpu.get("flops_per_cycle") or 32)
        # was: int() of it below, outside this check, `solm validate` exit 1 on a ram_bytes of "x" or NaN
        ram = int(cpu.get("ram_bytes") or base.hbm_capacity_bytes)
    except (TypeError, ValueError, OverflowError):
        raise TraceError(
            f"CPU record {cpu!r}: cores, clock_mhz, flops_per_cycle and ram_bytes must be numbers"
        ) from None
    if not (cores >= 1 and 0 < clock_hz < 1e11 and per_cycle >= 1 and ram >= 1):
        raise TraceError(
            f"CPU record {cpu!r}: impossible cores ({cores}), clock ({clock_hz:g} Hz), FLOP/cycle or RAM ({ram} bytes)"
        )
    return dataclasses.replace(
        base,
        name=f"host-cpu-{cores}c",
        peak_flops_per_s=cores * clock_hz * per_cycle,
        hbm_capacity_bytes=ram,
        source=f"{origin}: {cpu.get('model') or 'cpu'}, {cores} cores x {clock_hz / 1e9:.2f} GHz x {per_cycle} FLOP/cycle",
    )


def host_cpu_spec(cores: int | None = None) -> HardwareSpec:
    """The `host-cpu` entry rescaled to the running machine (cores, ISA, current clock, RAM)."""
    return cpu_spec(read_host_cpu(), cores)


if __name__ == "__main__":
    for spec in HARDWARE.values():
        sms, clock, l2 = spec.num_sms, spec.sustained_clock_hz, spec.l2_bytes
        chip = (
            f" {sms:4d} SMs {clock / 1e9:.2f} GHz L2 {l2 / MIB:4.0f} MiB"
            if spec.has_chip_layout and sms is not None and clock is not None and l2 is not None
            else ""
        )
        print(
            f"{spec.name:10s} {spec.peak_flops_per_s / 1e12:8.1f} TFLOP/s "
            f"{spec.hbm_bytes_per_s / 1e12:6.3f} TB/s {spec.hbm_capacity_bytes / GIB:6.0f} GiB "
            f"ridge {spec.ridge_flops_per_byte:6.1f} FLOP/B{chip}  ({spec.source})"
        )
