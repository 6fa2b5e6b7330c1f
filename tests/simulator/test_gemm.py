"""Tile-and-wave GEMM model: exact wave counting on a made-up part, monotonicity (tokens, SMs,
bandwidth), the chip fields of the catalog and their sources, the fit on synthetic and real
data, and `solm cost --set` / `--explain`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost import (
    GEMM_OPS,
    CostModel,
    default_params,
    gemm_shapes,
    load_a100_params,
)
from simulator.gemm import TILES, GemmParams, Tile, gemm_kernel, gemm_time_s
from simulator.hardware import CHIP_FIELDS, HARDWARE, get_hardware, override
from simulator.models import get_model

ROOT = Path(__file__).resolve().parents[2]
GPUS = [name for name, spec in HARDWARE.items() if spec.kind == "gpu"]
SHAPES = [(4096, 6144), (4096, 28672), (14336, 4096), (1024, 4096), (8192, 128256)]


# ---- waves -----------------------------------------------------------------------------------
def _four_sm_part():
    """4 SMs, memory and launches free: a GEMM's time is its waves' compute alone."""
    return override("a100-80g", name="four-sm", num_sms=4, hbm_bytes_per_s=1e30, launch_overhead_s=0.0)


def test_five_tiles_take_two_waves_four_tiles_one() -> None:
    part = _four_sm_part()
    params = GemmParams(fill_iters=0.0, choice_q=0.0)
    tile = (Tile(128, 128, 32, ctas_per_sm=1),)

    def time_s(n_tiles: int) -> float:  # one row of 128 tokens, n_tiles columns of 128
        return gemm_kernel(128, 4096, 128 * n_tiles, part, params, tiles=tile, splits=(1,)).time_s

    k_iters = 4096 / 32
    iter_s = max(
        2 * 128 * 128 * 32 / (part.sm_peak_flops_per_s * params.tensor_eff),
        256 * 32 * 2 / (params.feed_bytes_per_clock * part.sustained_clock_hz),
    )
    one_wave_s = k_iters * iter_s
    assert time_s(4) == pytest.approx(one_wave_s, rel=1e-12)
    assert time_s(5) == pytest.approx(2 * one_wave_s, rel=1e-12)
    assert time_s(1) == pytest.approx(one_wave_s, rel=1e-12)  # 3 idle SMs don't speed it up
    assert time_s(8) == pytest.approx(2 * one_wave_s, rel=1e-12)
    assert time_s(9) == pytest.approx(3 * one_wave_s, rel=1e-12)
    kernel = gemm_kernel(128, 4096, 640, part, params, tiles=tile, splits=(1,))
    assert (kernel.tiles, kernel.waves, kernel.tile) == (5, 2, ["128x128x32"])


def test_waves_counts_a_full_last_wave_once() -> None:
    """`waves` (printed by `solm cost --explain`): 4 tiles on 4 SMs are one wave, 8 two, 9 three;
    with 2 CTAs per SM a wave holds 8 tiles."""
    part = _four_sm_part()
    params = GemmParams(fill_iters=0.0, choice_q=0.0)

    def waves(n_tiles: int, ctas: int = 1) -> float:
        tile = (Tile(128, 128, 32, ctas_per_sm=ctas),)
        return gemm_kernel(128, 4096, 128 * n_tiles, part, params, tiles=tile, splits=(1,)).waves

    assert [waves(n) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    assert [waves(n, ctas=2) for n in (8, 9, 16)] == [1, 2, 2]


def test_cluster_multicast_halves_the_longer_operand_slab() -> None:
    """A 2-CTA cluster reads the slab its tiles share once: a feed-bound tile runs faster."""
    assert Tile(128, 256, 64).feed_bytes_per_k == 384
    assert Tile(128, 256, 64, cluster=2).feed_bytes_per_k == 128 + 256 / 2
    assert Tile(256, 128, 64, cluster=2).feed_bytes_per_k == 128 + 256 / 2
    assert Tile(128, 128, 64, operand_share=2).feed_bytes_per_k == 128
    part = _four_sm_part()
    params = GemmParams(fill_iters=0.0, choice_q=0.0, feed_bytes_per_clock=8.0)  # L2-bound tiles

    def time_s(tile: Tile) -> float:
        return gemm_kernel(512, 4096, 512, part, params, tiles=(tile,), splits=(1,)).time_s

    alone, clustered = time_s(Tile(128, 128, 32)), time_s(Tile(128, 128, 32, cluster=2))
    assert clustered == pytest.approx(alone * (128 + 64) / 256, rel=1e-12)
    assert Tile(128, 128, 32, cluster=2).label == "128x128x32c2"


def test_persistent_kernel_pays_the_pipeline_fill_once() -> None:
    part = _four_sm_part()
    params = GemmParams(fill_iters=5.0, choice_q=0.0)
    plain, persistent = Tile(128, 128, 32), Tile(128, 128, 32, persistent=True)

    def iterations(tile: Tile, n_tiles: int) -> float:  # in units of one k-iteration's time
        one_iter = (
            gemm_kernel(
                128, 32 * 1000, 128 * 4, part, dataclasses.replace(params, fill_iters=0.0), tiles=(tile,), splits=(1,)
            ).time_s
            / 1000
        )
        return gemm_kernel(128, 4096, 128 * n_tiles, part, params, tiles=(tile,), splits=(1,)).time_s / one_iter

    assert iterations(plain, 12) == pytest.approx(3 * (128 + 5), rel=1e-9)  # three waves, a fill each
    assert iterations(persistent, 12) == pytest.approx(3 * 128 + 5, rel=1e-9)
    assert iterations(persistent, 4) == pytest.approx(iterations(plain, 4), rel=1e-12)


def test_a_warp_specialized_kernel_hides_memory_under_compute_but_not_its_fill() -> None:
    """max(compute, memory + fill) for a warp-specialized kernel (its loads run beside its math;
    the first loads and the last stores have nothing to hide under), the `overlap_p` norm of
    compute and memory otherwise; exact on 4 SMs with launches free, memory- and compute-bound."""
    params = GemmParams(fill_iters=3.0, choice_q=0.0, overlap_p=2.0)
    plain, special = Tile(128, 128, 32, persistent=True), Tile(128, 128, 32, persistent=True, warp_specialized=True)
    for bandwidth in (2e9, 1.3e11, 1e13):  # memory-bound, about equal, compute-bound
        part = override("a100-80g", name="four-sm", num_sms=4, hbm_bytes_per_s=bandwidth, launch_overhead_s=0.0)
        one = gemm_kernel(128, 4096, 512, part, params, tiles=(plain,), splits=(1,))
        compute, memory = float(one.compute_s), float(one.memory_s)
        iter_s = compute / (4096 / 32 + params.fill_iters)  # one wave of 4 tiles, one fill (persistent)
        fill = params.fill_iters * iter_s
        assert float(one.time_s) == pytest.approx((compute**2 + memory**2) ** 0.5, rel=1e-12)
        got = gemm_kernel(128, 4096, 512, part, params, tiles=(special,), splits=(1,))
        assert (float(got.compute_s), float(got.memory_s)) == pytest.approx((compute, memory), rel=1e-12)
        assert float(got.time_s) == pytest.approx(max(compute, memory + fill), rel=1e-12)
        if 0.5 < memory / compute < 2:  # comparable: hiding one under the other wins
            assert float(got.time_s) < 0.8 * float(one.time_s)
    assert all(t.warp_specialized for t in TILES["hopper"] if t.tm >= 64)  # wgmma kernels, TMA producers
    assert not any(t.warp_specialized for arch in ("ampere", "cdna3") for t in TILES[arch])


def test_split_k_reduces_in_kernel_on_hopper_and_later() -> None:
    """Ampere's split-K launches a second, reduction kernel; Hopper's and Blackwell's do not."""
    params = GemmParams(choice_q=0.0)
    ampere = override("a100-80g", name="ampere-part", launch_overhead_s=4e-6)
    hopper = dataclasses.replace(ampere, name="hopper-part", arch="hopper")
    tile = (Tile(128, 128, 32),)
    times = [gemm_kernel(64, 8192, 256, part, params, tiles=tile, splits=(4,)).time_s for part in (ampere, hopper)]
    assert times[0] - times[1] == pytest.approx(params.launch_overheads * 4e-6, rel=1e-9)
    whole = [gemm_kernel(64, 8192, 256, part, params, tiles=tile, splits=(1,)).time_s for part in (ampere, hopper)]
    assert whole[0] == pytest.approx(whole[1], rel=1e-12)  # without split-K, one kernel on both


