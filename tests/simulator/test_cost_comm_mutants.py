"""Survivors of a mutation round on simulator/cost.py and simulator/comm.py: each test pins a
behaviour the other cost and comm tests left free (the mutant it kills is named in its docstring).
Hand-built specs and small token counts: the file runs in a few seconds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.cost import (
    GEMM_OPS,
    MATMUL_FAMILIES,
    CostModel,
    CostParams,
    OpEfficiency,
    attention_work,
    default_params,
    gemm_shapes,
    gemm_time_lookup_s,
    layer_work,
    load_a100_params,
    op_time_s,
    pass_work,
)
from simulator.gemm import gemm_kernel
from simulator.hardware import get_hardware, override
from simulator.models import get_model


# ---- parameters ---------------------------------------------------------------------------------
def test_op_efficiency_takes_zero_launches_but_no_zero_efficiency() -> None:
    """An op may have no fixed cost (a fit may put overhead_launches at its bound 0), but a zero
    efficiency would divide by zero. Kills `> 0` loosened to `>= 0` and `>= 0` tightened to `> 0`."""
    assert OpEfficiency(0.5, 10.0, 0.5, 0.0).overhead_launches == 0.0
    for field in ("compute_eff_max", "compute_half_tokens", "memory_eff"):
        values = {"compute_eff_max": 0.5, "compute_half_tokens": 10.0, "memory_eff": 0.5, "overhead_launches": 1.0}
        values[field] = 0.0
        with pytest.raises(ValueError, match=field):
            OpEfficiency(**values)
    with pytest.raises(ValueError, match="overhead_launches"):
        OpEfficiency(0.5, 10.0, 0.5, -1.0)


def test_cpu_gemm_priors_fill_at_a_few_rows_gpu_priors_at_tens() -> None:
    """The prior's GEMM compute roof: a CPU's vector GEMM is near its peak from a few rows (half at
    2 rows), a GPU's tiles need ~64 rows. Kills the two half-token counts swapped."""
    cpu = CostParams.prior(get_hardware("host-cpu")).families["up_proj"]
    gpu = CostParams.prior(get_hardware("h100-sxm")).families["up_proj"]

    def filled(eff: OpEfficiency, rows: float) -> float:  # e_c(n) / compute_eff_max
        return rows / (rows + eff.compute_half_tokens)

    assert filled(cpu, 8) >= 0.8 > 0.2 >= filled(gpu, 8)
    assert filled(gpu, 64) == pytest.approx(0.5)


def test_attention_priors_are_what_the_a100_calibration_ships() -> None:
    """The public A100 data holds no attention kernels, so the shipped calibration keeps the
    attention priors: FlashAttention-2's 60% of peak at the A100's 70% GEMM prior, carried to another
    part by its GEMM prior. Kills the 0.6 / 0.7 ratio inverted."""
    a100 = load_a100_params()
    prior = CostParams.prior(get_hardware("a100-80g"))
    for family in ("attention_prefill", "attention_decode"):
        assert prior.families[family] == a100.families[family], family
    mi300x = get_hardware("mi300x")
    expected = 0.6 * mi300x.matmul_efficiency / 0.7
    assert CostParams.prior(mi300x).families["attention_prefill"].compute_eff_max == pytest.approx(expected)


