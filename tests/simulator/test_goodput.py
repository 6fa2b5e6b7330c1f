"""Goodput (requests/s meeting TTFT and TPOT objectives) in the replay, `solm simulate` and `solm sweep`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, replay
from simulator.slo import goodput
from simulator.workload import load_workload
from solm.cli import main
from tests.simulator.toy_traces import MODEL_META, one_second_cost, seq, toy_part, write_toy_trace


def test_goodput_counts_requests_meeting_every_objective():
    ttft, tpot = np.array([0.1, 0.3, 0.1, 0.1]), np.array([0.01, 0.01, 0.05, np.nan])  # the last: one token
    ok = np.array([True, True, True, True])
    g = goodput(ttft, tpot, ok, 2.0, slo_ttft_ms=200, slo_tpot_ms=20)
    assert g["request_goodput"] == 1.0 and g["slo_attained_percent"] == 50.0  # requests 0 and 3
    assert goodput(ttft, tpot, ok, 2.0, slo_ttft_ms=200)["request_goodput"] == 1.5
    assert goodput(ttft, tpot, ~ok, 2.0, slo_tpot_ms=100)["request_goodput"] == 0.0  # failed requests are never good
    assert goodput(ttft, tpot, ok, 2.0)["request_goodput"] is None  # no objective: not computed
    with pytest.raises(ValueError, match="slo-tpot-ms must be > 0"):
        goodput(ttft, tpot, ok, 2.0, slo_tpot_ms=0)


def test_replay_goodput_exact(tmp_path):
    # max-seqs 1, 1 s per pass: A ttft 1 s, e2e 3 s (tpot 1 s); B waits: ttft 3.5 s, e2e 5.5 s (tpot 1 s)
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3), seq(4, 3)], [4, 4], arrivals=[0.0, 0.5]))
    model, hw = ModelSpec.from_trace_meta(MODEL_META), toy_part()
    res = replay(
        w, hw, model, ReplayConfig(max_seqs=1, slo_ttft_ms=2000, slo_tpot_ms=1000), cost=one_second_cost(hw, model)
    )
    m = res.metrics
    assert m["duration_s"] == 6.0 and m["request_goodput"] == 1 / 6 and m["slo_attained_percent"] == 50.0


def test_simulate_and_sweep_print_goodput(tmp_path, capsys):
    trace = write_toy_trace(tmp_path / "t", [seq(4, 3)] * 4, [4] * 4)
    assert (
        main(
            [
                "simulate",
                str(trace),
                "--hardware",
                "h100-sxm",
                "--model",
                "llama-3-8b",
                "--rate",
                "2",
                "--slo-ttft-ms",
                "100",
                "--slo-tpot-ms",
                "50",
                "--no-chunked-prefill",
                "--reserve",
                "peak",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    figures = json.loads(out.strip().splitlines()[-1])
    assert "goodput" in out and figures["request_goodput"] == figures["request_throughput"]
    assert figures["chunked_prefill"] is False and figures["reserve"] == "peak"
    assert (
        main(
            [
                "sweep",
                str(trace),
                "--hardware",
                "h100-sxm",
                "--model",
                "llama-3-8b",
                "--rate",
                "1,2",
                "--slo-ttft-ms",
                "100",
                "--workers",
                "1",
                "--out",
                str(tmp_path / "sw"),
                "--json",
            ]
        )
        == 0
    )
    import pandas as pd

    table = pd.read_parquet(tmp_path / "sw" / "sweep.parquet")
    assert (table["request_goodput"] > 0).all() and (table["slo_ttft_ms"] == 100).all()


@pytest.mark.parametrize(
    "flags, needle", [(["--slo-ttft-ms", "-5"], "slo-ttft-ms must be > 0"), (["--scheduler", "lottery"], "fcfs, sjf")]
)
def test_bad_slo_or_scheduler_is_one_line_exit_2(tmp_path, capsys, flags, needle):
    trace = write_toy_trace(tmp_path / "t", [seq(4, 3)], [4])
    assert main(["simulate", str(trace), "--hardware", "h100-sxm", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("solm simulate: error:") and needle in err[0]


def test_goodput_boundaries_and_denominator():
    """An objective met exactly is met (vLLM's <=); the attained share counts failed requests too;
    an infinite objective is refused (it would read as an objective that was set)."""
    ttft, tpot = np.array([0.25, 0.25]), np.array([0.5, 0.5])
    assert goodput(ttft, tpot, [True, True], 1.0, slo_ttft_ms=250, slo_tpot_ms=500)["request_goodput"] == 2.0
    assert goodput(ttft, tpot, [True, False], 1.0, slo_ttft_ms=1000)["slo_attained_percent"] == 50.0
    with pytest.raises(ValueError, match="slo-ttft-ms must be > 0 ms and finite"):
        goodput(ttft, tpot, [True, True], 1.0, slo_ttft_ms=float("inf"))


def test_an_unknown_ttft_does_not_meet_a_ttft_objective_and_no_duration_has_no_goodput():
    """A request without a TTFT (not recorded) is not counted as meeting a TTFT objective; a run of
    no duration has no goodput (None), not a rate of 0."""
    g = goodput([np.nan, 0.05], [0.01, 0.01], [True, True], 2.0, slo_ttft_ms=100)
    assert g["request_goodput"] == 0.5 and g["slo_attained_percent"] == 50.0
    assert goodput([0.05], [0.01], [True], 0.0, slo_ttft_ms=100)["request_goodput"] is None
