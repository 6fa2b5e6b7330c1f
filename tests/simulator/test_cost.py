"""Cost model, calibration and `solm cost`: physics sanity, monotonicity, the roofline regime of
decode and prefill, the held-out error of the A100 calibration on the public vidur data, fits
on measured steps, and the command's JSON line."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from simulator.cost import LAYER_OPS, CostModel, CostParams, default_params, layer_work, load_a100_params
from simulator.hardware import HARDWARE, get_hardware, override
from simulator.models import get_model

VIDUR_DIR = Path(__file__).resolve().parents[2] / "simulator" / "data" / "vidur-a100"


@pytest.fixture(scope="module")
def a100_llama3() -> CostModel:
    return CostModel(get_hardware("a100-80g"), get_model("llama-3-8b"))


def causal_kv(n: np.ndarray | int, context: int = 0) -> np.ndarray | int:
    """kv_tokens_read of a causal prefill of n tokens after `context` cached ones."""
    return n * (n + 1) // 2 + n * context


# ---- physics and shape ----------------------------------------------------------------------
def test_op_keys(a100_llama3: CostModel) -> None:
    assert tuple(a100_llama3.op_times_s(8, 800)) == LAYER_OPS
    tp4 = CostModel(get_hardware("h100-sxm"), get_model("llama-3-70b"), tensor_parallel=4)
    assert tuple(tp4.op_times_s(8, 800)) == (*LAYER_OPS, "all_reduce")
    assert tp4.op_times_s(8, 800)["all_reduce"] > 0


def test_decode_and_prefill_use_their_own_attention_kernel(a100_llama3: CostModel) -> None:
    decode = a100_llama3.op_times_s(1, 4096)
    assert decode["attn_decode"] > 0 and decode["attn_prefill"] == 0
    prefill = a100_llama3.op_times_s(512, causal_kv(512))
    assert prefill["attn_prefill"] > 0 and prefill["attn_decode"] == 0
    batch = a100_llama3.op_times_s(32, 32 * 4096, query_groups=32)  # 32 sequences, 1 row each
    assert batch["attn_decode"] > 0 and batch["attn_prefill"] == 0


def test_decode_is_memory_bound_and_prefill_compute_bound_on_a100(a100_llama3) -> None:
    assert a100_llama3.bound(1, 2048) == "memory"
    assert a100_llama3.bound(32, 32 * 2048, query_groups=32) == "memory"
    assert a100_llama3.bound(4096, causal_kv(4096)) == "compute"


def test_decode_cannot_beat_the_bandwidth_roof(a100_llama3: CostModel) -> None:
    """One decode step streams every weight once: at least weight_bytes / bandwidth."""
    model, hardware = a100_llama3.model, a100_llama3.hardware
    floor_s = model.weight_bytes / hardware.hbm_bytes_per_s
    step_s = a100_llama3.step_time_s(1, 1024)
    assert floor_s < step_s < 2 * floor_s


def test_prefill_cannot_beat_the_compute_roof(a100_llama3: CostModel) -> None:
    n = 4096
    flops = 2 * a100_llama3.model.params * n  # every weight once per token, multiply-add
    floor_s = flops / a100_llama3.hardware.peak_flops_per_s
    step_s = a100_llama3.step_time_s(n, causal_kv(n))
    assert floor_s < step_s < 2 * floor_s


@pytest.mark.parametrize("hardware", ["a100-80g", "h100-sxm", "l4", "host-cpu", "mi300x"])
@pytest.mark.parametrize("model", ["llama-3-8b", "phi-2", "gemma-7b", "qwen3-4b"])
def test_monotone_in_tokens_and_kv(hardware: str, model: str) -> None:
    cost = CostModel(get_hardware(hardware), get_model(model))
    n = np.arange(1, 4097, dtype=float)
    for context in (0, 100, 8000):
        times = cost.step_time_s(n, causal_kv(n, context))
        assert np.all(np.diff(times) > 0), f"not increasing in tokens (context {context})"
    times = cost.step_time_s(n, n * 2048, query_groups=n)  # batched decode
    assert np.all(np.diff(times) > 0)
    kv = np.arange(0, 200_000, 97, dtype=float)
    for tokens in (1, 64, 2048):
        times = cost.step_time_s(np.full_like(kv, tokens), kv)
        assert np.all(np.diff(times) >= 0), f"not increasing in kv ({tokens} tokens)"
    per_op = cost.op_times_s(n, causal_kv(n))
    for op, times in per_op.items():
        if op not in ("attn_prefill", "attn_decode"):
            assert np.all(np.diff(times) >= 0), op


def test_faster_parts_are_faster() -> None:
    model = get_model("llama-3-8b")
    cases = [(1, 2048), (4096, causal_kv(4096))]
    for n, kv in cases:
        a100, h100, b200 = (
            CostModel(get_hardware(name), model).step_time_s(n, kv) for name in ("a100-80g", "h100-sxm", "b200")
        )
        assert b200 < h100 < a100
    # more bandwidth helps decode a lot and prefill little
    base = CostModel(get_hardware("h100-sxm"), model)
    wide = CostModel(override("h100-sxm", hbm_bytes_per_s=6.7e12), model, base.params)
    # 2x the bandwidth: the streaming part halves, ~1.2 ms of kernel launches per step stays
    decode_gain = 1 - wide.step_time_s(1, 2048) / base.step_time_s(1, 2048)
    prefill_gain = 1 - wide.step_time_s(4096, causal_kv(4096)) / base.step_time_s(4096, causal_kv(4096))
    assert decode_gain > 0.3
    assert 0 < prefill_gain < 0.5 * decode_gain  # compute-bound GEMMs gain only their memory share


def test_tensor_parallel_shards_the_work() -> None:
    model = get_model("llama-3-70b")
    tp1 = CostModel(get_hardware("h100-sxm"), model)
    tp4 = CostModel(get_hardware("h100-sxm"), model, tensor_parallel=4)
    assert tp4.step_time_s(1, 2048) < 0.5 * tp1.step_time_s(1, 2048)
    w1, w4 = layer_work(model, 64.0, 1), layer_work(model, 64.0, 4)
    assert w4["mlp_up_proj"][0] == pytest.approx(w1["mlp_up_proj"][0] / 4)
    assert w4["input_layernorm"] == w1["input_layernorm"]  # norms are not sharded


def test_tensor_parallel_shards_the_lm_head() -> None:
    """The lm_head's vocab columns are split over the shards, in the tile model's shapes (GPUs)
    and in the roofline's work (parts without a chip layout) alike."""
    from simulator.cost import gemm_shapes, pass_work

    model = get_model("llama-3-70b")
    d, vocab = model.d_model, model.vocab_size
    assert gemm_shapes(model, 4)["lm_head"] == (d, vocab / 4)
    flops = pass_work(model, 10.0, 10.0, 4)["lm_head"][0]
    assert flops == pytest.approx(2 * 10 * d * vocab / 4 + 5 * 10 * d)


