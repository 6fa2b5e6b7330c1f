"""Sweeps: the grid, Pareto marks, resuming after an interrupt, process pool vs Ray."""

from __future__ import annotations

import importlib.util
import json
import os

import pandas as pd
import pytest

from profiler.errors import UsageError
from simulator.sweep import RESULTS_JSONL, RESULTS_PARQUET, grid, pareto_mask, sweep
from tests.simulator.toy_traces import pasta, seq, write_toy_trace

GRID = dict(
    hardware=["a100-80g", "h100-sxm"],
    models=["", "llama-3-8b"],
    max_seqs=[1, 4],
    rates=[2.0, float("inf")],
    num_requests=12,
)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    a = write_toy_trace(d / "pasta", [pasta(8, 4, 10)] * 3, [8] * 3, quality=[0.5] * 3, system="pasta")
    b = write_toy_trace(d / "seq", [seq(8, 42)] * 3, [8] * 3, quality=[0.75] * 3, system="sequential")
    return [str(a), str(b)]


def test_grid_and_bad_names(traces):
    assert len(grid(traces, **{k: v for k, v in GRID.items() if k != "num_requests"})) == 2 * 2 * 2 * 2 * 2
    with pytest.raises(KeyError, match="unknown hardware 'z9'"):
        grid(traces, ["z9"])
    with pytest.raises(KeyError, match="unknown model"):
        grid(traces, ["a100-80g"], models=["gpt-9"])
    with pytest.raises(ValueError, match="rate must be > 0"):
        grid(traces, ["a100-80g"], rates=[-1.0])
    with pytest.raises(ValueError, match="backend"):
        sweep(traces, ["a100-80g"], backend="spark")


def test_pareto_mask():
    t = pd.DataFrame(
        {
            "status": ["ok", "ok", "ok", "error"],
            "quality_mean": [0.5, 0.5, 0.9, 1.0],
            "mean_e2el_ms": [10.0, 20.0, 30.0, 1.0],
            "output_throughput": [100.0, 100.0, 50.0, 1e9],
            "peak_kv_bytes": [1, 1, 1, 0],
        }
    )
    assert pareto_mask(t).tolist() == [True, False, True, False]


def test_local_pool_table(traces, tmp_path):
    table = sweep(traces, workers=2, out=tmp_path / "out", **GRID)
    assert len(table) == 32 and table["status"].eq("ok").all() and table["pareto"].any()
    assert set(table["quality_mean"]) == {0.5, 0.75}  # from the traces
    assert (tmp_path / "out" / RESULTS_PARQUET).exists()
    on_disk = pd.read_parquet(tmp_path / "out" / RESULTS_PARQUET)
    assert on_disk["pareto"].tolist() == table["pareto"].tolist()
    serial = sweep(traces, workers=1, **GRID)
    pd.testing.assert_frame_equal(table, serial)
    # the PASTA trace serves the same tokens in fewer passes: lower latency on the same settings
    one = table[
        (table["hardware"] == "h100-sxm")
        & (table["max_seqs"] == 1)
        & (table["rate"] == 2.0)
        & (table["model"] == "llama-3-8b")
    ].set_index("system")
    assert one.loc["pasta", "mean_e2el_ms"] < one.loc["sequential", "mean_e2el_ms"]


def test_model_too_large_is_an_error_row(traces):
    table = sweep(traces[:1], ["l4"], models=["llama-2-70b", "llama-3-8b"], workers=1)
    assert table["status"].tolist() == ["error", "ok"]
    assert "leave no room for KV" in table.loc[0, "error"] and not table.loc[0, "pareto"]


def test_interrupted_sweep_keeps_finished_and_resumes(traces, tmp_path):
    out = tmp_path / "out"
    calls = []

    def stop_after_first(done, total):
        calls.append(done)
        if len(calls) == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(traces, workers=1, out=out, progress=stop_after_first, **GRID)
    kept = [json.loads(line) for line in (out / RESULTS_JSONL).read_text().splitlines()]
    assert 0 < len(kept) < 32 and len(pd.read_parquet(out / RESULTS_PARQUET)) == len(kept)
    seen = []
    table = sweep(traces, workers=1, out=out, progress=lambda d, t: seen.append((d, t)), **GRID)
    assert len(table) == 32 and seen[0][0] > len(kept) - 1 and seen[-1] == (32, 32)
    assert len((out / RESULTS_JSONL).read_text().splitlines()) == 32  # nothing run twice


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install ray)")
def test_ray_backend_matches_process_pool(traces, monkeypatch):
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    small = dict(hardware=["a100-80g", "h100-sxm"], models=["llama-3-8b"], max_seqs=[1, 4], rates=[2.0], num_requests=6)
    local = sweep(traces, workers=2, **small)
    ray_table = sweep(traces, workers=2, backend="ray", **small)
    pd.testing.assert_frame_equal(local, ray_table)
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_deployment_objectives_follow_the_columns():
    """Cost, p99 TTFT and goodput for a sweep over GPU counts; GPUs and throughput where it has no
    price or SLO; the replay objectives when every row has the same GPU count."""
    from simulator.sweep import OBJECTIVES, objectives_for

    gpus = pd.DataFrame({"gpus": [4, 8]})
    assert objectives_for(gpus) == (("gpus", -1), ("p99_ttft_ms", -1), ("output_throughput", 1))
    full = gpus.assign(cost_per_million_output_tokens=[1.0, 2.0], request_goodput=[3.0, 4.0])
    assert objectives_for(full) == (
        ("cost_per_million_output_tokens", -1),
        ("p99_ttft_ms", -1),
        ("request_goodput", 1),
    )
    unpriced = gpus.assign(cost_per_million_output_tokens=[None, None], request_goodput=[None, None])
    assert objectives_for(unpriced) == objectives_for(gpus)
    assert objectives_for(pd.DataFrame({"gpus": [8, 8]})) == OBJECTIVES
    assert objectives_for(pd.DataFrame({"quality_mean": [0.5]})) == OBJECTIVES