def test_tail_share_recovers_part_of_the_last_waves_idle_time() -> None:
    """tail_share s: the compute is (1 - s) x the quantized waves + s x the tiles spread evenly,
    never less than one tile-time."""
    part = _four_sm_part()
    tile = (Tile(128, 128, 32, ctas_per_sm=1),)

    def time_s(n_tiles: int, share: float) -> float:
        params = GemmParams(fill_iters=0.0, choice_q=0.0, tail_share=share)
        return gemm_kernel(128, 4096, 128 * n_tiles, part, params, tiles=tile, splits=(1,)).time_s

    one_wave_s = time_s(4, 0.0)
    for share in (0.25, 0.6, 1.0):
        assert time_s(4, share) == pytest.approx(one_wave_s, rel=1e-12)  # full waves: nothing to recover
        assert time_s(1, share) == pytest.approx(one_wave_s, rel=1e-12)  # one tile takes a tile-time
        assert time_s(8, share) == pytest.approx(2 * one_wave_s, rel=1e-12)
        assert time_s(5, share) == pytest.approx(((1 - share) * 2 + share * 5 / 4) * one_wave_s, rel=1e-12)
        times = [time_s(n, share) for n in range(1, 14)]
        assert all(b >= a for a, b in zip(times, times[1:])), share
    with pytest.raises(ValueError, match="tail_share"):
        GemmParams(tail_share=1.5)