def test_tile_lm_head_is_its_gemm_plus_the_final_norm(a100_llama3: CostModel) -> None:
    gemm_s = a100_llama3.gemm_kernel("lm_head", 64).time_s
    lm_head_s = a100_llama3.pass_op_times_s(64)["lm_head"]
    assert gemm_s < lm_head_s < 1.5 * gemm_s  # the norm over 64 rows is small beside a 128k-wide GEMM


def test_tensor_parallel_adds_two_all_reduces_of_the_activations_per_layer() -> None:
    from simulator.comm import collective_time_s

    hardware, model = get_hardware("h100-sxm"), get_model("llama-3-70b")
    tp4 = CostModel(hardware, model, tensor_parallel=4)
    activations = 512 * model.d_model * model.dtype_bytes
    expected = 2 * collective_time_s("all_reduce", activations, 4, hardware)
    assert tp4.op_times_s(512, causal_kv(512))["all_reduce"] == pytest.approx(expected, rel=1e-12)
    assert "all_reduce" not in CostModel(hardware, model).op_times_s(512, causal_kv(512))


def test_scalar_and_vector_agree(a100_llama3: CostModel) -> None:
    n = np.array([1, 7, 64, 300, 4096])
    kv = causal_kv(n, 500)
    groups = np.array([1, 7, 1, 3, 1])
    vector = a100_llama3.step_time_s(n, kv, groups)
    scalar = [a100_llama3.step_time_s(int(a), int(b), int(c)) for a, b, c in zip(n, kv, groups)]
    assert isinstance(scalar[0], float)
    np.testing.assert_allclose(vector, scalar, rtol=1e-12)


