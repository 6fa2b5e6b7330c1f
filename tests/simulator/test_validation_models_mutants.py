"""Mutation round on simulator/validation.py, calibrate.py, models.py and gemm_calibration.py.

70 mutants (validation 23, models 17, calibrate 15, gemm_calibration 15): 36 killed by the
existing tests (8, 11, 4, 13), the other 34 survived them; this file kills 33 of those. One is
equivalent: gemm_calibration's check of a vidur row's `num_tokens >= 1` left out (its time > 0
check kept), since `num_tokens` is one of the columns refused just above unless every value is a
whole number >= 1, and the GEMM rows carry it as read.

One survivor was a bug: a serving trace whose passes each held one request's rows (a low load, no
two rows sharing a `batch_index`) was read by `pass_frame` as a batch-1 trace, and its prefill-chunk
passes (rows of no query tokens of their own) dropped; a chunk row now marks the trace as served.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from profiler.errors import TraceError, TraceMetaError, UsageError
from profiler.reader import read_trace
from simulator.cost import CostModel, CostParams
from simulator.hardware import host_cpu_spec
from simulator.models import ModelSpec
from simulator.validation import _host_gap_s, _replay_as_captured, pass_frame, trace_hardware, validate
from tests.simulator.toy_traces import MODEL_META, one_second_cost, seq, toy_part, write_toy_trace

MODEL = ModelSpec.from_trace_meta(MODEL_META)


# ---- validation: the trace's part ------------------------------------------------------------
def test_an_a100_without_its_memory_is_the_80_gb_part_and_names_match_in_any_case():
    assert trace_hardware({"device": {"type": "cuda", "name": "NVIDIA A100-SXM4"}}).name == "a100-80g"
    assert trace_hardware({"device": {"type": "cuda", "name": "nvidia h200"}}).name == "h200"


def test_a_cpu_trace_without_threads_takes_the_hosts_cores():
    assert trace_hardware({"device": {"type": "cpu"}, "host": {"cores": 3}}).name == "host-cpu-3c"


@pytest.mark.parametrize("cores", [True, 2.5, -2])
def test_cores_that_are_not_a_whole_number_are_a_trace_error(cores):
    with pytest.raises(TraceError, match="whole number of cores"):
        trace_hardware({"device": {"type": "cpu", "threads": cores}})


# ---- validation: the passes --------------------------------------------------------------------
def _steps(**columns) -> pd.DataFrame:
    """Two batch-1 passes of one request (numbered 0 and 1, as `solm capture` numbers its passes),
    columns overridden by `columns`."""
    base = {
        "request_id": [0, 0],
        "step_index": [0, 1],
        "batch_index": [0, 1],
        "query_tokens": [4, 1],
        "kv_tokens_read": [10, 5],
        "duration_s": [0.01, 0.002],
        "start_s": [0.0, 0.02],
        "active_streams": [1, 1],
    }
    return pd.DataFrame({**base, **columns})


def test_a_pass_that_took_no_time_is_a_trace_error():
    with pytest.raises(TraceError, match="pass 1 took 0 s"):
        pass_frame(_steps(duration_s=[0.01, 0.0]))


def test_a_batch1_row_without_query_tokens_is_no_pass():
    f = pass_frame(_steps(query_tokens=[4, 0]))
    assert f["query_tokens"].tolist() == [4.0] and f["duration_s"].tolist() == [0.01]


def _served(**columns) -> pd.DataFrame:
    """A serving trace at one request a pass: a 6-row prefill chunk (nothing sampled, host_s NaN),
    then the prompt's last 2 rows, sampled; every batch_index its own."""
    base = {
        "request_id": [0, 0],
        "step_index": [-1, 0],
        "batch_index": [3, 4],
        "query_tokens": [0, 2],
        "kv_tokens_read": [0, 8],
        "attention_kv_tokens": [21, 15],
        "batch_query_tokens": [6, 2],
        "duration_s": [0.006, 0.003],
        "start_s": [1.0, 1.01],
        "active_streams": [0, 1],
        "chunk": [True, False],
        "host_s": [np.nan, 0.0004],
    }
    return pd.DataFrame({**base, **columns})


