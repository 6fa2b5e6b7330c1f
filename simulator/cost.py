"""Cost model: the time of one forward pass from its query tokens and KV reads.

What: each operator of a transformer layer (named as in the public vidur profiling data:
`input_layernorm`, `attn_pre_proj`, `attn_rope`, `attn_prefill`/`attn_decode`, `attn_post_proj`,
`post_attention_layernorm`, `mlp_up_proj`, `mlp_act`, `mlp_down_proj`, `add`), plus the per-pass
`emb` and `lm_head`, costs

    t = launches * launch_overhead_s * overhead_launches + smoothmax_p(t_compute, t_memory)
    t_compute = FLOPs / (peak_flops_per_s * e_c(n)),  e_c(n) = compute_eff_max * n / (n + n_half)
    t_memory  = bytes / (hbm_bytes_per_s * memory_eff)

a roofline (Williams et al., CACM 2009) whose compute roof fills up with the token count n (GEMM
tiles and waves are mostly empty at small n), smoothed at the ridge by a p-norm
(smoothmax_p(a, b) = (a^p + b^p)^(1/p)) because real kernels bend rather than kink there. The four
numbers per op family (`OpEfficiency`) are priors from `HardwareSpec` or fitted by
`simulator.calibrate` on measured data. With tensor parallelism, weights and heads are sharded
(norms, residual adds stay whole, as in the vidur data) and two ring all-reduces per layer are
added.

On a GPU with a chip layout in the catalog (`HardwareSpec.has_chip_layout`: SMs, clocks, L2,
architecture), the GEMMs (`GEMM_OPS`: fused QKV, output projection, fused gate+up, down, and
the lm_head) are timed instead by the tile-and-wave model of `simulator.gemm`, whose per-tile
parameters (`CostParams.gemm`) are fitted once on the A100 data and serve every NVIDIA part
(docs/cost_model.md). CPUs keep the roofline for every op.

Attention is described by `num_tokens` query rows, `kv_tokens_read` (the sum over query rows of
the KV slots each row can see, as the trace's `steps.parquet` records it) and `query_groups`, the
number of independent streams the rows come in (1 for a prefill or one diffusion span, B for B
sequences decoding one token each). Rows of one group share their KV, so a FlashAttention-style
kernel loads each KV block once per tile of `q_tile_tokens` rows (Dao, FlashAttention-2, 2023);
a lone row (decode) streams its whole visible KV. The pass is `attn_decode` when every group has
one row, `attn_prefill` otherwise; the other key is 0. A mixed batch (a prefill chunk plus decode
rows) is approximated by its mean rows per group. The attention efficiencies are priors
(FlashAttention-2's reported A100 throughput): the public data holds no attention kernels.

Why vectorised and cached: the replay calls `step_time_s` millions of times. Every term except
attention depends only on the token counts, so it is cached per (tokens, logit tokens); the
formulas are plain arithmetic that work on Python floats (scalar calls, a few microseconds) and on
numpy arrays (a whole trace at once).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from profiler.errors import is_count
from simulator.gemm import GemmParams, KernelTimes, gemm_kernel
from simulator.hardware import HARDWARE, HardwareSpec
from simulator.models import ModelSpec

Number = float | np.ndarray

LAYER_OPS: tuple[str, ...] = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_prefill",
    "attn_decode",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
# The op families whose efficiencies are fitted together. The two norms are the same kernel;
# lm_head is a wide GEMM like the fused gate+up projection.
OP_FAMILY: dict[str, str] = {
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "attn_pre_proj": "qkv_proj",
    "attn_post_proj": "o_proj",
    "mlp_up_proj": "up_proj",
    "mlp_down_proj": "down_proj",
    "lm_head": "up_proj",
    "attn_rope": "rope",
    "mlp_act": "act",
    "add": "add",
    "emb": "emb",
    "attn_prefill": "attention_prefill",
    "attn_decode": "attention_decode",
}
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(OP_FAMILY.values()))
MATMUL_FAMILIES: tuple[str, ...] = ("qkv_proj", "o_proj", "up_proj", "down_proj")
# The GEMMs the tile-and-wave model (simulator.gemm) times on GPUs with a chip layout.
GEMM_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "lm_head")
GEMM_TABLE_TOKENS = 8192  # integer token counts up to this are looked up in a per-model table
RESIDUAL_ADDS_PER_LAYER = 2  # after attention and after the MLP (vidur times one of them)

CALIBRATION_PATH = Path(__file__).parent / "data" / "a100_calibration.json"


@dataclass(frozen=True)
class OpEfficiency:
    """Achieved efficiency of one op family (see the module docstring for the formula)."""

    compute_eff_max: float  # fraction of peak FLOP/s reached at large token counts
    compute_half_tokens: float  # tokens at which half of compute_eff_max is reached
    memory_eff: float  # fraction of memory bandwidth reached
    overhead_launches: float  # fixed cost per kernel, in units of the part's launch overhead

    def __post_init__(self) -> None:
        for name in ("compute_eff_max", "compute_half_tokens", "memory_eff"):
            if not getattr(self, name) > 0:
                raise ValueError(f"OpEfficiency.{name} must be > 0, got {getattr(self, name)!r}")
        if not self.overhead_launches >= 0:
            raise ValueError(f"OpEfficiency.overhead_launches must be >= 0, got {self.overhead_launches!r}")


@dataclass(frozen=True)
class CostParams:
    """Everything the cost model needs besides the hardware and model specs."""

    families: Mapping[str, OpEfficiency]
    smooth_p: float = 4.0  # sharpness of the roofline ridge (large = hard max)
    q_tile_tokens: int = 128  # query rows sharing one KV load (FlashAttention-2 block size)
    step_overhead_s: float = 0.0  # per forward pass: host scheduling, sampling (fit from traces)
    source: str = "prior"
    gemm: GemmParams | None = None  # tile-and-wave GEMM model (GPUs); None: GEMMs use `families`

    def __post_init__(self) -> None:
        missing = [name for name in FAMILIES if name not in self.families]
        if missing:
            raise ValueError(f"CostParams lacks op families: {', '.join(missing)}")

    @classmethod
    def prior(cls, hardware: HardwareSpec) -> CostParams:
        """Uncalibrated priors from the part's datasheet efficiencies."""
        # GPU GEMMs need ~64+ rows to fill their tiles (the A100 fit gives ~73); CPU GEMM
        # kernels (oneDNN, MKL) run near their vector peak from a few rows on.
        half_tokens = 64.0 if hardware.kind == "gpu" else 2.0
        matmul = OpEfficiency(hardware.matmul_efficiency, half_tokens, hardware.memory_efficiency, 1.0)
        elementwise = OpEfficiency(0.1, 1.0, hardware.memory_efficiency, 1.0)
        families = {name: matmul for name in MATMUL_FAMILIES}
        families.update({name: elementwise for name in ("norm", "rope", "act", "add", "emb")})
        # FlashAttention-2 forward reaches 50-73% of A100 peak (Dao 2023, section 4.1);
        # decode attention is a bandwidth-bound stream over the KV cache.
        families["attention_prefill"] = OpEfficiency(
            0.6 * hardware.matmul_efficiency / 0.7, 128.0, hardware.memory_efficiency, 1.0
        )
        families["attention_decode"] = OpEfficiency(0.3, 1.0, hardware.memory_efficiency, 1.0)
        gemm = None
        if hardware.has_chip_layout:
            gemm = GemmParams(tensor_eff=hardware.matmul_efficiency / 0.8, memory_eff=hardware.memory_efficiency)
        return cls(families=families, source=f"prior({hardware.name})", gemm=gemm)

    def scaled_to(self, hardware: HardwareSpec, reference: HardwareSpec) -> CostParams:
        """Carry efficiencies fitted on `reference` to `hardware` by the ratio of their priors.

        An assumption, not a measurement: a part whose GEMMs reach a smaller fraction of peak
        (its `matmul_efficiency` prior) is assumed to do so for every op family alike.
        """
        compute_ratio = hardware.matmul_efficiency / reference.matmul_efficiency
        memory_ratio = hardware.memory_efficiency / reference.memory_efficiency
        families = {
            name: dataclasses.replace(
                eff,
                compute_eff_max=min(eff.compute_eff_max * compute_ratio, 0.98),
                memory_eff=min(eff.memory_eff * memory_ratio, 0.98),
            )
            for name, eff in self.families.items()
        }
        gemm = self.gemm
        if gemm is not None:  # 1.0 between NVIDIA parts: one tile fit serves all of them
            gemm = dataclasses.replace(
                gemm,
                tensor_eff=min(gemm.tensor_eff * compute_ratio, 1.0),
                memory_eff=min(gemm.memory_eff * memory_ratio, 1.0),
            )
        return dataclasses.replace(
            self, families=families, gemm=gemm, source=f"{self.source} carried to {hardware.name}"
        )

    def scaled(self, compute: float, memory: float) -> CostParams:
        """Every compute and every memory efficiency times a factor (each capped at 1)."""
        families = {
            name: dataclasses.replace(
                eff,
                compute_eff_max=min(eff.compute_eff_max * compute, 1.0),
                memory_eff=min(eff.memory_eff * memory, 1.0),
            )
            for name, eff in self.families.items()
        }
        gemm = self.gemm and dataclasses.replace(
            self.gemm,
            tensor_eff=min(self.gemm.tensor_eff * compute, 1.0),
            memory_eff=min(self.gemm.memory_eff * memory, 1.0),
        )
        return dataclasses.replace(self, families=families, gemm=gemm)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["families"] = {name: dataclasses.asdict(eff) for name, eff in self.families.items()}
        data["gemm"] = None if self.gemm is None else self.gemm.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CostParams:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {key: value for key, value in data.items() if key in known}
        kwargs["families"] = {name: OpEfficiency(**eff) for name, eff in data["families"].items()}
        if kwargs.get("gemm") is not None:
            kwargs["gemm"] = GemmParams.from_json(kwargs["gemm"])
        return cls(**kwargs)


