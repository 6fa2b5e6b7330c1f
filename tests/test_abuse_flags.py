"""Flags that were accepted and had no effect: `solm simulate`, `sweep`, `validate`, `cost` and `capture` ran with exit 0
and the same figures as without the flag (a router for one replica, a seed with no random
arrivals, ...). Now one line `solm <command>: error: ...` naming the flag and what it needs, exit 2,
nothing written. Each case says what it did before."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from solm.cli import main
from tests.simulator.test_abuse_sim import HEADER, SHIPPED, refused


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """The user's folder, the working directory: a trace `t` and a workload `w.csv`."""
    shutil.copytree(SHIPPED, tmp_path / "t")
    (tmp_path / "w.csv").write_text(HEADER + "0,10,5\n0.5,12,6\n1.0,8,4\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


SIM = ["simulate", "t", "--hardware", "h100-sxm", "--num-requests", "4", "--out", "o"]
WORKLOAD = ["simulate", "--workload", "w.csv", "--structure-from", "t", "--hardware", "h100-sxm", "--out", "o"]
SWEEP = ["sweep", "t", "--hardware", "h100-sxm", "--num-requests", "4", "--workers", "1", "--out", "o"]
COST = ["cost", "--hardware", "h100-sxm"]
CAPTURE = ["capture", "--n", "2", "--out", "o"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        # each was: exit 0, the same figures as without the flag (the JSON line even said sjf_oracle true)
        ([*SIM, "--sjf-oracle"], "--sjf-oracle ranks SJF's queue: give --scheduler sjf (got fcfs)"),
        ([*SWEEP, "--sjf-oracle"], "--sjf-oracle ranks SJF's queue"),
        (["validate", "t", "--calibrate-from", "t", "--sjf-oracle"], "--sjf-oracle ranks SJF's queue"),  # fcfs trace
        ([*SIM, "--router", "kv_aware"], "--router picks among replicas: give --replicas 2 or more"),
        ([*SWEEP, "--router", "kv_aware", "--replicas", "1"], "--router picks among replicas"),
        ([*SIM, "--seed", "7"], "--seed draws the arrivals of --rate"),
        ([*SIM, "--concurrency", "2", "--seed", "7"], "--seed draws the arrivals of --rate"),
        ([*SWEEP, "--seed", "7"], "--seed draws the arrivals of --rate"),
        ([*SIM, "--topology", "pcie"], "--topology applies to links between GPUs"),
        ([*WORKLOAD, "--rate", "2", "--time-scale", "3"], "--time-scale paces --workload's own arrivals"),
        ([*WORKLOAD, "--concurrency", "2", "--time-scale", "3"], "--time-scale paces --workload's own arrivals"),
        ([*SWEEP, "--pp-schedule", "interleave"], "--micro-batches and --pp-schedule apply to a pipeline"),
        ([*SWEEP, "--time-scale", "3"], "--time-scale paces --workload's own arrivals: give --workload"),
        ([*COST, "--comm", "all_reduce", "--model", "llama-3-8b", "--tp", "4"], "--model, --tp: not with --comm"),
        ([*COST, "--comm", "all_reduce", "--explain"], "--explain: not with --comm"),
        ([*COST, "--model", "llama-3-8b", "--workers", "4"], "--workers and --bytes size the collectives of --comm"),
        ([*COST, "--model", "llama-3-8b", "--topology", "pcie"], "--topology applies to collectives: give --tp 2"),
        # an empty value stays an error now that the defaults are filled in after the mode's checks
        ([*COST, "--model", "llama-3-8b", "--tokens="], "--tokens is empty; give a value, or leave the flag out"),
        ([*COST, "--model", "llama-3-8b", "--tp="], "--tp is empty"),
        ([*COST, "--comm", "all_reduce", "--bytes="], "--bytes is empty"),
        # each was: exit 0 as if the flag were not given (the trace's own model; no GEMM calibration)
        ([*SIM, "--model", ""], "--model is empty; give a value, or leave the flag out"),
        ([*SWEEP, "--model", " "], "--model is empty"),
        ([*COST, "--model", "llama-3-8b", "--gemm-calibration", ""], "--gemm-calibration is empty"),
        ([*SIM, "--gemm-calibration", ""], "--gemm-calibration is empty"),
        # was: "workload file .: not a regular file" (an empty path read as the working directory)
        ([*WORKLOAD[:1], "--workload", "", *WORKLOAD[3:]], "--workload is empty"),
        (["simulate", "", "--hardware", "h100-sxm"], "trace is empty; give a value"),
        # each was: exit 0, a request-by-request capture with the same tokens, the setting recorded nowhere
        ([*CAPTURE, "--max-seqs", "2", "--attention", "gather"], "--max-seqs, --attention: serving settings apply"),
        ([*CAPTURE, "--kv-budget-mib", "1"], "--kv-budget-mib: serving settings apply under load: give --rate"),
        ([*CAPTURE, "--keep", "median"], "--keep picks one of the runs of --repeats: give --repeats 2 or more"),
        (
            [*CAPTURE, "--top-p", "0.5"],
            "--top-p applies to sampling: give --temperature > 0",
        ),  # greedy; top_p 0.5 in meta
    ],
)
def test_a_flag_that_would_be_ignored_is_refused(argv, needle, home, capsys):
    refused(argv, home, capsys, needle)
    assert not (home / "o").exists()


