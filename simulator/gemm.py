"""Tile-and-wave model of one GEMM kernel on a GPU: how output tiles fill the chip.

What: an (M tokens) x K @ K x N GEMM (QKV, output projection, MLP up/gate and down, LM head) runs
as ceil(M/tm) x ceil(N/tn) output tiles (times `split` slices of K for split-K), dispatched in
waves of num_sms x CTAs-per-SM tiles. Concurrent CTAs on one SM share its tensor cores, so a
wave's compute time is its busiest SM's tile count x one tile's time at the SM's peak (a wave of
5 tiles on 4 SMs takes two tile-times, one of 4 tiles one). One tile's time is its k-iterations
(plus `fill_iters` of pipeline prologue and epilogue), each limited either by the tensor cores (at
`tensor_eff` of the SM's peak: the part's peak at its sustained clock over its SMs) or by feeding
the tile's operands from L2 (`feed_bytes_per_clock` per SM: small tiles reuse less). A partial last
wave recovers `tail_share` of its idle SMs' time (the compute is (1 - s) x the quantized waves +
s x the same tiles spread evenly over every SM, never below one tile-time and its fill): on the A100 data a partial wave runs faster than a
full one, as its SMs share L2, HBM and the power budget with fewer others, and the libraries'
split-K and stream-K kernels fill part of the tail; a persistent kernel (Hopper's) schedules
stream-K and recovers the whole tail. The memory
time is the kernel's HBM bytes (operands not reused from L2, plus outputs and split-K partials)
at `memory_eff` of the HBM bandwidth. Every full wave carries the same bytes per tile, so the
waves' compute and memory times are summed first and overlapped once, as a p-norm
(`overlap_p`: large p is max(compute, memory), 1 is their sum), or for a warp-specialized kernel
(Hopper's: producer warps load with TMA while consumer warps compute) as max(compute, memory +
its pipeline fill); plus `launch_overheads` launches per kernel. The tile shape and split-K
come from the architecture family's usual kernels (`TILES`): the fastest, or with `choice_q` > 0
a power mean (exponent -q) over the tile shapes, each at its best split-K, which stays close to
the fastest but admits that library heuristics do not always pick it. The pipeline fill is paid
once per batch of resident CTAs on an SM.

Why: a smooth roofline with one fill curve cannot express wave quantization (a GEMM of 109 tiles
on 108 SMs takes two waves), which is where the old model's errors on mid-size token counts
swing in sign; and efficiencies that describe a tile, not a whole op, carry to parts with other
SM counts, clocks and bandwidths (NeuSight, ASPLOS 2025: per-tile utilisation bounded by the
roofline, counted over waves). Monotone by construction: more tokens never mean fewer tiles,
waves or bytes; more SMs or bandwidth never mean more waves, fewer reused bytes or slower
tiles; the tail blend is a positive mix of two such counts (waves and tiles / SMs); a minimum or
power mean over kernels of monotone times is monotone.

Vectorised over M (floats or numpy arrays) and over the candidate kernels (`_Candidates`: every
tile shape and split-K as one row of arrays, timed together); the other arguments are scalars.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.hardware import HardwareSpec

Number = float | np.ndarray


@dataclass(frozen=True)
class Tile:
    """One kernel's output tile per SM (tm x tn), k-step tk and resident CTAs per SM.

    `operand_share` > 1: SMs that compute one MMA together (Blackwell's 2-SM CTA pair) each load
    1/share of its operands from L2 (the label then names the pair's tile).
    `cluster` > 1: a thread-block cluster of that many CTAs on as many SMs computes tiles that
    neighbour across the tile's shorter side, so they need the same operand slab along its longer
    side, which TMA multicast reads from L2 once for all of them (Hopper and later): each SM reads
    its own shorter-side slab and 1/cluster of the longer side's (label suffix `c2`).
    `persistent`: the kernel keeps its CTAs resident and walks the tiles, each tile's prologue and
    epilogue hidden behind the others' main loops, so an SM pays `fill_iters` once per kernel.
    `warp_specialized`: producer warps stream the operands in with asynchronous copies (TMA) while
    consumer warps compute, so the kernel's HBM traffic hides under its compute or the reverse,
    all but its pipeline fill (the first loads and the last stores, with no stream to hide under):
    its time is max(compute, memory + fill) instead of the `overlap_p` norm of both.
    """

    tm: int
    tn: int
    tk: int
    ctas_per_sm: int = 1
    operand_share: int = 1
    cluster: int = 1
    persistent: bool = False
    warp_specialized: bool = False

    @property
    def label(self) -> str:
        suffix = f"c{self.cluster}" if self.cluster > 1 else ""
        if self.operand_share > 1:
            return f"{self.tm * self.operand_share}x{self.tn}x{self.tk}/{self.operand_share}sm{suffix}"
        return f"{self.tm}x{self.tn}x{self.tk}{suffix}"

    @property
    def feed_bytes_per_k(self) -> float:
        """Operand elements one SM reads from L2 per element of K (times the dtype's bytes)."""
        long_side, short_side = max(self.tm, self.tn), min(self.tm, self.tn)
        return (short_side + long_side / self.cluster) / self.operand_share


# Tile shapes per architecture family, from the kernels the vendor libraries ship:
# - ampere/ada (mma.sync, cp.async): cuBLAS sm80 kernel names (ampere_h16816gemm_256x128_...,
#   128x256, 128x128, 128x64, 64x128, 64x64) and CUTLASS's default sm80 tile list; the 256-wide
#   tiles fill 164 KB of shared memory at 3 stages (1 CTA/SM), the smaller ones fit 2.
# - hopper (wgmma, TMA): cuBLAS sm90 kernels tilesize128x256x64, 256x128x64, 128x128x64,
#   64x256x64, 64x128x64 (warpgroup M granularity is 64), in clusters of 2 CTAs whose shared
#   operand slab TMA multicasts (the cluster shape 2x1x1 / 1x2x1 in CUTLASS 3's sm90 kernel names;
#   the Hopper whitepaper's thread block clusters and TMA multicast), run as persistent
#   warp-specialized kernels (CUTLASS 3's sm90 TMA warp-specialized cooperative and ping-pong
#   kernels: the resident CTAs walk the tiles, a tile's prologue and epilogue overlapping the
#   next one's main loop), so an SM pays the pipeline fill once per kernel. Both chosen on the dev
#   half of XLA's H100 table (bench/cost_model.py --transfer --half dev) and reported on its test
#   half (docs/cost_model.md); the A100 fit never sees them. The persistent kernels' tile
#   scheduler is stream-K (CUTLASS 3's sm90 stream-K scheduler; cuBLAS's in-kernel "segment_k"
#   variants): the k-iterations of what would be a partial last wave are divided evenly among
#   the SMs, so the tail is recovered whole (seen on the project's H200 grid: mid-size token
#   counts were predicted 10-29% slow; docs/cost_model.md has the dev and test halves).
# - blackwell (tcgen05): CUTLASS sm100 2-SM tiles 256x256 and 256x128 (a CTA pair computes one
#   MMA, each SM holding 128 rows and loading half of each operand: the Blackwell technical
#   brief's "2-SM" UMMA) and 1-SM tiles 128x256, 256x128, 128x128, 64x256 (minimum M 64).
# - every family: 16- and 32-row tiles stand for the small-M kernels (gemv-like, or Hopper's
#   swapped operands) the libraries use for a few tokens, so 3 tokens are not padded to 64 rows.
# - cdna3 (MFMA): hipBLASLt MI300X macro tiles 256x256x64, 256x128x64, 128x256x64, 128x128x64,
#   64x128x64, 64x64x64.
_SMALL_M = (Tile(16, 128, 64, 2), Tile(32, 128, 64, 2))
TILES: dict[str, tuple[Tile, ...]] = {
    "ampere": (
        Tile(256, 128, 32),
        Tile(128, 256, 32),
        Tile(128, 128, 32, 2),
        Tile(128, 64, 32, 2),
        Tile(64, 128, 32, 2),
        Tile(64, 64, 64, 2),
        *_SMALL_M,
    ),
    "hopper": (
        Tile(128, 256, 64, cluster=2, persistent=True, warp_specialized=True),
        Tile(256, 128, 64, cluster=2, persistent=True, warp_specialized=True),
        Tile(128, 128, 64, cluster=2, persistent=True, warp_specialized=True),
        Tile(64, 256, 64, cluster=2, persistent=True, warp_specialized=True),
        Tile(64, 128, 64, 2, cluster=2, persistent=True, warp_specialized=True),
        *_SMALL_M,
    ),
    "blackwell": (
        Tile(128, 256, 64, operand_share=2),
        Tile(128, 128, 64, operand_share=2),
        Tile(128, 256, 64),
        Tile(256, 128, 64),
        Tile(128, 128, 64),
        Tile(64, 256, 64),
        *_SMALL_M,
    ),
    "cdna3": (
        Tile(256, 256, 64),
        Tile(256, 128, 64),
        Tile(128, 256, 64),
        Tile(128, 128, 64),
        Tile(64, 128, 64, 2),
        Tile(64, 64, 64, 2),
        *_SMALL_M,
    ),
}
TILES["ada"] = TILES["ampere"]
# Split-K slices tried when the output tiles alone would leave SMs idle (cuBLAS splits K for
# small M x N, then reduces the fp32 partials in a second kernel).
SPLITS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
MIN_SPLIT_ITERS = 4  # a split-K slice keeps at least this many k-iterations
# Families whose split-K reduces its partials inside the GEMM kernel, with no second launch:
# cuBLAS sm90 kernels' "segment_k" variants and CUTLASS 3's split-K / stream-K fix-up through a
# workspace (Hopper and Blackwell); cuBLAS on Ampere launches a separate splitKreduce kernel.
IN_KERNEL_SPLIT_K: frozenset[str] = frozenset({"hopper", "blackwell"})
PARTIAL_BYTES = 4  # split-K partial sums are fp32


@dataclass(frozen=True)
class GemmParams:
    """Per-tile efficiencies, fitted once on A100 data and carried to every NVIDIA part."""

    tensor_eff: float = 0.9  # fraction of an SM's tensor peak inside a full tile
    fill_iters: float = 2.0  # pipeline prologue + epilogue, in k-iterations of the tile
    feed_bytes_per_clock: float = 48.0  # operand bytes one SM pulls from L2 per clock
    memory_eff: float = 0.8  # fraction of HBM bandwidth a wave's streams reach
    launch_overheads: float = 1.5  # fixed cost per kernel, in the part's launch overheads
    overlap_p: float = 3.0  # a wave's compute and memory overlap as a p-norm (large p: max)
    choice_q: float = 0.0  # 0: the fastest kernel; q > 0: a power mean (exponent -q) of all
    tail_share: float = 0.0  # share of a partial last wave's idle SM time recovered (0: pure waves)

    def __post_init__(self) -> None:
        bounds = {
            "tensor_eff": (0, 1),
            "memory_eff": (0, 1),
            "feed_bytes_per_clock": (0, None),
            "launch_overheads": (0, None),
            "fill_iters": (None, None),
            "overlap_p": (None, None),
            "choice_q": (None, None),
            "tail_share": (None, 1),
        }
        minimum = {"fill_iters": 0.0, "overlap_p": 1.0, "choice_q": 0.0, "tail_share": 0.0}
        for name, (low, high) in bounds.items():
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not math.isnan(value)
            ok = ok and (value > low if low is not None else value >= minimum[name])
            ok = ok and (high is None or value <= high)
            if not ok:
                raise ValueError(f"GemmParams.{name} out of range: {value!r}")

    def to_json(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GemmParams:
        """Every field, by name (a ValueError names what is missing or unknown; the values are
        checked by __post_init__)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != fields:
            got = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"GemmParams needs exactly {', '.join(sorted(fields))}; got {got}")
        return cls(**data)


@dataclass(frozen=True)
class KernelTimes:
    """The kernel chosen for each M, with the terms --explain prints."""

    time_s: Number
    tile: list[str]  # label of the chosen tile per M (scalars: one entry)
    split: Number
    tiles: Number  # output tiles x split
    waves: Number
    compute_s: Number  # sum over waves of the compute term
    memory_s: Number  # sum over waves of the memory term
    ideal_s: Number  # useful FLOPs at the part's tensor peak x tensor_eff, or bytes, if larger


@dataclass(frozen=True)
class _Candidates:
    """The kernels the library could run for one K: every (tile, split) pair as one row of (C, 1)
    columns, so that `_kernels` times them all for every M in one set of array operations."""

    tiles: tuple[Tile, ...]  # the tile of each candidate
    split: np.ndarray
    tm: np.ndarray
    tn: np.ndarray
    tk: np.ndarray
    ctas_per_sm: np.ndarray
    persistent: np.ndarray  # bool
    warp_specialized: np.ndarray  # bool
    feed_bytes_per_k: np.ndarray

    @classmethod
    @functools.lru_cache(maxsize=1024)  # a fit asks for the same few K hundreds of times
    def of(cls, k: float, tiles: tuple[Tile, ...], splits: tuple[int, ...]) -> _Candidates:
        """Each tile shape with each split-K whose slices keep at least MIN_SPLIT_ITERS k-iterations
        (cached: read only)."""
        pairs = []
        for tile in tiles:
            iters = np.ceil(k / tile.tk)
            for split in splits:
                if split > 1 and iters / split < MIN_SPLIT_ITERS:
                    break
                pairs.append((tile, split))

        def column(values: list, dtype: type = float) -> np.ndarray:
            return np.array(values, dtype=dtype).reshape(-1, 1)

        chosen = [tile for tile, _ in pairs]
        return cls(
            tiles=tuple(chosen),
            split=column([split for _, split in pairs]),
            tm=column([t.tm for t in chosen]),
            tn=column([t.tn for t in chosen]),
            tk=column([t.tk for t in chosen]),
            ctas_per_sm=column([t.ctas_per_sm for t in chosen]),
            persistent=column([t.persistent for t in chosen], bool),
            warp_specialized=column([t.warp_specialized for t in chosen], bool),
            feed_bytes_per_k=column([t.feed_bytes_per_k for t in chosen]),
        )

    @functools.cached_property
    def rows_per_tile(self) -> dict[Tile, list[int]]:
        """The candidates of each tile shape (its split-K choices), tiles in table order (found once
        per cached set of candidates)."""
        rows: dict[Tile, list[int]] = {}
        for i, tile in enumerate(self.tiles):
            rows.setdefault(tile, []).append(i)
        return rows


def _kernels(
    m: np.ndarray, k: float, n: float, c: _Candidates, hw: HardwareSpec, p: GemmParams, dtype_bytes: int
) -> tuple[np.ndarray, ...]:
    """(time, tiles, waves, compute, memory) of every candidate kernel (rows) for every M (columns)."""
    assert hw.num_sms is not None and hw.sustained_clock_hz is not None, "gemm_kernel checks has_chip_layout"
    m = m.reshape(1, -1)
    sms = float(hw.num_sms)
    split, ctas = c.split, c.ctas_per_sm
    rows, cols = np.ceil(m / c.tm), np.ceil(n / c.tn)
    tiles = rows * cols * split
    per_wave = sms * ctas
    full_waves = np.floor(tiles / per_wave)
    last = tiles - full_waves * per_wave  # tiles of the last, partial wave
    iters = np.ceil(np.ceil(k / split) / c.tk)
    clock = hw.sustained_clock_hz
    iter_s = np.maximum(
        2.0 * c.tm * c.tn * c.tk / (hw.sm_peak_flops_per_s * p.tensor_eff),
        c.feed_bytes_per_k * c.tk * dtype_bytes / (p.feed_bytes_per_clock * clock),
    )
    # busiest SM of each wave: ctas_per_sm tiles in a full wave, ceil(last / SMs) in the last
    busiest = full_waves * ctas + np.ceil(last / sms)
    # Pipeline fill: a CTA's prologue and epilogue overlap the main loop of the other CTAs
    # resident on its SM, so an SM pays the fill once per ctas_per_sm tiles (1-CTA tiles: per tile);
    # a persistent kernel once in all.
    fills = np.where(c.persistent, 1.0, np.ceil(busiest / ctas))
    quantized = busiest * iters + fills * p.fill_iters
    # A partial last wave recovers `tail_share` of its idle SMs' time: the compute blends the
    # quantized waves with the fluid time of the same tiles spread evenly over every SM, but no
    # kernel is faster than one tile-time and its fill (fewer tiles than SMs: only split-K spreads
    # the work).
    spread = np.maximum(tiles / sms, 1.0)  # tile-times per SM with the tiles spread evenly
    # the fill once per ctas_per_sm tiles an SM runs, and at least once (as in the quantized waves)
    fluid_fill = np.where(c.persistent, 1.0, np.maximum(spread / ctas, 1.0)) * p.fill_iters
    fluid = spread * iters + fluid_fill
    # A persistent kernel schedules stream-K: its CTAs divide the k-iterations of the tiles that
    # would form the partial last wave evenly among every SM (fixing up the shared tiles' partial
    # sums in the kernel), so it recovers the whole tail; other kernels recover `tail_share`.
    tail = np.where(c.persistent, 1.0, p.tail_share)
    compute = ((1.0 - tail) * quantized + tail * fluid) * iter_s
    bandwidth = hw.hbm_bytes_per_s * p.memory_eff
    memory = _hbm_bytes(m, k, n, rows, cols, per_wave, split, hw, dtype_bytes) / bandwidth
    # Every full wave streams the same share of the bytes per tile, so summing the waves'
    # overlapped times equals overlapping the sums (up to the last wave), and the sum stays
    # monotone in M: the overlap is taken once, over the kernel.
    # A warp-specialized kernel's loads run beside its math (max), all but its pipeline fill (the
    # first loads and the last stores, with no stream to hide under); others overlap them partly.
    exposed = fills * p.fill_iters * iter_s
    time = np.where(c.warp_specialized, np.maximum(compute, memory + exposed), _pnorm(compute, memory, p.overlap_p))
    # Split-K reduces its partials in a second kernel, or (IN_KERNEL_SPLIT_K) inside the GEMM one.
    launches = np.where((split == 1) | (hw.arch in IN_KERNEL_SPLIT_K), 1.0, 2.0)
    time = time + launches * p.launch_overheads * hw.launch_overhead_s
    # the reduction reads every partial and writes the output
    time = time + np.where(split > 1, m * n * (split * PARTIAL_BYTES + dtype_bytes) / bandwidth, 0.0)
    waves = full_waves + (last > 0)
    shape = time.shape
    return time, np.broadcast_to(tiles, shape), np.broadcast_to(waves, shape), compute, np.broadcast_to(memory, shape)


def _pnorm(a: np.ndarray, b: np.ndarray, power: float) -> np.ndarray:
    """(a^p + b^p)^(1/p): between max(a, b) (p large) and a + b (p = 1), monotone in both."""
    top = np.maximum(np.maximum(a, b), 1e-30)
    return top * ((a / top) ** power + (b / top) ** power) ** (1.0 / power)


def _hbm_bytes(
    m: np.ndarray,
    k: float,
    n: float,
    rows: np.ndarray,
    cols: np.ndarray,
    per_wave: np.ndarray,
    split: np.ndarray,
    hw: HardwareSpec,
    dtype_bytes: int,
) -> np.ndarray:
    """HBM bytes of each kernel: each operand once if it stays in L2 across waves, else once per
    band of the output a wave covers (a wave spans a near-square block of tiles); outputs (and
    split-K partials) once."""
    a_bytes, w_bytes = m * k * dtype_bytes, k * n * dtype_bytes
    out_bytes = m * n * np.where(split == 1, dtype_bytes, PARTIAL_BYTES * split)
    # A wave covers about sqrt(S) x sqrt(S) tiles (fewer rows when M is short, then wider);
    # continuous in S so that more SMs never mean more passes.
    wave_rows = np.minimum(rows, np.sqrt(per_wave / split))
    wave_cols = np.minimum(cols, per_wave / split / wave_rows)
    assert hw.l2_bytes is not None, "gemm_kernel checks has_chip_layout"
    resident = hw.l2_bytes / 2  # half of L2 for an operand kept across waves
    w_passes = np.where(w_bytes <= resident, 1.0, np.ceil(rows / wave_rows))
    a_passes = np.where(a_bytes <= resident, 1.0, np.ceil(cols / wave_cols))
    return a_bytes * a_passes + w_bytes * w_passes + out_bytes


def tile_shape_times(
    m: np.ndarray, k: float, n: float, hw: HardwareSpec, p: GemmParams, dtype_bytes: int = 2
) -> dict[str, np.ndarray]:
    """Seconds of each of `hw.arch`'s tile shapes at its best split-K, per M (label -> times): the
    candidates `gemm_kernel`'s choice weighs (bench/cost_model.py --choice studies that choice)."""
    if not hw.has_chip_layout or hw.arch is None:
        raise ValueError(f"hardware {hw.name!r} has no chip layout (num_sms, clocks, L2, arch)")
    m_arr = np.atleast_1d(np.asarray(m, dtype=float))
    candidates = _Candidates.of(float(k), TILES[hw.arch], SPLITS)
    times = _kernels(m_arr, k, n, candidates, hw, p, dtype_bytes)[0]
    return {tile.label: times[rows].min(axis=0) for tile, rows in candidates.rows_per_tile.items()}


def gemm_kernel(
    m: Number,
    k: float,
    n: float,
    hw: HardwareSpec,
    p: GemmParams,
    dtype_bytes: int = 2,
    tiles: tuple[Tile, ...] | None = None,
    splits: tuple[int, ...] = SPLITS,
) -> KernelTimes:
    """The fastest kernel of `hw.arch`'s tiles (or `tiles`) and split-K choices for each M."""
    if not hw.has_chip_layout or hw.arch is None:
        raise ValueError(f"hardware {hw.name!r} has no chip layout (num_sms, clocks, L2, arch)")
    scalar = not isinstance(m, np.ndarray)
    m_arr = np.atleast_1d(np.asarray(m, dtype=float))
    candidates = _Candidates.of(float(k), TILES[hw.arch] if tiles is None else tuple(tiles), tuple(splits))
    terms = _kernels(m_arr, k, n, candidates, hw, p, dtype_bytes)
    times = terms[0]  # (candidates, M)
    best = np.argmin(times, axis=0)
    cols = np.arange(m_arr.size)
    chosen = times[best, cols]
    if p.choice_q > 0:  # heuristics pick roughly, not exactly, the fastest tile shape
        chosen = chosen * _tile_power_mean(times / chosen, candidates.rows_per_tile, p.choice_q)

    def pick(index: int) -> np.ndarray:
        return terms[index][best, cols]

    useful_s = 2.0 * m_arr * k * n / (hw.peak_flops_per_s * p.tensor_eff)
    bytes_s = (m_arr * k + k * n + m_arr * n) * dtype_bytes / (hw.hbm_bytes_per_s * p.memory_eff)
    result = KernelTimes(
        time_s=chosen,
        tile=[candidates.tiles[i].label for i in best],
        split=candidates.split[best, 0],
        tiles=pick(1),
        waves=pick(2),
        compute_s=pick(3),
        memory_s=pick(4),
        ideal_s=np.maximum(useful_s, bytes_s),
    )
    if scalar:
        firsts: dict[str, Any] = {
            f.name: float(getattr(result, f.name)[0]) for f in dataclasses.fields(result) if f.name != "tile"
        }
        return dataclasses.replace(result, **firsts)
    return result


def _tile_power_mean(ratios: np.ndarray, rows_per_tile: dict[Tile, list[int]], q: float) -> np.ndarray:
    """Power mean (exponent -q) over tile shapes of each shape's best split-K, per M.

    Split-K is the library's rule for filling the SMs with a given tile (here: its best split);
    the uncertain choice is among tile shapes, each counted once, so that the spread does not
    grow with the number of split-K options a long K allows."""
    best_per_tile = [np.min(ratios[rows], axis=0) for rows in rows_per_tile.values()]
    return np.mean(np.stack(best_per_tile) ** -q, axis=0) ** (-1 / q)


def gemm_time_s(m: Number, k: float, n: float, hw: HardwareSpec, p: GemmParams, dtype_bytes: int = 2) -> Number:
    """Seconds of the fastest kernel for an (m x k) @ (k x n) GEMM."""
    return gemm_kernel(m, k, n, hw, p, dtype_bytes).time_s


def bound(kernel: KernelTimes, index: int = 0) -> str:
    """Why the kernel takes its time: "compute", "memory", "wave" (quantization: the waves'
    compute time, less the share of the last wave recovered, exceeds the ideal by over 15%) or
    "launch" (fixed costs are most of it)."""

    def at(value: Any) -> float:
        return float(np.atleast_1d(value)[index])

    time_s, compute_s, memory_s = at(kernel.time_s), at(kernel.compute_s), at(kernel.memory_s)
    busy_s = max(compute_s, memory_s)
    if busy_s < 0.5 * time_s:
        return "launch"
    if compute_s >= memory_s:
        return "wave" if compute_s > 1.15 * at(kernel.ideal_s) else "compute"
    return "memory"