def test_a_persistent_kernel_spreads_its_last_wave_over_every_sm() -> None:
    """Stream-K: a persistent kernel's partial last wave is spread evenly over the SMs, whatever the
    fitted tail_share (which serves the other kernels); never below one tile-time."""
    part = _four_sm_part()
    plain, persistent = Tile(128, 128, 32), Tile(128, 128, 32, persistent=True)

    def time_s(tile: Tile, n_tiles: int, share: float) -> float:
        params = GemmParams(fill_iters=0.0, choice_q=0.0, tail_share=share)
        return gemm_kernel(128, 4096, 128 * n_tiles, part, params, tiles=(tile,), splits=(1,)).time_s

    one_wave_s = time_s(plain, 4, 0.0)
    for share in (0.0, 0.4, 1.0):
        assert time_s(persistent, 5, share) == pytest.approx(5 / 4 * one_wave_s, rel=1e-12)
        assert time_s(persistent, 9, share) == pytest.approx(9 / 4 * one_wave_s, rel=1e-12)
        assert time_s(persistent, 2, share) == pytest.approx(one_wave_s, rel=1e-12)
        assert time_s(plain, 5, share) == pytest.approx(((1 - share) * 2 + share * 5 / 4) * one_wave_s, rel=1e-12)
    assert all(t.persistent for t in TILES["hopper"] if t.tm >= 64)  # Hopper's wgmma kernels


def test_split_k_wins_for_few_tiles_on_many_sms() -> None:
    """One output tile on 108 SMs: slicing K spreads it over more SMs."""
    a100 = get_hardware("a100-80g")
    params = dataclasses.replace(load_a100_params().gemm, choice_q=0.0)
    kernel = gemm_kernel(16, 16384, 128, a100, params)
    assert kernel.split > 1
    unsplit = gemm_kernel(16, 16384, 128, a100, params, splits=(1,))
    assert kernel.time_s < unsplit.time_s


# ---- monotone --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GPUS)
def test_more_tokens_never_faster(name: str) -> None:
    hw = get_hardware(name)
    params = default_params(hw).gemm
    m = np.arange(1, 9000, dtype=float)
    for k, n in SHAPES:
        times = gemm_time_s(m, k, n, hw, params)
        assert np.all(np.diff(times) >= 0), (name, k, n)