@pytest.mark.parametrize(
    "argv",
    [
        [*SIM, "--scheduler", "sjf", "--sjf-oracle"],
        [*SIM, "--rate", "4", "--seed", "7"],
        [*WORKLOAD, "--seed", "7"],  # the seed samples the structures
        [*WORKLOAD, "--time-scale", "3"],
        [*SIM, "--replicas", "2", "--router", "kv_aware"],
        [*SIM, "--disaggregate", "1:1", "--router", "kv_aware", "--topology", "pcie"],
        [*SIM, "--model", "llama-3-8b", "--tp", "2", "--topology", "pcie"],
        [*SWEEP, "--replicas", "1,2", "--router", "least_outstanding", "--rate", "inf,4", "--seed", "1"],
        [*COST, "--model", "llama-3-8b", "--tp", "2", "--topology", "pcie", "--tokens", "8"],
        [*COST, "--comm", "send_recv", "--topology", "pcie", "--workers", "2", "--bytes", "64"],
        ["capture", "--n", "1", "--temperature", "0.8", "--top-p", "0.5", "--out", "o"],
    ],
)
def test_the_same_flags_where_they_apply_still_run(argv, home, capsys):
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "flags,needle",
    [
        (
            ["--system", "pasta", "--stage", "sft"],
            "--lambda weighs the preference stage's reward: not with --stage sft",
        ),
        (["--system", "planned_diffusion", "--stage", "ar"], "planned_diffusion has none"),
    ],
)
def test_train_lambda_where_no_reward_reads_it(flags, needle, home, capsys, monkeypatch):
    """Was: accepted, and the stage trained as without it (only pasta's preference reward reads lambda)."""
    import runtime.train.sft

    monkeypatch.setattr(runtime.train.sft, "train", lambda *a, **kw: pytest.fail("trained before refusing"))
    refused(["train", *flags, "--lambda", "5", "--out", "o"], home, capsys, needle)
    assert not (home / "o").exists()


@pytest.mark.parametrize(
    "argv,needle",
    [
        # was: the whole value echoed, an error line of 5,000 characters
        (["simulate", "t", "--hardware", "a100-80g", "--max-seqs", "9" * 5000], "... (5042 characters) (see solm"),
        (["cost", "--model", "llama-3-8b", "--hardware", "a100-80g", "--tokens", "9" * 5000], "... (5002 characters)"),
    ],
)
def test_a_value_of_thousands_of_digits_is_not_echoed_whole(argv, needle, home, capsys):
    assert len(refused(argv, home, capsys, needle)) < 400
