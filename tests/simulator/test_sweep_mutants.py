"""simulator/sweep.py: a second hand mutation round. Each test fails on a mutant every sweep test
before it let through (named in its docstring); grids and workloads are built, not run, except
where a row is the point, so the file takes a few seconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simulator.sweep as sweep_module
from profiler.errors import UsageError
from simulator.sweep import grid, load_workloads, workload_key

TRACE = str(
    Path(__file__).resolve().parents[2] / "traces" / "pasta-word_facts"
)  # 16 requests of several structures: a workload's seed picks among them


def test_the_64_bit_limit_is_exclusive_at_2_to_the_63():
    """2**63 - 1 is the largest integer a table column holds: a grid of it is built, one of 2**63
    refused before any work (was tested at 2**64 only). Kills `v < 2**63` -> `v <= 2**63`, which let
    2**63 run the grid and fail on writing the table."""
    assert grid([TRACE], ["a100-80g"], seed=2**63 - 1)[0]["seed"] == 2**63 - 1
    with pytest.raises(UsageError, match=r"--seed 9223372036854775808: beyond the 64-bit integers"):
        grid([TRACE], ["a100-80g"], seed=2**63)


def test_a_workload_file_is_stretched_with_the_sweep_s_seed(tmp_path):
    """`--workload FILE --seed N`: each logged request's source structure is sampled with the
    sweep's seed, as `solm simulate` does, not with seed 0. Kills `stretch(..., seed=0)`."""
    from simulator.cluster.workload_file import read_workload_file, stretch
    from simulator.workload import load_workload

    csv = tmp_path / "log.csv"
    csv.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n"
        + "".join(f"{i / 10},{20 + 5 * i},{6 + i}\n" for i in range(6))
    )
    (cfg,) = grid([TRACE], ["a100-80g"], seed=3, cluster={"workload": str(csv)})
    got = load_workloads([cfg])[workload_key(cfg)]
    log = read_workload_file(csv)
    want, seed0 = (stretch(load_workload(TRACE), log, seed=s) for s in (3, 0))
    assert np.array_equal(got.query_tokens, want.query_tokens) and np.array_equal(got.offsets, want.offsets)
    assert not np.array_equal(seed0.query_tokens, want.query_tokens)  # the seed matters for this trace


def test_a_client_count_of_zero_is_refused_not_dropped():
    """`concurrency=[0]` is a bad setting, refused before any work; only None means "no closed
    loop". Kills the filter `if c is not None` -> `if c`, which dropped the 0 and ran the trace's
    own arrivals instead."""
    with pytest.raises(UsageError, match="concurrency must be a positive integer, got 0"):
        grid([TRACE], ["a100-80g"], concurrency=[0])


def test_objectives_price_and_slo_when_any_row_has_them():
    """A deployment sweep whose failed rows have no cost or goodput (NaN) still trades cost and
    goodput, as long as one row has them. Kills `.notna().any()` -> `.all()` for the price."""
    from simulator.sweep import objectives_for

    t = pd.DataFrame(
        {
            "gpus": [4, 8, 8],
            "cost_per_million_output_tokens": [1.0, 2.0, np.nan],
            "request_goodput": [3.0, np.nan, np.nan],
        }
    )
    assert objectives_for(t) == (
        ("cost_per_million_output_tokens", -1),
        ("p99_ttft_ms", -1),
        ("request_goodput", 1),
    )


def test_the_local_pool_has_no_more_processes_than_chunks(monkeypatch):
    """Two chunks on eight workers start a pool of two processes, not eight idle ones. Kills the
    pool sized by --workers alone."""
    seen = []
    monkeypatch.setattr(sweep_module, "_run_pool", lambda chunks, workloads, workers, done: seen.append(workers))
    sweep_module._dispatch([[{}], [{}]], {}, "local", None, 8, lambda rows: None)
    sweep_module._dispatch([[{}]] * 12, {}, "local", None, 8, lambda rows: None)
    assert seen == [2, 8]


def test_a_dangling_link_as_the_table_without_rows_is_refused(tmp_path):
    """--out holding a sweep.parquet that is a link to nothing, and no results.jsonl: whose table
    it was is unknown, so the sweep is refused as for a real file (the link would have been replaced).
    Kills the check by `exists()` alone, which a dangling link fails."""
    (tmp_path / "sweep.parquet").symlink_to(tmp_path / "nowhere.parquet")
    with pytest.raises(UsageError, match="holds a sweep.parquet but no results.jsonl"):
        sweep_module._resume(tmp_path, [], {})


def test_results_read_back_are_marked_by_the_deployment_objectives(tmp_path):
    """`read_results` marks a deployment sweep's rows (GPU counts differ) by its own objectives,
    as the finished table does: fewer GPUs or a lower p99 TTFT each make a row optimal, whatever
    the mean latency. Kills read_results marking by the replay OBJECTIVES, which took the 2-GPU
    row for dominated (a higher mean E2E latency, the rest equal)."""
    from simulator.sweep import RESULTS_JSONL, read_results

    same = {"status": "ok", "quality_mean": 0.5, "output_throughput": 100.0, "peak_kv_bytes": 1}
    rows = [
        {"key": "one", "gpus": 1, "p99_ttft_ms": 10.0, "mean_e2el_ms": 5.0, **same},
        {"key": "two", "gpus": 2, "p99_ttft_ms": 5.0, "mean_e2el_ms": 10.0, **same},
    ]
    (tmp_path / RESULTS_JSONL).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_results(tmp_path)["pareto"].tolist() == [True, True]