@settings(max_examples=60, deadline=None)
@given(
    part=st.sampled_from(GPUS),
    m=st.integers(1, 40000),
    k=st.integers(64, 65536),
    n=st.integers(64, 160000),
    more=st.floats(1.0, 4.0),
)
def test_more_sms_or_bandwidth_never_slower(part: str, m: int, k: int, n: int, more: float) -> None:
    hw = get_hardware(part)
    params = default_params(hw).gemm
    base = gemm_time_s(float(m), k, n, hw, params)
    sms = override(part, num_sms=int(np.ceil(hw.num_sms * more)))
    wide = override(part, hbm_bytes_per_s=hw.hbm_bytes_per_s * more)
    assert gemm_time_s(float(m), k, n, sms, params) <= base * (1 + 1e-12)
    assert gemm_time_s(float(m), k, n, wide, params) <= base * (1 + 1e-12)


def test_sm_count_grid_never_slower() -> None:
    params = load_a100_params().gemm
    for k, n in SHAPES:
        m = np.array([1, 77, 300, 1500, 4096], dtype=float)
        times = np.stack(
            [gemm_time_s(m, k, n, override("a100-80g", num_sms=s), params) for s in range(8, 257, 8)]
        )  # (SM counts, M)
        for i in range(len(m)):
            assert np.all(np.diff(times[:, i]) <= 1e-15), (k, n, m[i])


@pytest.mark.parametrize("name", ["a100-80g", "h100-sxm", "b200", "mi300x", "l40s"])
def test_cost_model_gemm_ops_monotone_and_use_tiles(name: str) -> None:
    cost = CostModel(get_hardware(name), get_model("llama-3-70b"), tensor_parallel=4)
    assert cost.uses_tiles
    n = np.arange(1, 5000, dtype=float)
    per_op = cost.op_times_s(n, n * 100)
    for op in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"):
        assert np.all(np.diff(per_op[op]) >= 0), op
    lm_head = cost.pass_op_times_s(n)["lm_head"]
    assert np.all(np.diff(lm_head) >= 0)
    scalar = [cost.op_times_s(int(t), int(t) * 100)["mlp_up_proj"] for t in (1, 333, 4999)]
    np.testing.assert_allclose(scalar, per_op["mlp_up_proj"][[0, 332, 4998]], rtol=1e-12)


def test_cost_model_constructor_defaults_and_roofline_gemms() -> None:
    """params None -> default_params; replace() builds a new model with its own pass cache; with no
    GEMM params the GEMMs fall back to the roofline and asking for a kernel is a clear ValueError."""
    hw, model = get_hardware("h100-sxm"), get_model("llama-3-8b")
    tiles = CostModel(hw, model, None)
    assert tiles.params == default_params(hw) and tiles == CostModel(hw, model, default_params(hw))
    tp2 = dataclasses.replace(tiles, tensor_parallel=2)
    assert tp2.tensor_parallel == 2 and tp2.params == tiles.params
    assert tiles.step_time_s(64, 6400) != tp2.step_time_s(64, 6400)
    roofline = CostModel(hw, model, dataclasses.replace(tiles.params, gemm=None))
    assert tiles.uses_tiles and not roofline.uses_tiles
    assert roofline.step_time_s(64, 6400) > 0
    with pytest.raises(ValueError, match="no GEMM params"):
        roofline.gemm_kernel("mlp_up_proj", 64)
    with pytest.raises(ValueError, match="tensor_parallel must be a positive int"):
        CostModel(hw, model, tensor_parallel=0)


def test_newer_parts_run_every_gemm_faster() -> None:
    model = get_model("llama-3-8b")
    costs = [CostModel(get_hardware(name), model) for name in ("a100-80g", "h100-sxm", "b200")]
    for m in (1, 16, 256, 1000, 4096):
        for op in GEMM_OPS:
            a100, h100, b200 = (float(c.gemm_kernel(op, m).time_s) for c in costs)
            assert b200 < h100 < a100, (op, m)


# ---- catalog ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GPUS)
def test_every_gpu_has_chip_fields_with_a_source_comment(name: str) -> None:
    spec = get_hardware(name)
    assert spec.has_chip_layout and all(getattr(spec, f) is not None for f in CHIP_FIELDS)
    derived = spec.num_sms * spec.tensor_flops_per_sm_per_clock * spec.sustained_clock_hz
    assert derived == pytest.approx(spec.peak_flops_per_s, rel=5e-3)  # peak derived from them
    assert spec.sustained_clock_hz <= spec.boost_clock_hz
    assert spec.l2_bytes >= 4 * 2**20
    lines = (ROOT / "simulator" / "hardware.py").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("_CHIP: dict"))
    entry = next(i for i in range(start, len(lines)) if lines[i].startswith(f'    "{name}": ('))
    above = entry - 1
    while lines[above].startswith('    "'):  # entries sharing one comment
        above -= 1
    comment = []
    while lines[above].strip().startswith("#"):
        comment.append(lines[above])
        above -= 1
    text = " ".join(comment)
    assert re.search(r"whitepaper|datasheet|technical brief", text, re.IGNORECASE), name
    assert str(spec.num_sms) in text or f"{spec.num_sms:,}" in text, name