def test_a_served_chunk_is_a_pass_even_when_no_pass_holds_two_rows():
    """Was: a serving trace whose passes each held one request's rows (a low load) read as a
    batch-1 trace, its prefill chunks (no query tokens of their own) dropped from the passes."""
    f = pass_frame(_served())
    assert f[["query_tokens", "kv_tokens_read", "duration_s", "active_streams"]].to_numpy().tolist() == [
        [6, 21, 0.006, 1],
        [2, 15, 0.003, 1],
    ]
    assert f["host_s"].tolist() == [0.0, 0.0004]  # a chunk samples nothing: no host work, not unknown


def test_host_gap_is_the_median_gap_within_a_request_never_below_zero():
    # request 0: gaps 0.1 then 0.3; request 1 (8 s after request 0 ended): gap 0.2; rows out of order
    steps = pd.DataFrame(
        {
            "request_id": [1, 0, 0, 1, 0],
            "step_index": [1, 2, 0, 0, 1],
            "start_s": [11.2, 2.4, 0.0, 10.0, 1.1],
            "duration_s": [1.0, 1.0, 1.0, 1.0, 1.0],
        }
    )
    trace = SimpleNamespace(steps=steps)
    assert _host_gap_s(trace, [0, 1]) == pytest.approx(0.2)
    assert _host_gap_s(trace, [0]) == pytest.approx(0.2)  # the median of 0.1 and 0.3
    overlapping = steps.assign(start_s=[10.5, 1.8, 0.0, 10.0, 0.9])  # passes that overlap: negative gaps
    assert _host_gap_s(SimpleNamespace(steps=overlapping), [0, 1]) == 0.0


def test_replay_as_captured_runs_one_request_at_a_time(tmp_path):
    """Two requests of 3 passes on a part where every pass takes 1 s: a closed loop of one client,
    the second sent when the first is done (at 3 s), as `solm capture` ran them, not batched beside it."""
    from simulator.workload import from_trace

    path = write_toy_trace(tmp_path / "t", [seq(4, 3), seq(4, 3)], [4, 4])
    part = toy_part()
    res = _replay_as_captured(from_trace(read_trace(path)), part, MODEL, one_second_cost(part, MODEL))
    assert res.requests["start_s"].tolist() == [0.0, 3.0] and res.requests["e2e_s"].tolist() == [3.0, 3.0]


def _timed(tmp_path, n: int = 6):
    hw = host_cpu_spec(2)
    truth = CostModel(hw, MODEL, dataclasses.replace(CostParams.prior(hw), step_overhead_s=0.002))
    reqs = [seq(6 + 3 * i, 8 + i) for i in range(n)]
    return read_trace(write_toy_trace(tmp_path / "t", reqs, [6 + 3 * i for i in range(n)], timed_by=truth))


def test_host_gap_is_measured_on_the_calibration_half_and_errors_are_left_out(tmp_path):
    trace = _timed(tmp_path)
    s = trace.steps
    gap = np.where(s["request_id"] % 2 == 0, 1e-3, 5e-3)  # even requests calibrate, odd ones check
    steps = s.assign(start_s=s["start_s"] + s["step_index"] * gap)
    v = validate(dataclasses.replace(trace, steps=steps))
    assert v["host_gap_s"] == pytest.approx(1e-3)
    failed = trace.requests.assign(status=np.where(trace.requests["request_id"] == 0, "error", "ok"))
    v = validate(dataclasses.replace(trace, requests=failed))
    assert (v["calibration_requests"], v["check_requests"]) == (3, 2)


def test_a_calibration_half_of_fewer_than_4_passes_is_refused(tmp_path):
    path = write_toy_trace(tmp_path / "t", [seq(4, 3), seq(4, 3)], [4, 4], timed_by=one_second_cost(toy_part(), MODEL))
    with pytest.raises(UsageError, match="calibration half has 3 forward passes; need >= 4"):
        validate(path, hardware=toy_part())


# ---- models --------------------------------------------------------------------------------------
TINY = {"name": "t", "n_layers": 2, "d_model": 8, "n_heads": 2, "n_kv_heads": 1, "d_ff": 16, "vocab_size": 10}


def test_params_count_every_weight_by_hand():
    # head_dim 4, q 8, kv 4 wide: attention 8 x (8 + 2 x 4) + 8 x 8 = 192, gated MLP 3 x 8 x 16 = 384,
    # 2 norms of 8: a block is 592; embeddings 80, lm_head 80, final norm 8
    spec = ModelSpec(**TINY)
    assert spec.layer_params == 592 and spec.params == 80 + 80 + 2 * 592 + 8
    assert dataclasses.replace(spec, tied_embeddings=True).params == 80 + 2 * 592 + 8
    assert spec.kv_bytes_per_token == 2 * 2 * 4 * 2  # layers x (K and V) x kv width x bf16