def test_bad_counts_raise_one_line(a100_llama3: CostModel) -> None:
    for args in [(0, 10), (4, -1), (np.array([1, 0]), np.array([1, 1]))]:
        with pytest.raises(ValueError):
            a100_llama3.step_time_s(*args)
    with pytest.raises(ValueError, match="tensor_parallel"):
        CostModel(get_hardware("a100-80g"), get_model("llama-3-8b"), tensor_parallel=0)


def test_params_round_trip_through_json() -> None:
    params = load_a100_params()
    again = CostParams.from_json(json.loads(json.dumps(params.to_json())))
    assert again == params


def test_default_params_carry_the_a100_fit_to_other_parts() -> None:
    assert default_params(get_hardware("a100-80g")) == load_a100_params()
    mi300x = default_params(get_hardware("mi300x"))
    a100 = load_a100_params()
    ratio = HARDWARE["mi300x"].matmul_efficiency / HARDWARE["a100-80g"].matmul_efficiency
    assert mi300x.families["up_proj"].compute_eff_max == pytest.approx(a100.families["up_proj"].compute_eff_max * ratio)
    assert default_params(get_hardware("host-cpu")).source == "prior(host-cpu)"


def test_scaled_to_carries_compute_and_memory_by_their_own_ratios() -> None:
    a100 = get_hardware("a100-80g")
    part = override(
        "a100-80g", matmul_efficiency=a100.matmul_efficiency / 2, memory_efficiency=a100.memory_efficiency * 0.8
    )
    prior = CostParams.prior(a100)
    carried = prior.scaled_to(part, a100)
    assert carried.families["norm"].compute_eff_max == pytest.approx(prior.families["norm"].compute_eff_max / 2)
    assert carried.families["norm"].memory_eff == pytest.approx(prior.families["norm"].memory_eff * 0.8)
    assert carried.gemm is not None and prior.gemm is not None
    assert carried.gemm.memory_eff == pytest.approx(prior.gemm.memory_eff * 0.8)


# ---- calibration ----------------------------------------------------------------------------
def test_a100_calibration_heldout_error() -> None:
    from simulator.calibrate import a100_op_errors

    for split in ("interleaved", "model"):
        errors = a100_op_errors(VIDUR_DIR, split=split)
        print(f"A100 held-out median APE % ({split}):", {family: round(error, 1) for family, error in errors.items()})
        # measured: matmul families 4.4-5.9 %, elementwise families 4.6-12.1 %
        for family in ("qkv_proj", "o_proj", "up_proj", "down_proj"):
            assert errors[family] < 10.0, family
        for family in ("norm", "rope", "act", "add", "emb"):
            assert errors[family] < 20.0, family