def test_set_num_sms_scales_the_peak() -> None:
    h100 = get_hardware("h100-sxm")
    bigger = override("h100-sxm", num_sms=264)
    assert bigger.peak_flops_per_s == pytest.approx(2 * h100.peak_flops_per_s)
    assert bigger.sm_peak_flops_per_s == pytest.approx(h100.sm_peak_flops_per_s)
    faster_clock = override("h100-sxm", sustained_clock_hz=h100.boost_clock_hz)
    assert faster_clock.peak_flops_per_s > h100.peak_flops_per_s
    with pytest.raises(ValueError, match="whole number"):
        override("h100-sxm", num_sms=13.5)
    with pytest.raises(ValueError, match="arch"):
        override("h100-sxm", arch="tpu")


# ---- fit -------------------------------------------------------------------------------------
def test_fit_recovers_synthetic_parameters() -> None:
    """Times generated by the model with known parameters: the fit finds them again."""
    import pandas as pd

    from simulator.gemm_fit import FIT_FIELDS, fit_gemm, predict_tiles

    truth = GemmParams(
        tensor_eff=0.8,
        fill_iters=3.0,
        memory_eff=0.85,
        launch_overheads=1.0,
        overlap_p=3.0,
        choice_q=10.0,
        tail_share=0.5,
    )
    m = np.array([1, 64, 200, 1000, 4096], dtype=float)
    rows = pd.DataFrame(
        [{"model": "x", "tp": 1, "op": f"{k}x{n}", "num_tokens": v, "K": k, "N": n} for k, n in SHAPES[:3] for v in m]
    )
    rows["time_s"] = predict_tiles(rows, truth)
    fixed = {"feed_bytes_per_clock": truth.feed_bytes_per_clock, "choice_q": 10.0, "overlap_p": 3.0}
    fitted = fit_gemm(rows, fixed=fixed)
    for name in ("tensor_eff", "memory_eff", "tail_share"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.03), name
    np.testing.assert_allclose(predict_tiles(rows, fitted), rows["time_s"], rtol=0.02)
    assert set(FIT_FIELDS) <= {f.name for f in dataclasses.fields(GemmParams)}


def test_dev_split_holds_out_whole_shapes() -> None:
    """Each seed halves the shapes: every row is predicted once per seed, by a fit that never saw
    its (K, N); on times the model generated, the held-out predictions match them."""
    import pandas as pd

    from simulator.gemm_fit import dev_split_predictions, predict_tiles

    truth = GemmParams(fill_iters=3.0, choice_q=10.0, tail_share=0.5)
    m = np.array([1, 64, 200, 1000, 4096], dtype=float)
    rows = pd.DataFrame(
        [{"model": "x", "tp": 1, "op": f"{k}x{n}", "num_tokens": v, "K": k, "N": n} for k, n in SHAPES[:4] for v in m]
    )
    rows["time_s"] = predict_tiles(rows, truth)
    fixed = {"choice_q": 10.0, "overlap_p": truth.overlap_p}
    held = dev_split_predictions(rows, seeds=(0, 1), thin=1, fixed=fixed)
    assert len(held) == 2 * len(rows)
    assert held.groupby(["seed", "K", "N", "num_tokens"]).size().eq(1).all()
    np.testing.assert_allclose(held["tiles_s"], held["time_s"], rtol=0.03)


