"""`solm simulate | validate | sweep` as a user meets them: summary then one JSON line; one error line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from solm.cli import main
from tests.simulator.toy_traces import seq, write_toy_trace

METRICS = {
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "request_throughput",
    "output_throughput",
    "peak_kv_bytes",
}


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_simulate_summary_json_and_trace(small_trace, tmp_path, capsys):
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                str(small_trace),
                "--hardware",
                "h100-sxm",
                "--model",
                "llama-3-8b",
                "--rate",
                "5",
                "--num-requests",
                "20",
                "--max-seqs",
                "8",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "ttft ms" in text and "peak KV" in text
    f = last_json(text)
    assert METRICS <= set(f) and f["completed"] == 20 and f["hardware"] == "h100-sxm" and f["out"] == str(out)
    assert main(["inspect", str(out), "--validate", "--json"]) == 0
    assert last_json(capsys.readouterr().out)["kind"] == "simulated"
    assert main(["simulate", str(small_trace), "--hardware", "h100-sxm", "--out", str(out)]) == 2  # not empty
    assert "exists and is not empty" in capsys.readouterr().err


def test_simulate_json_only_hypothetical_part(small_trace, capsys):
    assert (
        main(
            [
                "simulate",
                str(small_trace),
                "--hardware",
                "h100-sxm",
                "--set",
                "hbm_bytes_per_s=6e12",
                "--concurrency",
                "2",
                "--json",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["hardware"] == "h100-sxm-custom"


def test_validate(small_trace, capsys):
    assert main(["validate", str(small_trace)]) == 0
    text = capsys.readouterr().out
    f = last_json(text)
    assert "request latency" in text and {"step_time_mape_percent", "request_latency_mape_percent"} <= set(f)
    assert main(["validate", str(small_trace), "--uncalibrated", "--hardware", "h200"]) == 0
    text = capsys.readouterr().out
    f = last_json(text)
    assert "uncalibrated" in text and f["hardware"] == "h200" and f["request_latency_mape_percent"] >= 0


def test_sweep(small_trace, tmp_path, capsys):
    out = tmp_path / "sw"
    assert (
        main(
            [
                "sweep",
                str(small_trace),
                "--hardware",
                "a100-80g,h100-sxm",
                "--model",
                "llama-3-8b,llama-2-70b",
                "--max-seqs",
                "1,8",
                "--rate",
                "2,inf",
                "--num-requests",
                "6",
                "--workers",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    f = last_json(capsys.readouterr().out)
    assert f["configs"] == 16 and f["errors"] == 8 and f["pareto"] >= 1
    table = pd.read_parquet(out / "sweep.parquet")
    assert len(table) == 16 and table["pareto"].sum() == f["pareto"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["simulate", "{t}", "--hardware", "a100-80g", "--rate", "-1"], "rate must be > 0"),
        (["simulate", "{t}", "--hardware", "tpu-v9"], "unknown hardware 'tpu-v9'"),
        (
            ["simulate", "{t}", "--hardware", "a100-80g", "--set", "hbm_capacity_bytes=0"],
            "hbm_capacity_bytes must be a number > 0",
        ),
        (["simulate", "{t}", "--hardware", "a100-80g", "--model", "llama-2-70b"], "leave no room for KV"),
        (["simulate", "{t}", "--hardware", "a100-80g", "--memory-utilization", "0"], "memory utilization"),
        (["sweep", "{t}", "--hardware", "a100-80g", "--max-seqs", "0"], "max-seqs must be a positive integer"),
        (["sweep", "{t}", "--hardware", "a100-80g", "--rate", "fast"], "--rate must be a comma-separated list"),
        (["validate", "{t}", "--hardware", "nope"], "unknown hardware"),
    ],
)
def test_bad_settings_one_line(args, needle, tmp_path, capsys):
    t = write_toy_trace(tmp_path / "t", [seq(4, 3)] * 2, [4, 4])
    assert main([a.format(t=t) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