def test_a_width_that_heads_do_not_divide_needs_a_head_dim():
    with pytest.raises(ValueError, match="give head_dim_override"):
        ModelSpec(**{**TINY, "d_model": 9})
    assert ModelSpec(**{**TINY, "d_model": 9}, head_dim_override=4).q_dim == 8


def test_from_trace_meta_reads_the_optional_keys_and_refuses_what_is_no_count():
    meta = {**TINY, "dtype_bytes": 2}
    assert ModelSpec.from_trace_meta(meta) == ModelSpec(**TINY)
    assert ModelSpec.from_trace_meta({**meta, "head_dim": 4}) == ModelSpec(**TINY)  # d_model / n_heads: no override
    assert ModelSpec.from_trace_meta({**meta, "parallel_attn_mlp": True}).norms_per_layer == 1
    for key, value in (("n_layers", True), ("n_layers", "2"), ("d_ff", 16.0)):
        with pytest.raises(TraceMetaError, match=f"{key} must be integers"):
            ModelSpec.from_trace_meta({**meta, key: value})
    with pytest.raises(TraceMetaError, match="trace meta 'model': model 't': n_heads"):
        ModelSpec.from_trace_meta({**meta, "n_kv_heads": 3})  # an impossible shape: a TraceMetaError too


# ---- calibrate -----------------------------------------------------------------------------------
def _wide(times_ms: dict[str, list[float]], tokens: list[int]) -> pd.DataFrame:
    """A vidur profile of a tiny layer: the given ops' median times at the given token counts."""
    n = len(tokens)
    shape = {"n_head": 2, "n_kv_head": 2, "n_embd": 64, "n_expanded_embd": 128, "vocab_size": 100}
    return pd.DataFrame(
        {
            "num_tensor_parallel_workers": [1] * n,
            "num_tokens": tokens,
            **{k: [v] * n for k, v in shape.items()},
            "use_gated_mlp": [True] * n,
            **{f"time_stats.{op}.median": t for op, t in times_ms.items()},
        }
    )


def test_a_vidur_profile_merges_repeats_by_their_median():
    from simulator.calibrate import read_vidur_csv

    wide = _wide({"mlp_up_proj": [1.0, 2.0, 10.0, 4.0], "post_attention_layernorm": [1.0] * 4}, [8, 8, 8, 16])
    long = read_vidur_csv("m.mlp.csv", wide)
    up = long[long["op"] == "mlp_up_proj"].set_index("num_tokens")["time_s"]
    assert up.to_dict() == {8: pytest.approx(2e-3), 16: pytest.approx(4e-3)}
    assert not long["parallel_attn_mlp"].any() and set(long["model"]) == {"m"}
    phi = read_vidur_csv("p.mlp.csv", _wide({"mlp_up_proj": [1.0]}, [8]))  # no post-attention norm: Phi-2's kind
    assert phi["parallel_attn_mlp"].all()


def _table():
    from simulator.calibrate import read_vidur_csv

    tokens = [1, 2, 4, 8, 16, 32]
    a = read_vidur_csv("a.mlp.csv", _wide({"mlp_up_proj": [0.01, 0.011, 0.013, 0.02, 0.03, 0.05]}, tokens))
    b = read_vidur_csv("b.mlp.csv", _wide({"mlp_up_proj": [0.02, 0.02, 0.025, 0.03, 0.06, 0.09]}, tokens))
    return pd.concat([a, b], ignore_index=True)


def test_held_out_splits_hold_out_what_they_score():
    from simulator.calibrate import _split

    table = _table()
    ((train, test),) = _split(table, "interleaved")
    assert set(train["num_tokens"]) == {1, 4, 16} and set(test["num_tokens"]) == {2, 8, 32}
    folds = list(_split(table, "model"))
    assert [(set(tr["model"]), set(te["model"])) for tr, te in folds] == [({"b"}, {"a"}), ({"a"}, {"b"})]
    with pytest.raises(ValueError, match="unknown split 'tp'"):
        list(_split(table, "tp"))