def test_carrying_and_scaling_move_the_tile_models_two_efficiencies_by_their_own_factor() -> None:
    """`scaled_to` carries the GEMM tile params' tensor efficiency by the compute ratio, their
    memory efficiency by the memory ratio; `scaled(compute, memory)` likewise. Kills tensor_eff
    carried by the memory ratio, and scaled()'s GEMM memory_eff multiplied by the compute factor."""
    a100 = get_hardware("a100-80g")
    part = override(
        "a100-80g", matmul_efficiency=a100.matmul_efficiency / 2, memory_efficiency=a100.memory_efficiency * 0.8
    )
    prior = CostParams.prior(a100)
    assert prior.gemm is not None
    carried = prior.scaled_to(part, a100).gemm
    assert carried is not None
    assert carried.tensor_eff == pytest.approx(prior.gemm.tensor_eff / 2)
    assert carried.memory_eff == pytest.approx(prior.gemm.memory_eff * 0.8)
    scaled = prior.scaled(0.5, 0.8)
    assert scaled.gemm is not None
    assert scaled.gemm.tensor_eff == pytest.approx(prior.gemm.tensor_eff * 0.5)
    assert scaled.gemm.memory_eff == pytest.approx(prior.gemm.memory_eff * 0.8)
    assert scaled.families["up_proj"].memory_eff == pytest.approx(prior.families["up_proj"].memory_eff * 0.8)


def test_a_parts_own_gemm_calibration_replaces_the_carried_tile_fit() -> None:
    """`HardwareSpec.gemm_fit` (written by `solm calibrate`) is the part's own tile fit: the default
    params time its GEMMs with it, the other families still carried from the A100. Kills the
    gemm_fit branch of default_params skipped."""
    fit = (("tensor_eff", 0.55), ("memory_eff", 0.6), ("launch_overheads", 2.0))
    part = dataclasses.replace(get_hardware("h100-sxm"), gemm_fit=fit)
    params = default_params(part)
    assert params.gemm is not None
    assert (params.gemm.tensor_eff, params.gemm.memory_eff, params.gemm.launch_overheads) == (0.55, 0.6, 2.0)
    assert params.families == default_params(get_hardware("h100-sxm")).families
    assert "calibration on measured GEMMs" in params.source