def test_level_removed_ape_takes_out_each_groups_median_error() -> None:
    """Shape A is 10% slow throughout but one row, shape B 20% fast: a level per shape leaves only
    that row's 5% (p90 of [0, 0, 5, 0, 0] by linear interpolation: 3.0); as one group, only the
    median ratio 1.1 comes out."""
    import pandas as pd

    from simulator.gemm_fit import level_removed_ape

    ratio = [1.1, 1.1, 1.1 * 1.05, 0.8, 0.8]
    held = pd.DataFrame({"K": [1, 1, 1, 2, 2], "N": 8, "time_s": 2.0, "tiles_s": [2.0 * r for r in ratio]})
    median, p90 = level_removed_ape(held, ["K", "N"])
    assert median == pytest.approx(0.0, abs=1e-9)
    assert p90 == pytest.approx(3.0, rel=1e-9)
    median, p90 = level_removed_ape(held.assign(K=1), ["K"])  # one group: its median ratio 1.1 comes out
    assert median == pytest.approx(5.0, rel=1e-9)  # APEs 0, 0, 5, 27.3, 27.3
    assert p90 == pytest.approx(100 * (1 - 0.8 / 1.1), rel=1e-9)


def test_repeat_spread_counts_only_gemms_timed_in_two_profiles() -> None:
    """GEMM (1, 8, 16) is timed in profiles a/1 and b/2 (10 and 11: 10% apart) and (1, 8, 32) in
    a/1 and a/2 (20 and 30: 50%); (2, 8, 16) twice in one profile (two ops of one shape) is not a
    repeat of the measurement, nor is (3, 8, 16) timed once."""
    import pandas as pd

    from simulator.gemm_fit import repeat_spread_percent

    rows = pd.DataFrame(
        [
            ("a", 1, 1, 8, 16, 10.0),
            ("b", 2, 1, 8, 16, 11.0),
            ("a", 1, 1, 8, 32, 20.0),
            ("a", 2, 1, 8, 32, 30.0),
            ("a", 1, 2, 8, 16, 5.0),
            ("a", 1, 2, 8, 16, 50.0),
            ("c", 4, 3, 8, 16, 7.0),
        ],
        columns=["model", "tp", "K", "N", "num_tokens", "time_s"],
    )
    median, p90, count = repeat_spread_percent(rows)
    assert count == 2
    assert median == pytest.approx(30.0)
    assert p90 == pytest.approx(10.0 + 0.9 * 40.0)
    assert repeat_spread_percent(rows.iloc[4:]) == (pytest.approx(float("nan"), nan_ok=True),) * 2 + (0,)


def test_profile_levels_compare_two_models_on_their_shared_gemms() -> None:
    """Models a and b share (1, 8) at 16, 32, 64, 2048 and 4096 tokens: b takes 1.1x, 1.25x,
    1.25x, 0.8x and 0.8x a's time (at 16 tokens its TP-2, TP-4 and TP-8 profiles' times of one
    GEMM, 10, 11 and 15, are taken at their median, 11), so a's level is -9.09%, -20% twice and
    +25% twice: median -9.09%, and +25% above 1024 tokens. Model c shares nothing with them and
    forms no pair; a GEMM only one model timed is not compared."""

    import pandas as pd

    from simulator.gemm_fit import profile_levels

    rows = pd.DataFrame(
        [
            ("a", 1, 1, 8, 16, 10.0),
            ("b", 2, 1, 8, 16, 10.0),
            ("b", 4, 1, 8, 16, 11.0),
            ("b", 8, 1, 8, 16, 15.0),
            ("a", 1, 1, 8, 32, 10.0),
            ("b", 2, 1, 8, 32, 12.5),
            ("a", 1, 1, 8, 64, 10.0),
            ("b", 2, 1, 8, 64, 12.5),
            ("a", 1, 1, 8, 2048, 100.0),
            ("b", 2, 1, 8, 2048, 80.0),
            ("a", 1, 1, 8, 4096, 200.0),
            ("b", 2, 1, 8, 4096, 160.0),
            ("a", 1, 2, 8, 4096, 50.0),
            ("c", 1, 3, 8, 4096, 70.0),
        ],
        columns=["model", "tp", "K", "N", "num_tokens", "time_s"],
    )
    ((a, b, count, level, level_big),) = profile_levels(rows)
    assert (a, b, count) == ("a", "b", 5)
    assert level == pytest.approx((10 / 11 - 1.0) * 100.0)
    assert level_big == pytest.approx(25.0)
    assert np.isnan(profile_levels(rows[rows["num_tokens"] < 1024])[0][4])