def test_held_out_error_is_the_median_over_held_out_rows(monkeypatch):
    """The fit replaced by the A100 priors: the figure is the median APE of the odd rows' predictions."""
    import simulator.calibrate as calibrate

    prior = CostParams.prior(calibrate.A100)
    monkeypatch.setattr(calibrate, "fit_a100", lambda train, smooth_p=4.0: prior)
    table = _table()
    test = table[table["num_tokens"].isin([2, 8, 32])].reset_index(drop=True)
    x = np.array(dataclasses.astuple(prior.families["up_proj"]))
    ape = np.abs(calibrate._predict(x, calibrate._work_arrays(test), calibrate.A100, 4.0) / test["time_s"] - 1) * 100
    assert calibrate.heldout_errors(table) == {"up_proj": pytest.approx(float(np.median(ape)))}
    assert np.median(ape) != pytest.approx(np.mean(ape))


def test_rounded_keeps_six_significant_digits_everywhere():
    from simulator.calibrate import _rounded

    assert _rounded({"a": [1.23456789, {"b": 2.0000004}], "c": "x", "n": 3}) == {
        "a": [1.23457, {"b": 2.0}],
        "c": "x",
        "n": 3,
    }


def test_fit_steps_scores_rows_it_did_not_see_and_refits_on_all():
    """Even rows read no KV, odd rows do: the held-out fit cannot know the per-KV cost (its score
    is far off), the final fit on every row recovers it."""
    from simulator.calibrate import StepFit, fit_steps

    truth = StepFit(2e-3, 1e-4, 1e-7)
    q = np.arange(1, 41, dtype=float)
    kv = np.where(np.arange(40) % 2, 1e4 * q, 0.0)
    fit = fit_steps(np.stack([q, kv, truth.predict_s(q, kv)], axis=1))
    assert fit.per_kv_token_s == pytest.approx(1e-7, rel=1e-3) and fit.n_steps == 40
    assert fit.heldout_median_ape_percent > 50


@pytest.mark.parametrize(
    "rows,needle",
    [
        ([[1, 0, 0.1]] * 3, ">= 4 rows"),
        ([[1, 0, 0.1]] * 3 + [[0, 0, 0.1]], "query_tokens >= 1"),
    ],
)
def test_steps_that_cannot_be_fitted_are_refused(rows, needle):
    from simulator.calibrate import fit_steps

    with pytest.raises(ValueError, match=needle):
        fit_steps(rows)


def test_fit_to_steps_weighs_too_slow_and_too_fast_alike():
    """Each step timed twice, 5% slower and 5% faster than a cost model the fit can reach: the log
    residuals (relative error, symmetric) land on that model; plain relative residuals would come
    out 0.36% fast (5% over weighs more than 1/1.05 under)."""
    from simulator.calibrate import fit_cost_params_to_steps
    from simulator.hardware import get_hardware
    from simulator.models import get_model

    hardware, model = get_hardware("host-cpu"), get_model("qwen3-4b")
    base = CostModel(hardware, model).params
    truth = CostModel(hardware, model, dataclasses.replace(base.scaled(0.5, 0.7), step_overhead_s=3e-3))
    q = np.repeat([1.0, 1, 4, 16, 64, 256, 512], 2)
    kv, groups = q * 300, np.where(q <= 4, q, 1)
    exact = np.asarray(truth.step_time_s(q, kv, groups), float)
    steps = np.stack([q, kv, exact * np.tile([1.05, 1 / 1.05], 7), groups], axis=1)
    fitted = CostModel(hardware, model, fit_cost_params_to_steps(hardware, model, steps))
    ratio = np.asarray(fitted.step_time_s(q, kv, groups), float) / exact
    assert np.exp(np.mean(np.log(ratio))) == pytest.approx(1.0, abs=1e-3)


# ---- gemm_calibration ----------------------------------------------------------------------------
def test_a_calibration_a_rounding_hair_past_its_fit_bound_is_read(tmp_path):
    """A value past the box `solm calibrate` fits in by float rounding only (1e-12 relative) is
    still that tool's value; 1e-6 past it is not."""
    import json

    from simulator.gemm import GemmParams
    from simulator.gemm_calibration import read_calibration

    cal = tmp_path / "cal.json"
    for value, ok in ((20.0 * (1 + 1e-12), True), (20.0 * (1 + 1e-6), False)):
        params = {**GemmParams().to_json(), "fill_iters": value}
        cal.write_text(
            json.dumps({"format": "solm-gemm-calibration", "version": 1, "hardware": "h100-sxm", "params": params})
        )
        if ok:
            assert read_calibration(cal)[1].fill_iters == value
        else:
            with pytest.raises(UsageError, match="params.fill_iters is"):
                read_calibration(cal)