# ---- work counts --------------------------------------------------------------------------------
@pytest.mark.parametrize(("model", "tp"), [("llama-3-8b", 1), ("phi-2", 2), ("qwen2.5-7b", 8), ("llama-3-70b", 4)])
def test_the_roofline_counts_each_gemm_as_the_tile_model_shapes_it(model: str, tp: int) -> None:
    """The roofline's GEMM FLOPs (CPUs) and the tile model's (K, N) shapes (GPUs) are one shard's
    GEMMs: 2 n K N FLOPs, weights K N. The fused QKV keeps one KV head per shard when the shards
    outnumber the KV heads (qwen2.5-7b: 4 KV heads on 8 GPUs), the fused gate+up is 2 d_ff / tp wide
    on a gated MLP. Kills layer_work's KV heads without the floor of 1 (no K/V at TP 8), and
    gemm_shapes with the gate not fused or the KV heads not sharded."""
    spec, n = get_model(model), 16.0
    shapes, work = gemm_shapes(spec, tp), layer_work(spec, n, tp)
    for op in GEMM_OPS:
        if op == "lm_head":
            continue
        k, n_dim = shapes[op]
        flops, bytes_, _ = work[op]
        assert flops == pytest.approx(2 * n * k * n_dim), op
        assert bytes_ == pytest.approx(spec.dtype_bytes * (k * n_dim + n * k + n * n_dim)), op
    kv_heads = max(spec.n_kv_heads // tp, 1)
    assert shapes["attn_pre_proj"][1] == pytest.approx(spec.q_dim / tp + 2 * kv_heads * spec.head_dim)
    assert shapes["mlp_up_proj"][1] == pytest.approx(spec.d_ff / tp * (2 if spec.gated_mlp else 1))


def test_a_layer_has_two_residual_adds() -> None:
    """After attention and after the MLP: two (n, d) adds, each reading two tensors and writing one,
    two launches (the vidur data times one; calibrate halves it). Kills RESIDUAL_ADDS_PER_LAYER = 1."""
    spec, n = get_model("llama-3-8b"), 10.0
    d, b = spec.d_model, spec.dtype_bytes
    assert layer_work(spec, n)["add"] == (2 * n * d, 2 * 3 * b * n * d, 2.0)


def test_attention_work_counts_both_matmuls_and_one_kv_read_per_tile() -> None:
    """FLOPs: QK^T and PV, 2 x head_dim each per (row, visible slot, head). Bytes: Q and O, the new
    K/V, and the visible K/V once per tile of 128 rows of a group (a 1024-row prefill reads it 8
    times over its rows, not once). Kills the FLOPs halved and the tile cap dropped."""
    spec = get_model("llama-3-8b")
    heads, hd, b, kvb = spec.n_heads, spec.head_dim, spec.dtype_bytes, spec.kv_bytes_per_token_per_layer
    n, kv = 1024.0, 1024.0 * 1025 / 2
    flops, bytes_, launches = attention_work(spec, n, kv, 1, 128)
    assert flops == pytest.approx(4 * kv * hd * heads)
    assert bytes_ == pytest.approx(2 * n * heads * hd * b + n * kvb + kv * kvb / 128)
    array = attention_work(spec, np.array([n]), np.array([kv]), np.array([1.0]), 128)
    assert array[1][0] == pytest.approx(bytes_)


@pytest.mark.parametrize(("model", "tp", "kv_share"), [("llama-3-8b", 4, 1 / 4), ("qwen2.5-7b", 8, 1 / 4)])
def test_attention_on_a_shard_reads_its_own_kv_heads(model: str, tp: int, kv_share: float) -> None:
    """A shard holds n_heads / tp query heads and max(n_kv_heads // tp, 1) KV heads: its KV bytes
    are that share of the layer's (qwen2.5-7b's 4 KV heads on 8 GPUs: one each, a quarter). Kills
    the KV bytes not sharded (both the general and the replay's inlined path)."""
    spec = get_model(model)
    heads, hd, b = spec.n_heads / tp, spec.head_dim, spec.dtype_bytes
    kvb = spec.kv_bytes_per_token_per_layer * kv_share
    n, kv, groups = 8.0, 8 * 3000.0, 8.0  # 8 decoding sequences
    flops, bytes_, _ = attention_work(spec, n, kv, groups, 128, tp)
    assert flops == pytest.approx(4 * kv * hd * heads)
    assert bytes_ == pytest.approx(2 * n * heads * hd * b + n * kvb + kv * kvb)
    cost = CostModel(get_hardware("h100-sxm"), spec, tensor_parallel=tp)
    assert cost._attention_scalar_s(n, kv, groups, "attn_decode") == cost._attention_s(n, kv, groups, "attn_decode")


def test_the_roofline_lm_head_is_the_final_norm_and_the_gemm_two_launches() -> None:
    """On a part without a tile model the once-per-pass lm_head op is the final norm (5 FLOPs, two
    reads and a write per element) plus the vocab GEMM: two kernels. Kills its launches set to 1."""
    spec, m = get_model("llama-3-8b"), 3.0
    d, v, b = spec.d_model, spec.vocab_size, spec.dtype_bytes
    assert pass_work(spec, 10.0, m)["lm_head"] == (
        2 * m * d * v + 5 * m * d,
        b * (d * v + m * d + m * v + 2 * m * d),
        2.0,
    )


# ---- the tile model's place in the cost ----------------------------------------------------------
@pytest.fixture(scope="module")
def a100() -> CostModel:
    return CostModel(get_hardware("a100-80g"), get_model("llama-3-8b"))


def test_the_tile_lm_head_adds_the_final_norm_at_the_norms_efficiency(a100: CostModel) -> None:
    """lm_head on a GPU: its GEMM from the tile model plus the final norm over the logit rows on
    the roofline with the norm family's efficiencies. Kills the norm timed with the lm_head GEMM's
    (up_proj) efficiencies."""
    rows, d, b = 64, a100.model.d_model, a100.model.dtype_bytes
    norm = (5 * rows * d, b * (2 * rows * d + d), 1.0)
    expected = a100.gemm_kernel("lm_head", rows).time_s + op_time_s(
        norm, rows, a100.params.families["norm"], a100.hardware, a100.params.smooth_p
    )
    assert a100.pass_op_times_s(rows)["lm_head"] == pytest.approx(float(expected), rel=1e-12)


def test_fractional_rows_are_timed_not_rounded_down_to_a_table_row(a100: CostModel) -> None:
    """A pipeline stage's micro-batch may hold a fractional mean row count: the GEMM tables hold
    whole counts only, so such M are timed by the kernel model, in an array as alone. Kills the
    array path looking fractional M up in the table (10.5 rows timed as 10)."""
    k, n = gemm_shapes(a100.model)["mlp_up_proj"]
    gemm = a100.params.gemm
    assert gemm is not None
    m = np.array([10.5, 3.0, 300.25])
    exact = gemm_kernel(m, k, n, a100.hardware, gemm, 2).time_s
    np.testing.assert_array_equal(gemm_time_lookup_s(m, k, n, a100.hardware, gemm, 2), exact)
    assert gemm_time_lookup_s(10.5, k, n, a100.hardware, gemm, 2) == pytest.approx(exact[0], rel=1e-12)
    assert gemm_time_lookup_s(10, k, n, a100.hardware, gemm, 2) != pytest.approx(exact[0], rel=1e-9)


@pytest.mark.parametrize("tp", [2.0, 2.5])
def test_tensor_parallel_must_be_an_int(tp: object) -> None:
    """A float TP would shard heads into fractions without a word. Kills the type check
    dropped (only `tp < 1` left)."""
    with pytest.raises(ValueError, match="tensor_parallel"):
        CostModel(get_hardware("a100-80g"), get_model("llama-3-8b"), tensor_parallel=tp)  # type: ignore[arg-type]


def test_bound_reads_the_gpu_gemms_from_the_tile_model(a100: CostModel) -> None:
    """On a GPU the GEMMs' compute and memory terms are the tile model's: the roofline families of
    the GEMMs, which the GPU does not use, do not move `bound`. Kills bound() ignoring the tiles."""

    def with_matmul(**change: float) -> CostModel:
        families = dict(a100.params.families)
        for family in MATMUL_FAMILIES:
            families[family] = dataclasses.replace(families[family], **change)
        return CostModel(a100.hardware, a100.model, dataclasses.replace(a100.params, families=families))

    prefill = (4096, 4096 * 4097 // 2)
    assert a100.bound(*prefill) == with_matmul(memory_eff=1e-3).bound(*prefill) == "compute"
    assert a100.bound(1, 2048) == with_matmul(compute_eff_max=1e-3).bound(1, 2048) == "memory"


def test_a_lone_decode_row_at_long_context_is_memory_bound(a100: CostModel) -> None:
    """One sequence decoding one row is `attn_decode` (a lone row streams its KV): memory-bound at
    any context. Timed with the prefill kernel's roof (a row fills 1/129 of it) it would read as
    compute-bound at 100k tokens. Kills bound()'s decode test `<=` made `<`."""
    assert a100.bound(1, 100_000) == "memory"
    assert a100.op_times_s(1, 100_000)["attn_prefill"] == 0.0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((4, 10, 0), "query_groups"),
        ((4, 10, 0.5), "query_groups"),
        ((np.array([4.0]), np.array([10.0]), np.array([0.0])), "query_groups"),
        ((0, 10, 1), "num_tokens"),
        ((np.array([2.0, 0.5]), np.array([10.0, 10.0])), "num_tokens"),
        ((4, 10, 1, 0), "logit_tokens"),  # was: a ZeroDivisionError from the lm_head of no rows
        ((np.array([4.0]), np.array([10.0]), np.array([1.0]), np.array([0.0])), "logit_tokens"),
    ],
)
def test_counts_below_one_group_or_one_row_raise_a_value_error(a100: CostModel, args: tuple, field: str) -> None:
    """No query groups (or a fraction of one), or no logit rows, is a bad count, scalar or array,
    named in a ValueError, not a ZeroDivisionError from the attention's rows per group or the
    lm_head's tiles. Kills the scalar
    path's query_groups check dropped and `_check`'s bounds loosened to < 0."""
    with pytest.raises(ValueError, match=field):
        a100.step_time_s(*args)