def test_shipped_calibration_is_what_the_code_fits() -> None:
    """simulator/data/a100_calibration.json is regenerated by write_a100_calibration(): the shipped
    and the refitted parameters predict every measured row alike (within 0.1%). Parameters are not
    compared directly: one the data does not constrain (emb's compute_half_tokens, its compute
    efficiency pinned at the bound, so the op is memory-bound at every size) lands elsewhere on
    another CPU's floating point and changes no prediction."""
    from simulator.calibrate import A100, _predict, _work_arrays, fit_a100, load_vidur

    table = load_vidur(VIDUR_DIR)
    fitted = fit_a100(table)
    shipped = load_a100_params()
    assert shipped.smooth_p == fitted.smooth_p
    for family, rows in table.groupby("family"):
        work = _work_arrays(rows.reset_index(drop=True))
        ours = _predict(np.array(dataclasses.astuple(fitted.families[str(family)])), work, A100, fitted.smooth_p)
        theirs = _predict(np.array(dataclasses.astuple(shipped.families[str(family)])), work, A100, shipped.smooth_p)
        np.testing.assert_allclose(theirs, ours, rtol=1e-3, err_msg=str(family))


def test_fit_steps_recovers_a_line() -> None:
    from simulator.calibrate import StepFit, fit_steps

    rng = np.random.default_rng(0)
    q = rng.integers(1, 64, 400)
    kv = q * rng.integers(10, 2000, 400)
    truth = StepFit(2e-3, 1e-4, 1e-7)
    duration = truth.predict_s(q, kv) * rng.normal(1.0, 0.02, 400)
    fit = fit_steps(np.stack([q, kv, duration], axis=1))
    assert fit.overhead_s == pytest.approx(2e-3, rel=0.05)
    assert fit.per_query_token_s == pytest.approx(1e-4, rel=0.05)
    assert fit.per_kv_token_s == pytest.approx(1e-7, rel=0.05)
    assert fit.heldout_median_ape_percent < 3
    assert StepFit.from_json(json.loads(json.dumps(fit.to_json()))) == fit


def test_fit_cost_params_to_steps_recovers_a_slower_part() -> None:
    """Steps timed on a part 2x slower in compute, 1.5x in memory, with 3 ms host overhead."""
    from simulator.calibrate import fit_cost_params_to_steps

    hardware, model = get_hardware("host-cpu"), get_model("qwen3-4b")
    truth_hw = override(
        "host-cpu", peak_flops_per_s=hardware.peak_flops_per_s / 2, hbm_bytes_per_s=hardware.hbm_bytes_per_s / 1.5
    )
    truth = CostModel(truth_hw, model, dataclasses.replace(CostParams.prior(hardware), step_overhead_s=3e-3))
    q = np.array([1, 1, 1, 4, 4, 16, 64, 128, 256, 512] * 3)
    kv = causal_kv(q, 300)
    groups = np.where(q <= 4, q, 1)
    steps = np.stack([q, kv, truth.step_time_s(q, kv, groups), groups], axis=1)
    params = fit_cost_params_to_steps(hardware, model, steps)
    predicted = CostModel(hardware, model, params).step_time_s(q, kv, groups)
    np.testing.assert_allclose(predicted, steps[:, 2], rtol=0.02)
    assert params.step_overhead_s == pytest.approx(3e-3, rel=0.1)


def test_calibrate_on_a_real_cpu_trace(request: pytest.FixtureRequest) -> None:
    """The runtime's own capture: its model dict builds a ModelSpec; the fits beat the priors."""
    pytest.importorskip("runtime.capture")
    import pandas as pd

    from simulator.calibrate import fit_cost_params_to_steps, fit_steps
    from simulator.hardware import host_cpu_spec
    from simulator.models import ModelSpec

    trace = request.getfixturevalue("small_trace")
    model = ModelSpec.from_trace_meta(json.loads((trace / "meta.json").read_text()))
    steps = pd.read_parquet(trace / "steps.parquet")
    q, kv, groups = (steps[c].to_numpy(float) for c in ("query_tokens", "kv_tokens_read", "active_streams"))
    duration = steps["duration_s"].to_numpy(float)
    line = fit_steps(np.stack([q, kv, duration], axis=1))
    hardware = host_cpu_spec()
    params = fit_cost_params_to_steps(hardware, model, np.stack([q, kv, duration, groups], 1))

    def median_ape(cost: CostModel) -> float:
        return float(np.median(np.abs(cost.step_time_s(q, kv, groups) / duration - 1)) * 100)

    prior_ape = median_ape(CostModel(hardware, model))
    fitted_ape = median_ape(CostModel(hardware, model, params))
    print(
        f"CPU trace ({len(q)} steps): line held-out APE {line.heldout_median_ape_percent:.1f}%,"
        f" cost model APE prior {prior_ape:.1f}% -> fitted {fitted_ape:.1f}%"
    )
    assert np.isfinite(line.heldout_median_ape_percent) and line.overhead_s >= 0
    assert fitted_ape <= prior_ape + 5.0