def test_shipped_tile_fit_reproduces_its_recorded_error() -> None:
    from simulator.calibrate import CALIBRATION_PATH, load_vidur
    from simulator.gemm_fit import gemm_rows, predict_tiles

    report = json.loads(CALIBRATION_PATH.read_text())["report"]["gemm_fit"]
    rows = gemm_rows(load_vidur())
    ape = np.abs(predict_tiles(rows, load_a100_params().gemm) / rows["time_s"] - 1) * 100
    assert len(rows) == report["rows"]
    assert float(np.median(ape)) == pytest.approx(report["in_sample_median_ape_percent"], rel=1e-3)
    assert float(np.median(ape)) < 6.0 and float(np.percentile(ape, 90)) < 15.0


def test_gemm_shapes_match_layer_work() -> None:
    from simulator.cost import layer_work

    model = get_model("qwen-72b")
    work = layer_work(model, 10.0, 8)
    for op, (k, n) in gemm_shapes(model, 8).items():
        if op != "lm_head":
            assert work[op][0] == pytest.approx(2 * 10 * k * n), op
    assert gemm_shapes(model, 1)["mlp_up_proj"] == (8192, 2 * 24576)


# ---- solm cost --set / --explain -------------------------------------------------------------
def _run(argv: list[str]) -> int:
    from solm.commands import cost

    parser = argparse.ArgumentParser(prog="solm")
    cost.add_parser(parser.add_subparsers(dest="command", required=True))
    return cost.run(parser.parse_args(["cost", *argv]))