@functools.lru_cache(maxsize=1)
def load_a100_params() -> CostParams:
    """The A100-calibrated params shipped in `simulator/data/a100_calibration.json`."""
    with CALIBRATION_PATH.open(encoding="utf-8") as handle:
        return CostParams.from_json(json.load(handle)["params"])


def default_params(hardware: HardwareSpec) -> CostParams:
    """A100 calibration carried to any GPU (`CostParams.scaled_to`), with the part's own GEMM
    calibration (`HardwareSpec.gemm_fit`) when it has one; priors for CPUs."""
    if hardware.kind != "gpu":
        return CostParams.prior(hardware)
    reference = HARDWARE["a100-80g"]
    if hardware == reference:
        return load_a100_params()
    params = load_a100_params().scaled_to(hardware, reference)
    if hardware.gemm_fit is not None:  # the part's own GEMM calibration (solm calibrate)
        gemm = GemmParams(**dict(hardware.gemm_fit))
        params = dataclasses.replace(
            params, gemm=gemm, source=f"{params.source}; GEMMs: a calibration on measured GEMMs"
        )
    return params


# (flops, bytes, launches) of one op; arrays when the token counts are arrays.
Work = tuple[Number, Number, Number]


def layer_work(model: ModelSpec, num_tokens: Number, tensor_parallel: int = 1) -> dict[str, Work]:
    """FLOPs and bytes of the non-attention ops of one layer on one shard, for n query tokens.

    GEMM bytes = weights + input + output activations; elementwise bytes = reads + writes.
    """
    n, b, d = num_tokens, model.dtype_bytes, model.d_model
    q = model.q_dim / tensor_parallel
    kv = max(model.n_kv_heads // tensor_parallel, 1) * model.head_dim  # KV heads replicate
    ff = model.d_ff / tensor_parallel
    up = ff * (2 if model.gated_mlp else 1)

    def gemm(k_dim: float, n_dim: float) -> Work:  # (n, k_dim) @ (k_dim, n_dim)
        return 2 * n * k_dim * n_dim, b * (k_dim * n_dim + n * k_dim + n * n_dim), 1.0

    norm = (5 * n * d, b * (2 * n * d + d), 1.0)  # square, mean, rsqrt, scale, weight
    work = {
        "input_layernorm": norm,
        "attn_pre_proj": gemm(d, q + 2 * kv),
        # rotate q and k in place; read the cos/sin rows of each position
        "attn_rope": (3 * n * (q + kv), b * (2 * n * (q + kv) + 2 * n * model.head_dim), 1.0),
        "attn_post_proj": gemm(q, d),
        "post_attention_layernorm": (0.0, 0.0, 0.0) if model.parallel_attn_mlp else norm,
        "mlp_up_proj": gemm(d, up),
        # gated: act(gate) * up reads two (n, ff) tensors, writes one; plain: read one, write one
        "mlp_act": (5 * n * ff, b * n * ff * (3 if model.gated_mlp else 2), 1.0),
        "mlp_down_proj": gemm(ff, d),
        "add": (
            RESIDUAL_ADDS_PER_LAYER * n * d,
            RESIDUAL_ADDS_PER_LAYER * b * 3 * n * d,
            float(RESIDUAL_ADDS_PER_LAYER),
        ),
    }
    return work


def gemm_shapes(model: ModelSpec, tensor_parallel: int = 1) -> dict[str, tuple[float, float]]:
    """(K, N) of each GEMM of one shard: (tokens x K) @ (K x N), as `layer_work` counts them."""
    d = model.d_model
    q = model.q_dim / tensor_parallel
    kv = max(model.n_kv_heads // tensor_parallel, 1) * model.head_dim
    ff = model.d_ff / tensor_parallel
    return {
        "attn_pre_proj": (d, q + 2 * kv),  # fused QKV
        "attn_post_proj": (q, d),
        "mlp_up_proj": (d, ff * (2 if model.gated_mlp else 1)),  # fused gate + up
        "mlp_down_proj": (ff, d),
        "lm_head": (d, model.vocab_size / tensor_parallel),
    }


def attention_work(
    model: ModelSpec,
    num_tokens: Number,
    kv_tokens_read: Number,
    query_groups: Number,
    q_tile_tokens: int,
    tensor_parallel: int = 1,
) -> Work:
    """FLOPs and bytes of attention in one layer on one shard.

    FLOPs: QK^T and PV, 2 x head_dim each per (query row, visible slot, query head). Bytes: read
    Q, write O and the new K/V, and read the visible K/V once per tile of rows of one group.
    """
    n, b = num_tokens, model.dtype_bytes
    heads = model.n_heads / tensor_parallel
    kv_bytes_per_token = model.kv_bytes_per_token_per_layer * (
        max(model.n_kv_heads // tensor_parallel, 1) / model.n_kv_heads
    )
    rows_per_group = n / query_groups
    if _is_array(rows_per_group):
        rows_per_group = np.clip(rows_per_group, 1.0, q_tile_tokens)
    else:  # builtins: numpy on scalars costs a microsecond per call
        rows_per_group = min(max(rows_per_group, 1.0), q_tile_tokens)
    flops = 4 * kv_tokens_read * model.head_dim * heads
    bytes_ = (
        2 * n * heads * model.head_dim * b
        + n * kv_bytes_per_token
        + kv_tokens_read * kv_bytes_per_token / rows_per_group
    )
    return flops, bytes_, 1.0


def pass_work(model: ModelSpec, num_tokens: Number, logit_tokens: Number, tensor_parallel: int = 1) -> dict[str, Work]:
    """Once per forward pass: embedding gather, final norm + lm_head over the logit rows."""
    b, d, m = model.dtype_bytes, model.d_model, logit_tokens
    vocab = model.vocab_size / tensor_parallel
    return {
        "emb": (0.0 * num_tokens, b * 2 * num_tokens * d, 1.0),
        "lm_head": (2 * m * d * vocab + 5 * m * d, b * (d * vocab + m * d + m * vocab + 2 * m * d), 2.0),
    }


def roofline_s(work: Work, tokens: Number, eff: OpEfficiency, hardware: HardwareSpec) -> tuple[Number, Number, Number]:
    """(fixed_s, compute_s, memory_s) of one op: the three terms of the module's formula."""
    flops, bytes_, launches = work
    compute_eff = eff.compute_eff_max * tokens / (tokens + eff.compute_half_tokens)
    compute_s = flops / (hardware.peak_flops_per_s * compute_eff)
    memory_s = bytes_ / (hardware.hbm_bytes_per_s * eff.memory_eff)
    fixed_s = launches * hardware.launch_overhead_s * eff.overhead_launches
    return fixed_s, compute_s, memory_s


@functools.lru_cache(maxsize=4096)
def _gemm_table(
    hardware: HardwareSpec, params: GemmParams, k: float, n: float, dtype_bytes: int, size: int
) -> np.ndarray:
    """GEMM seconds for M = 1..size (the replay asks for the same token counts over and over)."""
    m = np.arange(1, size + 1, dtype=float)
    table = np.asarray(gemm_kernel(m, k, n, hardware, params, dtype_bytes).time_s)  # an array for array M
    table.flags.writeable = False
    return table


def gemm_time_lookup_s(
    m: Number, k: float, n: float, hardware: HardwareSpec, params: GemmParams, dtype_bytes: int
) -> Number:
    """`gemm_kernel(...).time_s`, from a cached table for whole token counts up to 8192."""
    if not _is_array(m) and 1 <= m <= GEMM_TABLE_TOKENS and float(m).is_integer():  # a scalar: no numpy checks
        size = max(256, 1 << (int(m) - 1).bit_length())  # the table the array path picks: 2 ** ceil(log2(m))
        return float(_gemm_table(hardware, params, float(k), float(n), dtype_bytes, size)[int(m) - 1])
    values = np.asarray(m, dtype=float)
    top = float(values.max()) if values.size else 1.0
    if top <= GEMM_TABLE_TOKENS and np.all(values == np.floor(values)) and np.all(values >= 1):
        size = max(256, 1 << int(np.ceil(np.log2(top))))
        table = _gemm_table(hardware, params, float(k), float(n), dtype_bytes, size)
        if _is_array(m):
            return table[values.astype(np.int64) - 1]
        return float(table[int(m) - 1])
    return gemm_kernel(m, k, n, hardware, params, dtype_bytes).time_s


def op_time_s(work: Work, tokens: Number, eff: OpEfficiency, hardware: HardwareSpec, smooth_p: float) -> Number:
    """Seconds of one op: fixed cost + p-norm of the compute and memory times."""
    fixed_s, compute_s, memory_s = roofline_s(work, tokens, eff, hardware)
    return fixed_s + (compute_s**smooth_p + memory_s**smooth_p) ** (1.0 / smooth_p)


@dataclass(frozen=True, init=False)
class CostModel:
    """Forward-pass times of `model` on `hardware` (one tensor-parallel group of GPUs).

    `params` defaults to `default_params(hardware)` (the constructor takes None for it)."""

    hardware: HardwareSpec
    model: ModelSpec
    params: CostParams
    tensor_parallel: int = 1

    def __init__(
        self, hardware: HardwareSpec, model: ModelSpec, params: CostParams | None = None, tensor_parallel: int = 1
    ) -> None:
        object.__setattr__(self, "hardware", hardware)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "params", default_params(hardware) if params is None else params)
        object.__setattr__(self, "tensor_parallel", tensor_parallel)
        if not is_count(tensor_parallel):
            raise ValueError(f"tensor_parallel must be a positive int, got {tensor_parallel!r}")

    # per-instance scalar caches (not dataclass fields: not compared, hashed or given)
    @functools.cached_property
    def _dense_cache(self) -> Callable[..., float]:
        """(num_tokens, logit_tokens) -> seconds of everything but attention."""
        return functools.lru_cache(maxsize=65536)(self._dense_scalar_s)

    @functools.cached_property
    def _body_cache(self) -> Callable[[int], tuple[float, float]]:
        """num_tokens -> (all layers' dense ops, the embedding)."""
        return functools.lru_cache(maxsize=16384)(self._body_s)

    @functools.cached_property
    def _head_cache(self) -> Callable[[int], float]:
        """logit rows -> lm_head + final norm."""
        return functools.lru_cache(maxsize=16384)(self._head_s)

    @functools.cached_property
    def _attention_terms(self) -> dict[str, tuple[float, ...]]:
        """op -> the constants `_attention_scalar_s` reads: the model's per-shard attention shape
        (`attention_work`) and the op's roofline (`roofline_s`, `op_time_s`), each the same float
        those compute on every call."""
        m, tp, hw, p = self.model, self.tensor_parallel, self.hardware, self.params.smooth_p
        heads = m.n_heads / tp
        kv_bytes = m.kv_bytes_per_token_per_layer * (max(m.n_kv_heads // tp, 1) / m.n_kv_heads)
        shape = (heads, m.head_dim, m.dtype_bytes, kv_bytes, self.params.q_tile_tokens)
        out: dict[str, tuple[float, ...]] = {}
        for op in ("attn_prefill", "attn_decode"):
            eff = self._eff(op)
            fixed_s = 1.0 * hw.launch_overhead_s * eff.overhead_launches
            roof = (eff.compute_eff_max, eff.compute_half_tokens, hw.peak_flops_per_s)
            out[op] = (*shape, *roof, hw.hbm_bytes_per_s * eff.memory_eff, fixed_s, p, 1.0 / p)
        return out

    # ---- per-op breakdowns -------------------------------------------------------------
    def _eff(self, op: str) -> OpEfficiency:
        return self.params.families[OP_FAMILY[op]]

    @property
    def _tile_params(self) -> GemmParams | None:
        """The GEMM params when the tile-and-wave model times GEMMs (a GPU with a chip layout), else None."""
        return self.params.gemm if self.hardware.has_chip_layout else None

    @property
    def uses_tiles(self) -> bool:
        """GEMMs timed by the tile-and-wave model (a GPU with a chip layout and GEMM params)."""
        return self._tile_params is not None

    def gemm_kernel(self, op: str, num_tokens: Number) -> KernelTimes:
        """The chosen kernel of GEMM `op` for `num_tokens` rows, with its terms (--explain)."""
        if self.params.gemm is None:
            raise ValueError(f"cost params {self.params.source!r} have no GEMM params: no tile model to explain")
        k, n = gemm_shapes(self.model, self.tensor_parallel)[op]
        return gemm_kernel(num_tokens, k, n, self.hardware, self.params.gemm, self.model.dtype_bytes)

    def _op_s(self, op: str, work: Work, tokens: Number) -> Number:
        """Seconds of one layer/pass op: the tile model for GEMMs where it applies."""
        if op in GEMM_OPS and (gemm := self._tile_params) is not None:
            k, n = gemm_shapes(self.model, self.tensor_parallel)[op]
            gemm_s = gemm_time_lookup_s(tokens, k, n, self.hardware, gemm, self.model.dtype_bytes)
            if op == "lm_head":  # plus the final norm over the logit rows
                d, b = self.model.d_model, self.model.dtype_bytes
                norm = (5 * tokens * d, b * (2 * tokens * d + d), 1.0)
                gemm_s = gemm_s + op_time_s(
                    norm, tokens, self.params.families["norm"], self.hardware, self.params.smooth_p
                )
            return gemm_s
        return op_time_s(work, tokens, self._eff(op), self.hardware, self.params.smooth_p)

    def _all_reduce_s(self, num_tokens: Number) -> Number:
        """Two all-reduces of the (n, d_model) activations per layer (Megatron-LM), timed by the
        calibrated collectives model (`simulator.comm`) on the part's links and topology."""
        from simulator.comm import collective_time_s

        bytes_ = num_tokens * self.model.d_model * self.model.dtype_bytes
        return 2 * collective_time_s("all_reduce", bytes_, self.tensor_parallel, self.hardware)

    def op_times_s(self, num_tokens: Number, kv_tokens_read: Number, query_groups: Number = 1) -> dict[str, Number]:
        """Seconds of each op in ONE layer (plus `all_reduce` when tensor_parallel > 1)."""
        num_tokens, kv_tokens_read, query_groups = _check(num_tokens, kv_tokens_read, query_groups)
        times = {
            op: self._op_s(op, work, num_tokens)
            for op, work in layer_work(self.model, num_tokens, self.tensor_parallel).items()
        }
        is_decode = num_tokens <= query_groups
        if _is_array(is_decode):
            prefill_s = self._attention_s(num_tokens, kv_tokens_read, query_groups, "attn_prefill")
            decode_s = self._attention_s(num_tokens, kv_tokens_read, query_groups, "attn_decode")
            times["attn_prefill"] = np.where(is_decode, 0.0, prefill_s)
            times["attn_decode"] = np.where(is_decode, decode_s, 0.0)
        else:
            op = "attn_decode" if is_decode else "attn_prefill"
            times["attn_prefill"] = times["attn_decode"] = 0.0
            times[op] = self._attention_s(num_tokens, kv_tokens_read, query_groups, op)
        if self.tensor_parallel > 1:
            times["all_reduce"] = self._all_reduce_s(num_tokens)
        return {op: times[op] for op in (*LAYER_OPS, "all_reduce") if op in times}

    def pass_op_times_s(self, num_tokens: Number, logit_tokens: Number | None = None) -> dict[str, Number]:
        """Seconds of the once-per-pass ops: emb, lm_head, step_overhead."""
        logit_tokens = num_tokens if logit_tokens is None else logit_tokens
        times = {
            op: self._op_s(op, work, num_tokens if op == "emb" else logit_tokens)
            for op, work in pass_work(self.model, num_tokens, logit_tokens, self.tensor_parallel).items()
        }
        times["step_overhead"] = self.params.step_overhead_s + 0.0 * num_tokens
        return times

    def bound(self, num_tokens: float, kv_tokens_read: float, query_groups: float = 1) -> str:
        """ "memory" or "compute": the roof holding more of one layer's time (ops summed)."""
        works = layer_work(self.model, num_tokens, self.tensor_parallel)
        attn_op = "attn_decode" if num_tokens <= query_groups else "attn_prefill"
        works[attn_op] = attention_work(
            self.model, num_tokens, kv_tokens_read, query_groups, self.params.q_tile_tokens, self.tensor_parallel
        )
        compute_s = memory_s = 0.0
        for op, work in works.items():
            if op in GEMM_OPS and self.uses_tiles:
                kernel = self.gemm_kernel(op, num_tokens)
                op_compute_s, op_memory_s = kernel.compute_s, kernel.memory_s
            else:
                _, op_compute_s, op_memory_s = roofline_s(work, num_tokens, self._eff(op), self.hardware)
            compute_s += float(op_compute_s)
            memory_s += float(op_memory_s)
        return "compute" if compute_s > memory_s else "memory"

    # ---- whole passes ------------------------------------------------------------------
    def _attention_s(self, num_tokens: Number, kv_tokens_read: Number, query_groups: Number, op: str) -> Number:
        """Seconds of attention in one layer with the efficiencies of `op` (prefill/decode)."""
        work = attention_work(
            self.model, num_tokens, kv_tokens_read, query_groups, self.params.q_tile_tokens, self.tensor_parallel
        )
        return op_time_s(work, num_tokens, self._eff(op), self.hardware, self.params.smooth_p)

    def _attention_scalar_s(self, n: float, kv_tokens_read: float, query_groups: float, op: str) -> float:
        """`_attention_s` of one pass's counts (builtins): `attention_work`, `roofline_s` and `op_time_s`
        inlined, the same operations in the same order (the same float), without their calls and
        look-ups; the replay costs every pass it plans this way."""
        heads, head_dim, b, kv_bytes, tile, eff_max, half, peak, mem_rate, fixed_s, p, inv_p = self._attention_terms[op]
        rows_per_group = min(max(n / query_groups, 1.0), tile)
        flops = 4 * kv_tokens_read * head_dim * heads
        bytes_ = 2 * n * heads * head_dim * b + n * kv_bytes + kv_tokens_read * kv_bytes / rows_per_group
        compute_s = flops / (peak * (eff_max * n / (n + half)))
        memory_s = bytes_ / mem_rate
        return fixed_s + (compute_s**p + memory_s**p) ** inv_p

    def _dense_time_s(self, num_tokens: Number, logit_tokens: Number) -> Number:
        """All layers' non-attention ops + all-reduces + per-pass ops, in seconds."""
        per_layer: Number = 0.0
        for op, work in layer_work(self.model, num_tokens, self.tensor_parallel).items():
            per_layer = per_layer + self._op_s(op, work, num_tokens)
        if self.tensor_parallel > 1:
            per_layer = per_layer + self._all_reduce_s(num_tokens)
        per_pass = sum(self.pass_op_times_s(num_tokens, logit_tokens).values())
        return self.model.n_layers * per_layer + per_pass

    def _body_s(self, num_tokens: int) -> tuple[float, float]:
        """(all layers' dense ops + all-reduces, the embedding) of one pass: `_dense_time_s`'s terms."""
        per_layer = 0.0
        for op, work in layer_work(self.model, num_tokens, self.tensor_parallel).items():
            per_layer = per_layer + float(self._op_s(op, work, num_tokens))
        if self.tensor_parallel > 1:
            per_layer = per_layer + float(self._all_reduce_s(num_tokens))
        emb = pass_work(self.model, num_tokens, num_tokens, self.tensor_parallel)["emb"]
        return self.model.n_layers * per_layer, float(self._op_s("emb", emb, num_tokens))

    def _head_s(self, logit_tokens: int) -> float:
        head = pass_work(self.model, logit_tokens, logit_tokens, self.tensor_parallel)["lm_head"]
        return float(self._op_s("lm_head", head, logit_tokens))

    def _dense_scalar_s(self, num_tokens: int, logit_tokens: int) -> float:
        """`_dense_time_s` of one pass from parts cached by token count and by logit rows (misses by
        distinct count, not by distinct pair); the same floats, summed in the same order."""
        layers, emb = self._body_cache(num_tokens)
        return layers + ((emb + self._head_cache(logit_tokens)) + (self.params.step_overhead_s + 0.0 * num_tokens))

    def step_time_s(
        self, query_tokens: Number, kv_tokens_read: Number, query_groups: Number = 1, logit_tokens: Number | None = None
    ) -> Number:
        """Seconds of one forward pass: all layers, lm_head, fixed step overhead.

        Scalars in, float out (cached, a few microseconds); arrays in, array out (vectorised).
        `logit_tokens` (rows that need logits) defaults to all query rows.
        """
        if not (  # inline, not _is_array: this runs once per pass the replay costs
            isinstance(query_tokens, np.ndarray)
            or isinstance(kv_tokens_read, np.ndarray)
            or isinstance(query_groups, np.ndarray)
            or isinstance(logit_tokens, np.ndarray)
        ):
            if (
                query_tokens < 1
                or kv_tokens_read < 0
                or query_groups < 1
                or (logit_tokens is not None and logit_tokens < 1)
            ):
                _check(query_tokens, kv_tokens_read, query_groups, logit_tokens)  # raises with a clear line
            dense = self._dense_cache(query_tokens, query_tokens if logit_tokens is None else logit_tokens)
            op = "attn_decode" if query_tokens <= query_groups else "attn_prefill"
            return dense + self.model.n_layers * self._attention_scalar_s(
                query_tokens, kv_tokens_read, query_groups, op
            )
        query_tokens, kv_tokens_read, query_groups = _check(query_tokens, kv_tokens_read, query_groups, logit_tokens)
        logit = query_tokens if logit_tokens is None else np.asarray(logit_tokens, dtype=float)
        dense_s = self._dense_time_s(query_tokens, logit)
        prefill_s = self._attention_s(query_tokens, kv_tokens_read, query_groups, "attn_prefill")
        decode_s = self._attention_s(query_tokens, kv_tokens_read, query_groups, "attn_decode")
        attn = np.where(query_tokens <= query_groups, decode_s, prefill_s)
        return dense_s + self.model.n_layers * attn


def _is_array(value: object) -> bool:
    return isinstance(value, np.ndarray)


def _check(
    num_tokens: Number, kv_tokens_read: Number, query_groups: Number, logit_tokens: Number | None = None
) -> tuple[Number, Number, Number]:
    """Validate counts (ValueError, one line); arrays become float arrays. `logit_tokens` (None: one
    per query row) is only checked: a pass computes the logits of at least one row."""
    arrays = any(_is_array(v) or isinstance(v, (list, tuple)) for v in (num_tokens, kv_tokens_read, query_groups))
    if arrays:
        num_tokens, kv_tokens_read, query_groups = (
            np.asarray(v, dtype=float) for v in (num_tokens, kv_tokens_read, query_groups)
        )
    if np.any(np.asarray(num_tokens) < 1):
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens!r}")
    if np.any(np.asarray(kv_tokens_read) < 0):
        raise ValueError(f"kv_tokens_read must be >= 0, got {kv_tokens_read!r}")
    if np.any(np.asarray(query_groups) < 1):
        raise ValueError(f"query_groups must be >= 1, got {query_groups!r}")
    if logit_tokens is not None and np.any(np.asarray(logit_tokens) < 1):
        raise ValueError(f"logit_tokens must be >= 1, got {logit_tokens!r}")
    return num_tokens, kv_tokens_read, query_groups