# ---- collectives ----------------------------------------------------------------------------------
@pytest.mark.parametrize("nbytes", [-0.5, -1, np.array([1.0, -0.25])])
def test_any_negative_buffer_is_a_usage_error(nbytes: object) -> None:
    """A buffer of less than 0 bytes is an error, however small the deficit (the traffic floor of
    1 byte would otherwise time it as a one-byte call). Kills the check loosened to < -1."""
    from profiler.errors import UsageError
    from simulator.comm import collective_time_s

    for collective in ("all_reduce", "send_recv"):
        with pytest.raises(UsageError, match="bytes must be >= 0"):
            collective_time_s(collective, nbytes, 2, get_hardware("h100-sxm"))


def test_the_fit_vector_holds_ramp_sizes_as_logs_and_latencies_in_microseconds() -> None:
    """`fit` bounds each latency to 0-500 us and starts it at 20 us: `_unpack` reads those entries
    as microseconds, the ramp sizes as natural logs of bytes. Kills the latency read as ms (the
    fit's bound would then allow half a second)."""
    from simulator.comm import _FITTED, _unpack

    x = np.array([0.5, 0.6, 0.7, 0.8] + [np.log(1e6), 0.9, 20.0] * len(_FITTED))
    x[4 + 3 * 2 + 2] = 7.5  # the third fitted pair's latency
    params = _unpack(x)
    path, family = _FITTED[2]
    assert params.ramp(path, family).latency_s == pytest.approx(7.5e-6, rel=1e-12)
    assert params.ramp(*_FITTED[0]).latency_s == pytest.approx(20e-6, rel=1e-12)
    assert params.ramp(*_FITTED[0]).ramp_bytes == pytest.approx(1e6, rel=1e-12)