@pytest.mark.parametrize(
    "setting,needle",
    [
        ("num_cores=200", "unknown hardware field"),
        ("num_sms", "FIELD=VALUE"),
        ("num_sms=0", "num_sms"),
        ("num_sms=12.5", "whole number"),
        ("num_sms=true", "num_sms must be a number > 0, got 'true'"),  # was "must be > 0, got 'true'"
        ("memory_efficiency=high", "memory_efficiency must be a number in (0, 1]"),
    ],
)
def test_solm_cost_bad_set_is_one_line(setting: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--model", "llama-3-8b", "--hardware", "h100-sxm", "--set", setting]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1
    assert lines[0].startswith("solm cost: error: --set") and needle in lines[0]


def test_solm_cost_set_more_sms_is_faster(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "llama-3-70b", "--hardware", "h100-sxm", "--tokens", "4096", "--json"]
    assert _run(argv) == 0
    base = json.loads(capsys.readouterr().out)
    assert _run([*argv, "--set", "num_sms=264"]) == 0
    more = json.loads(capsys.readouterr().out)
    assert more["hardware"] == "h100-sxm-custom"
    assert more["steps"][0]["step_time_ms"] < 0.75 * base["steps"][0]["step_time_ms"]


def test_solm_cost_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--model", "llama-3-8b", "--hardware", "a100-80g", "--tokens", "1,4096", "--explain"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("why (GEMM kernels") for line in lines)
    explain = json.loads(lines[-1])["explain"]
    assert {row["op"] for row in explain} == set(GEMM_OPS)
    first = {row["op"]: row for row in explain if row["num_tokens"] == 1}
    last = {row["op"]: row for row in explain if row["num_tokens"] == 4096}
    assert first["mlp_up_proj"]["bound"] == "memory"
    assert last["mlp_up_proj"]["bound"] in ("compute", "wave")
    assert last["mlp_up_proj"]["waves"] > 1 and re.fullmatch(r"\d+x\d+x\d+", last["mlp_up_proj"]["tile"])


def test_the_steps_bench_prints_the_profiles_it_quotes() -> None:
    """`bench/cost_model.py --steps` (the data docs/cost_model.md quotes, no model): every shape
    timed at 128, 136, 192 and 200 tokens gets its two changes, computed from the profiles' times,
    and the example series are the profile's own times."""
    import json
    import subprocess
    import sys

    from simulator.calibrate import load_vidur
    from simulator.gemm_fit import gemm_rows

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(root / "bench" / "cost_model.py"), "--steps"], capture_output=True, text=True, check=True
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    rows = gemm_rows(load_vidur())
    times = rows.groupby(["K", "N", "num_tokens"])["time_s"].median()
    assert len(figures["jumps_percent"]) == 45
    up, down = figures["jumps_percent"]["4096x8192"]
    assert up == pytest.approx(100 * (times[4096, 8192, 136] / times[4096, 8192, 128] - 1), abs=0.05)
    assert down == pytest.approx(100 * (times[4096, 8192, 200] / times[4096, 8192, 192] - 1), abs=0.05)
    profile = rows[(rows["model"] == "Llama-2-70b-hf") & (rows["tp"] == 2) & (rows["op"] == "attn_post_proj")]
    us = profile.set_index("num_tokens")["time_s"] * 1e6
    assert figures["series_us"]["Llama-2-70b-hf/tp2/attn_post_proj/200-200"] == [round(us[200], 1)] * 2
    span = us[(us.index >= 136) & (us.index <= 192)]
    assert figures["series_us"]["Llama-2-70b-hf/tp2/attn_post_proj/136-192"] == [
        round(span.min(), 1),
        round(span.max(), 1),
    ]


def test_tile_shape_times_are_the_candidates_of_the_choice() -> None:
    """`tile_shape_times` (each tile shape at its best split-K, what `--choice` studies) holds the
    candidates `gemm_kernel` weighs: their minimum is the fastest kernel (choice_q 0), their power
    mean the shipped time."""
    from simulator.gemm import tile_shape_times

    a100 = get_hardware("a100-80g")
    shipped = load_a100_params().gemm
    m = np.array([1.0, 7.0, 136.0, 200.0, 1000.0, 4096.0, 20000.0])
    for k, n in SHAPES:
        candidates = np.stack(list(tile_shape_times(m, k, n, a100, shipped).values()))
        fastest = gemm_kernel(m, k, n, a100, dataclasses.replace(shipped, choice_q=0.0)).time_s
        np.testing.assert_allclose(candidates.min(axis=0), fastest, rtol=1e-12)
        q = shipped.choice_q
        mean = np.mean(candidates**-q, axis=0) ** (-1 / q)
        np.testing.assert_allclose(mean, gemm_kernel(m, k, n, a100, shipped).time_s, rtol=1e-9)
    assert set(tile_shape_times(m, 4096, 4096, a100, shipped)) == {tile.label for tile in TILES["ampere"]}
    with pytest.raises(ValueError, match="chip layout"):
        tile_shape_times(m, 4096, 4096, get_hardware("host-cpu"), shipped)


def test_the_choice_bench_scores_its_oracle_and_learned_choices() -> None:
    """`bench/cost_model.py --choice`: the shipped figure is the shipped model's in-sample error,
    the oracle (the shape closest to each measured time) beats both the power mean and the
    fastest shape, and every learned choice is scored."""
    import subprocess
    import sys

    from simulator.calibrate import load_vidur
    from simulator.gemm_fit import ape_percent, gemm_rows, predict_tiles

    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cost_model.py"), "--choice"], capture_output=True, text=True, check=True
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    rows = gemm_rows(load_vidur())
    ape = ape_percent(predict_tiles(rows, load_a100_params().gemm), rows["time_s"])
    assert figures["shipped_median_ape_percent"] == pytest.approx(np.median(ape), abs=0.006)
    assert figures["shipped_p90_ape_percent"] == pytest.approx(np.percentile(ape, 90), abs=0.006)
    for stat in ("median", "p90"):
        oracle = figures[f"oracle_{stat}_ape_percent"]
        assert oracle < figures[f"shipped_{stat}_ape_percent"] and oracle < figures[f"fastest_{stat}_ape_percent"]
        # the pick per row is each row's closest: no pick per shape and band can beat it anywhere
        for group in ("per_octave", "per_band"):
            assert oracle <= figures[f"oracle_{group}_{stat}_ape_percent"]
    assert 0 < figures["oracle_is_fastest_percent"] < 100
    # each seed's two halves hold every row out once, so the learned choices' rows are every row twice
    for stat in ("median", "p90"):
        assert figures[f"dev_shipped_{stat}_ape_percent"] == figures[f"shipped_{stat}_ape_percent"]
    learned = [key for key in figures if key.startswith("learned_") and key.endswith("_median_ape_percent")]
    assert len(learned) == 4 and all(0 < figures[key] < 100 for key in learned)