def test_grid_closed_loop_and_options(traces):
    """Each client count is a closed-loop configuration after the open-loop rates; the options reach
    the replay settings and are checked before any work."""
    configs = grid(traces[:1], ["a100-80g"], rates=[2.0], concurrency=[1, 3])
    assert [(c["rate"], c["concurrency"]) for c in configs] == [(2.0, None), (None, 1), (None, 3)]
    assert [(c["rate"], c["concurrency"]) for c in grid(traces[:1], ["a100-80g"])] == [(None, None)]
    with pytest.raises(ValueError, match="reserve must be one of"):
        grid(traces[:1], ["a100-80g"], options={"reserve": "everything"})


def test_grid_size_limit_is_inclusive(traces, monkeypatch):
    """A grid of exactly MAX_CONFIGS configurations runs; one more is refused."""
    import simulator.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "MAX_CONFIGS", 4)
    assert len(grid(traces, ["a100-80g"], max_seqs=[1, 2])) == 4
    with pytest.raises(ValueError, match="the grid has 6 configurations"):
        grid(traces, ["a100-80g"], max_seqs=[1, 2, 3])


def test_local_workers_limit_is_inclusive(monkeypatch):
    """Up to LOCAL_WORKERS_PER_CORE local processes per core are accepted, one more is refused."""
    import simulator.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "usable_cores", lambda: 2)
    limit = sweep_module.LOCAL_WORKERS_PER_CORE * 2
    assert sweep_module._workers("local", limit) == limit
    assert sweep_module._workers("ray", limit + 1) == limit + 1
    with pytest.raises(ValueError, match="only thrashes"):
        sweep_module._workers("local", limit + 1)


def test_a_calibration_is_part_of_the_configuration_key(traces):
    """A calibrated configuration is not the uncalibrated one: a resume must not take one's rows for the other."""
    from simulator.gemm import GemmParams
    from simulator.sweep import config_key

    text = json.dumps(GemmParams(tensor_eff=0.7).to_json())
    plain = grid(traces[:1], ["a100-80g"])[0]
    calibrated = grid(traces[:1], ["a100-80g"], cluster={"gemm_calibrations": {"a100-80g": text}})[0]
    assert calibrated["gemm_calibration"] == text
    assert config_key(calibrated) != config_key(plain)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"x": 1}', "GemmParams needs exactly"),  # was a TypeError (an unexpected keyword) in every run
        ("[1, 2]", "got list"),
        ("{", "Expecting"),  # not JSON
        (b"{}", "GemmParams needs exactly"),
        (None, "JSON object must be str"),
    ],
)
def test_a_malformed_calibration_is_refused_before_any_work(traces, text, says):
    """The Python API takes calibrations as JSON text per part (the CLI writes them from files it
    has checked): one that is not GemmParams' fields is one UsageError naming the part, at grid time."""
    from simulator.gemm import GemmParams

    bad_value = json.dumps({**GemmParams().to_json(), "tensor_eff": 2.0})
    for calibration, message in ((text, says), (bad_value, "tensor_eff out of range")):
        with pytest.raises(UsageError, match=f"--gemm-calibration for a100-80g: .*{message}"):
            grid(traces[:1], ["a100-80g"], cluster={"gemm_calibrations": {"a100-80g": calibration}})


def test_table_in_grid_order_and_last_row_wins(traces, tmp_path):
    """Rows come back in grid order whatever order they finished in; a configuration written twice
    to results.jsonl reads as its later row."""
    from simulator.sweep import _table, config_key, read_results

    configs = grid(traces, ["h100-sxm", "a100-80g"], num_requests=2)
    table = sweep(traces, ["h100-sxm", "a100-80g"], num_requests=2, workers=1)
    keys = [config_key(c) for c in configs]
    assert table["key"].tolist() == keys
    order = {k: i for i, k in enumerate(keys)}
    shuffled = _table(table.drop(columns="pareto").to_dict("records")[::-1], order)
    assert shuffled["key"].tolist() == keys
    first = table.iloc[0].drop("pareto").to_dict()
    lines = [json.dumps({**first, "mean_e2el_ms": ms}) for ms in (1.0, 2.0)]
    (tmp_path / RESULTS_JSONL).write_text("\n".join(lines) + "\n")
    assert read_results(tmp_path)["mean_e2el_ms"].tolist() == [2.0]