def test_the_one_mib_up_figure_counts_a_one_mib_call() -> None:
    """'1 MiB up' is from 2**20 bytes on, 2**20 included: with only the 1 MiB calls held out, the
    figure is their error. (On the shipped split no held-out call within a node is exactly 1 MiB.)
    Kills `>=` made `>` in evaluate()."""
    from simulator.comm import evaluate, load_params, measured_rows, predict_rows

    params = load_params()
    rows = dict(measured_rows())
    rows["held_out"] = (rows["bytes"] == 2**20) | rows["across_nodes"]
    rows["time_s"] = predict_rows(rows, params) / 1.25  # every call 25% slow: 25% error
    report = evaluate(params, rows)
    assert report["held_out_rows"] == int(((rows["bytes"] == 2**20) & ~rows["across_nodes"]).sum()) > 0
    assert report["comm_mape_percent_1mib_up"] == pytest.approx(25.0)


@pytest.mark.parametrize("part", ["h100-sxm", "mi300x", "a40"])
def test_a_send_recv_ring_of_more_gpus_than_a_node_crosses_the_nics(part: str) -> None:
    """send/recv on n workers is one pair's time on the slowest link a ring of n crosses: a ring
    of 16 GPUs on nodes of 8 crosses the NICs between the nodes (it was timed on the node's own
    link, as fast as a ring of 8). Fails on the old code."""
    from simulator.comm import collective_time_s

    hw = get_hardware(part)
    g, nbytes = hw.gpus_per_node, 2**26
    across = collective_time_s("send_recv", nbytes, 2, hw, across_nodes=True)
    assert collective_time_s("send_recv", nbytes, 2 * g, hw) == across
    assert collective_time_s("send_recv", nbytes, g + 1, hw) == across
    assert collective_time_s("send_recv", nbytes, g, hw) < across