# ---- solm cost ------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    from solm.commands import cost

    parser = argparse.ArgumentParser(prog="solm")
    subparsers = parser.add_subparsers(dest="command", required=True)
    cost.add_parser(subparsers)
    return parser


def _run(argv: list[str]) -> int:
    from solm.commands import cost

    return cost.run(_parser().parse_args(["cost", *argv]))


def test_solm_cost_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = _run(["--model", "llama-3-8b", "--hardware", "a100-80g", "--tokens", "1,512,4096", "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1
    result = json.loads(out[-1])
    assert result["model"] == "llama-3-8b" and result["hardware"] == "a100-80g"
    rows = result["ops"]
    assert {row["num_tokens"] for row in rows} == {1, 512, 4096}
    assert {row["op"] for row in rows} == set(LAYER_OPS)
    for row in rows:
        assert set(row) >= {"num_tokens", "op", "time_ms"} and row["time_ms"] >= 0
    up = {row["num_tokens"]: row["time_ms"] for row in rows if row["op"] == "mlp_up_proj"}
    assert up[1] < up[512] < up[4096]


def test_solm_cost_table_then_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = _run(
        [
            "--model",
            "llama-3-70b",
            "--hardware",
            "h100-sxm",
            "--tp",
            "4",
            "--tokens",
            "32",
            "--kv-tokens",
            "4096",
            "--groups",
            "32",
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(lines) > 5
    assert any(line.startswith("mlp_up_proj") for line in lines)
    result = json.loads(lines[-1])
    assert result["tensor_parallel"] == 4
    assert result["steps"][0]["kv_tokens_read"] == 32 * 4096
    assert "all_reduce" in {row["op"] for row in result["ops"]}


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "llama-9", "--hardware", "a100-80g"], "unknown model"),
        (["--model", "llama-3-8b", "--hardware", "tpu-v9"], "unknown hardware"),
        (["--model", "llama-3-8b", "--hardware", "h200", "--tokens", "1,2.5"], "--tokens"),
        (["--model", "llama-3-8b", "--hardware", "h200", "--tokens", "0"], "--tokens"),
        (["--model", "llama-3-8b", "--hardware", "h200", "--kv-tokens", "-5"], "--kv-tokens"),
    ],
)
def test_solm_cost_bad_input(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("solm cost: error:") and needle in lines[0]


def test_solm_cost_calibrated_from_a_trace(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--calibrate-from`: the prediction uses parameters fitted to the trace's measured passes (a
    trace timed with a 5 ms per-pass overhead puts that overhead in every pass); a bad trace is one line."""
    import dataclasses as dc

    from simulator.cost import CostModel, CostParams
    from simulator.hardware import get_hardware
    from simulator.models import ModelSpec
    from tests.simulator.toy_traces import MODEL_META, seq, write_toy_trace

    hw = get_hardware("host-cpu")
    truth = CostModel(
        hw, ModelSpec.from_trace_meta(MODEL_META), dc.replace(CostParams.prior(hw), step_overhead_s=0.005)
    )
    trace = write_toy_trace(tmp_path / "t", [seq(6, 8), seq(9, 10)], [6, 9], timed_by=truth)
    assert _run(["--model", "llama-3-8b", "--hardware", "host-cpu", "--tokens", "1", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        _run(
            [
                "--model",
                "llama-3-8b",
                "--hardware",
                "host-cpu",
                "--tokens",
                "1",
                "--calibrate-from",
                str(trace),
                "--json",
            ]
        )
        == 0
    )
    fitted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "fitted to" in fitted["calibration"] and str(trace) in fitted["calibration"]
    assert fitted["steps"][0]["step_time_ms"] >= 4.5  # the fitted per-pass overhead is in every pass
    assert fitted["steps"][0]["step_time_ms"] != plain["steps"][0]["step_time_ms"]
    assert _run(["--model", "llama-3-8b", "--hardware", "h200", "--calibrate-from", str(tmp_path / "none")]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize(("hardware", "model", "tp"), [("h100-sxm", "llama-3-8b", 1), ("a100-80g", "llama-3-70b", 4)])
def test_scalar_and_array_costs_agree_to_the_last_bits(hardware: str, model: str, tp: int) -> None:
    """The replay costs short stretches one pass at a time (cached by exact shape) and long ones in one
    array call: both must give the same float, or a timeline would depend on how it was planned.
    (Up to the GEMM tables' width, without pipeline stages: off the tables, as a wider pass or a
    stage's micro-batch of fractional rows, the two may differ by an ulp, and the replay keeps its
    old split there.) Bitwise on CPUs where numpy's power is the C library's; within 4 ulp where
    numpy vectorises it (AVX-512: an array's p-norm then differs from a Python float's by an ulp
    or two in 2% of passes, a machine this test met on 2026-12-02)."""
    from simulator.cluster.parallel import ParallelCost, Parallelism
    from simulator.cost import GEMM_TABLE_TOKENS

    rng = np.random.default_rng(7)
    q = rng.integers(1, GEMM_TABLE_TOKENS + 1, 400)
    g = np.minimum(q, rng.integers(1, 300, 400))
    kv = q * rng.integers(1, 4000, 400)
    lg = np.maximum(g // 2, 1)
    hw, m = get_hardware(hardware), get_model(model)
    for cost in (CostModel(hw, m), ParallelCost(hw, m, Parallelism(tp=tp))):
        array = cost.step_time_s(q.astype(float), kv.astype(float), g.astype(float), lg.astype(float))
        one_by_one = [cost.step_time_s(*shape) for shape in zip(q.tolist(), kv.tolist(), g.tolist(), lg.tolist())]
        np.testing.assert_array_max_ulp(array, np.array(one_by_one), maxulp=4)


@pytest.mark.parametrize(("hardware", "tp"), [("h100-sxm", 1), ("a100-80g", 4)])
def test_dense_parts_sum_to_the_dense_time_bitwise(hardware: str, tp: int) -> None:
    """The scalar path caches the dense time in parts (by token count, by logit rows): same floats."""
    cost = CostModel(get_hardware(hardware), get_model("llama-3-70b" if tp > 1 else "llama-3-8b"), tensor_parallel=tp)
    rng = np.random.default_rng(5)
    for q, lg in zip(rng.integers(1, 9000, 300).tolist(), rng.integers(1, 9000, 300).tolist()):
        assert cost._dense_scalar_s(q, lg) == cost._dense_time_s(q, lg), (q, lg)


@pytest.mark.parametrize(("hardware", "model", "tp"), [("h100-sxm", "llama-3-8b", 1), ("a100-80g", "llama-3-70b", 4)])
def test_inlined_scalar_attention_is_bitwise_the_general_one(hardware: str, model: str, tp: int) -> None:
    """`_attention_scalar_s` (the replay's per-pass path) is `_attention_s` inlined: the same floats."""
    cost = CostModel(get_hardware(hardware), get_model(model), tensor_parallel=tp)
    rng = np.random.default_rng(11)
    q = rng.integers(1, 9000, 300)
    g = np.minimum(q, rng.integers(1, 300, 300))
    kv = q * rng.integers(0, 4000, 300)
    for shape in zip(q.tolist(), kv.tolist(), g.tolist()):
        for op in ("attn_prefill", "attn_decode"):
            assert cost._attention_scalar_s(*shape, op) == cost._attention_s(*shape, op), (shape, op)
