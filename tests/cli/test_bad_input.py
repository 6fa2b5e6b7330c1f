"""Bad input that used to end in a traceback, a hang or a silently wrong figure: now one line
`solm <command>: error: ...` and exit 2, checked before any work (each case names what it did)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest

from profiler.validate import validate
from solm.cli import main

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "traces" / "sequential-reverse_words"
PD = REPO / "traces" / "planned_diffusion-word_facts"


@pytest.fixture
def t(tmp_path) -> Path:
    return Path(shutil.copytree(SHIPPED, tmp_path / "t"))


def one_line_error(argv: list[str], capsys, needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"solm {argv[0]}: error: ") and needle in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--device", "bogus"], "--device must be cpu or cuda"),  # was RuntimeError from torch
        (["--n", "1000000000"], "--n must be in 1..100000"),  # was: built the example list for ever
        (["--temperature", "nan"], "--temperature must be a finite"),  # was: a traceback mid-run
        (["--temperature", "inf"], "--temperature must be a finite"),
        (["--threads", "-1"], "--threads must be in"),
        (["--counters-hz", "nan"], "--counters-hz"),  # was: the sampler spun
        (["--counters-hz", "1e9"], "--counters-hz"),
        (["--top-p", "nan"], "--top-p"),
        (["--seed", "-5"], "--seed"),
        (["--system", "pasta", "--knob", "max_threads=NaN"], "finite"),
    ],
)
def test_capture_flags_checked_up_front(flags, needle, tmp_path, capsys):
    one_line_error(["capture", *flags, "--out", str(tmp_path / "c")], capsys, needle)
    assert not (tmp_path / "c").exists()


def test_a_task_that_cannot_draw_n_prompts_says_so():
    from profiler.errors import UsageError
    from runtime.tasks import get_task

    with pytest.raises(UsageError, match="could draw only"):  # was: RuntimeError after 200 x n draws
        get_task("var_tracking").examples("test", 5000)


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--set", "hbm_capacity_bytes=1e400"], "finite number"),  # was OverflowError
        (["--set", "launch_overhead_s=inf"], "finite number"),  # was: throughput 0 reported as success
        (["--set", "peak_flops_per_s=nan"], "finite number"),
        (["--set", "hbm_capacity_bytes=0"], "must be a number > 0"),
        (["--rate", "1e-300"], "at least 1e-05"),  # was: every latency 0.0 ms
        (["--rate", "nan"], "rate must be"),
        (["--num-requests", "1000000000"], "num-requests must be in"),
        (["--memory-utilization", "nan"], "memory utilization"),
        (["--max-batch-tokens", "2"], "exceeds max-batch-tokens 2"),  # was RuntimeError: No scheduled events left
    ],
)
def test_simulate_settings_checked(flags, needle, capsys):
    one_line_error(["simulate", str(PD), "--hardware", "h100-sxm", *flags], capsys, needle)


def test_sweep_keeps_going_with_an_error_row(t, capsys):
    """Was: one configuration whose passes exceed --max-batch-tokens crashed the whole sweep."""
    assert (
        main(
            [
                "sweep",
                str(t),
                str(PD),
                "--hardware",
                "h100-sxm",
                "--max-batch-tokens",
                "40",
                "--workers",
                "1",
                "--num-requests",
                "4",
                "--json",
            ]
        )
        == 0
    )
    f = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert f["configs"] == 2 and f["ok"] == 1 and f["errors"] == 1


def test_a_trailing_request_that_cannot_run_does_not_stall_the_replay(t):
    """Was: when the last request to arrive could not run (and nothing else was running) the engine
    waited for ever and SimPy raised 'No scheduled events left'."""
    from simulator.hardware import get_hardware
    from simulator.models import ModelSpec
    from simulator.replay import ReplayConfig, replay
    from simulator.workload import load_workload

    w = load_workload(t)
    widest = w.query_tokens[w.offsets[:-1]]  # each request's prefill
    last = int(widest.argmax())
    cap = int(sorted(widest)[-2]) if sorted(widest)[-2] < widest[last] else None
    if cap is None:
        pytest.skip("the shipped trace's prompts all have the same length")
    pos = [i for i in range(w.n_requests) if i != last] + [last]  # the too-wide one arrives last
    res = replay(
        w.take(pos),
        get_hardware("h100-sxm"),
        ModelSpec.from_trace_meta(w.source["model"]),
        ReplayConfig(max_batch_tokens=cap, chunked_prefill=False),
    )
    assert res.metrics["failed"] >= 1 and res.metrics["completed"] == w.n_requests - res.metrics["failed"]


def _edit_meta(t: Path, **fields) -> None:
    meta = json.loads((t / "meta.json").read_text())
    (t / "meta.json").write_text(json.dumps({**meta, **fields}))


def test_model_meta_of_the_wrong_shape_is_a_trace_error(t, capsys):
    _edit_meta(t, model={"name": "x", "n_layers": "two"})  # was TypeError / ValueError: a traceback
    for argv in (["simulate", str(t), "--hardware", "h100-sxm"], ["validate", str(t)]):
        one_line_error(argv, capsys, "trace meta 'model'")


@pytest.mark.parametrize("threads", ["two", 1.5, float("inf"), -2])
def test_a_cpu_trace_of_no_whole_core_count_is_a_trace_error(threads, t, capsys):
    """Was: validate's int('two') on the recorded device.threads, an internal error (exit 1)."""
    meta = json.loads((t / "meta.json").read_text())
    _edit_meta(t, device={**meta["device"], "threads": threads})
    for argv in (["validate", str(t)], ["validate", str(t), "--uncalibrated"]):
        one_line_error(argv, capsys, "device.threads (or host.cores) must be a whole number of cores")


@pytest.mark.parametrize(
    "damage,needle",
    [
        (lambda t: _edit_meta(t, model="llama"), "field 'model' must be a JSON object"),  # was TypeError
        (lambda t: _edit_meta(t, device=[1]), "field 'device' must be a JSON object"),
        (lambda t: _edit_meta(t, kind=7), "field 'kind' must be a JSON string"),
        (lambda t: (t / "meta.json").write_text("[" * 100000 + "]" * 100000), "nested"),  # was RecursionError
        (lambda t: (t / "meta.json").write_text('{"a":' * 100 + "1" + "}" * 100), "nested"),
        (lambda t: ((t / "meta.json").unlink(), os.mkfifo(t / "meta.json")), "not a regular file"),  # was: diff hung
        (lambda t: ((t / "meta.json").unlink(), (t / "meta.json").symlink_to("/dev/zero")), "not a regular file"),
    ],
)
def test_broken_meta_is_one_trace_error_in_every_command(damage, needle, t, tmp_path, capsys):
    damage(t)
    for argv in (
        ["inspect", str(t)],
        ["diff", str(SHIPPED), str(t)],
        ["diff", str(t), str(SHIPPED)],
        ["export", str(t), "--perfetto", str(tmp_path / "x.json")],
        ["simulate", str(t), "--hardware", "h100-sxm"],
        ["validate", str(t)],
    ):
        one_line_error(argv, capsys, needle if argv[0] in ("inspect", "export", "simulate") else "")


def _edit_graph(t: Path, edit) -> None:
    graphs = json.loads((t / "graph.json").read_text())
    edit(graphs[next(iter(graphs))])
    (t / "graph.json").write_text(json.dumps(graphs))


def _edit_requests(t: Path, col: str, value) -> None:
    import pandas as pd

    df = pd.read_parquet(t / "requests.parquet")
    df.loc[0, col] = value
    df.to_parquet(t / "requests.parquet", index=False)


def _edit_table(t: Path, name: str, edit) -> None:
    import pandas as pd

    edit(pd.read_parquet(t / f"{name}.parquet")).to_parquet(t / f"{name}.parquet", index=False)


@pytest.mark.parametrize(
    "damage,needle",
    [
        (
            lambda t: _edit_graph(
                t, lambda g: g["links"].append({"source": g["nodes"][-1]["id"], "target": g["nodes"][0]["id"]})
            ),
            "cycle",
        ),
        (
            lambda t: _edit_graph(t, lambda g: g["links"].append({"source": "ghost", "target": g["nodes"][0]["id"]})),
            "missing node",
        ),
        (lambda t: _edit_requests(t, "e2e_s", float("inf")), "e2e_s infinite"),
        (lambda t: _edit_requests(t, "ttft_s", -1.0), "ttft_s infinite, negative"),
        (lambda t: _edit_requests(t, "arrival_s", -3.0), "arrival_s"),
        (lambda t: _edit_requests(t, "quality_score", 1.5), "outside 0..1"),
        (lambda t: _edit_requests(t, "quality_score", float("inf")), "outside 0..1"),
        # each was valid: exit 0 with a status read as finished, an infinite e2e mean (16 x 1e308),
        # passes that ran backwards, and diff's counter mean given as the string "inf"
        (lambda t: _edit_requests(t, "status", "bogus"), "unknown statuses ['bogus']"),
        (lambda t: _edit_requests(t, "e2e_s", 1e308), "e2e_s infinite, negative or missing (or over 1e+15 s)"),
        (lambda t: _edit_table(t, "steps", lambda s: s.assign(start_s=s["start_s"].to_numpy()[::-1])), "back in time"),
        (lambda t: _edit_table(t, "counters", lambda c: c.assign(cpu_percent=float("inf"))), "infinite values in"),
        # found by fuzzing traces: export's int() of the streams text and diff --html's topological
        # sort of a graph networkx read undirected were exit 1; a negative count was exit 0 with it
        (lambda t: _edit_table(t, "steps", lambda s: s.assign(streams="0\nx")), "streams must be comma-separated"),
        (lambda t: _edit_graph(t, lambda g: g.pop("directed")), "not a directed graph"),
        (lambda t: _edit_requests(t, "peak_kv_bytes", -5), "negative peak_kv_bytes"),
    ],
)
def test_validate_rejects_what_it_used_to_pass(damage, needle, t, tmp_path, capsys):
    assert validate(t) == []
    damage(t)
    assert any(needle in p for p in validate(t)), validate(t)
    # was: plain inspect printed figures of the broken trace (an infinite e2e mean, numpy's
    # RuntimeWarning lines on stderr) and exited 0; --validate --json exited 2 without a word
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one_line_error(["inspect", str(t)], capsys, "--validate summarises it anyway")
        one_line_error(["inspect", str(t), "--validate", "--json"], capsys, "not a valid trace")
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["inspect", str(t), "--validate", "--json"]) == 2
    line = json.loads(capsys.readouterr().out)
    assert line["valid"] is False and any(needle in p for p in line["problems"])
    one_line_error(["export", str(t), "--perfetto", str(tmp_path / "x.json")], capsys, "not a valid trace")
    one_line_error(["diff", str(SHIPPED), str(t)], capsys, "not a valid trace")
    one_line_error(["diff", str(SHIPPED), str(t), "--html", str(tmp_path / "d.html")], capsys, "not a valid trace")
    # was: simulate and validate replayed it, validate comparing against the broken figures
    one_line_error(["simulate", str(t), "--hardware", "h100-sxm"], capsys, "not a valid trace")
    one_line_error(["validate", str(t)], capsys, "not a valid trace")
    one_line_error(["sweep", str(t), "--hardware", "h100-sxm", "--out", str(tmp_path / "sw")], capsys, "not a valid")
    assert not (tmp_path / "sw").exists()


def test_unwritable_out_is_a_usage_error(t, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        one_line_error(["simulate", str(t), "--hardware", "h100-sxm", "--out", str(ro / "sim")], capsys, "not writable")
        one_line_error(["export", str(t), "--perfetto", str(ro / "x.json")], capsys, "not writable")
    finally:
        ro.chmod(0o700)


def test_forward_fit_without_a_calibration_trace_is_refused(t, capsys):
    one_line_error(
        ["validate", str(t), "--forward-fit", "line"], capsys, "--forward-fit applies to validation under load"
    )
    with pytest.raises(SystemExit) as e:  # argparse's choices
        main(["validate", str(t), "--calibrate-from", str(t), "--forward-fit", "guess"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_a_trace_stopped_before_its_first_request_is_refused(t, tmp_path, capsys):
    """Was: exit 0 from inspect, export and simulate over a capture stopped before its first
    request finished (meta.json complete false, parts/ empty: what a serving capture's Ctrl-C or a
    failed first request leaves): "0 requests", every figure n/a, an empty Perfetto file."""
    for name in ("requests", "steps", "tokens"):
        (t / f"{name}.parquet").unlink()
    (t / "graph.json").unlink()
    (t / "parts").mkdir()
    _edit_meta(t, complete=False)
    needle = "no requests (a run stopped before its first request finished)"
    for argv in (
        ["inspect", str(t)],
        ["diff", str(SHIPPED), str(t)],
        ["export", str(t), "--perfetto", str(tmp_path / "x.json")],
        ["simulate", str(t), "--hardware", "h100-sxm"],
    ):
        one_line_error(argv, capsys, needle)
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["capture", "--n=--"], "argument --n: invalid int value: '--'"),  # was: exit 1, TypeError int <= list
        (["capture", "--split=--"], "argument --split: invalid choice: '--'"),
        (["train", "--lr=--"], "argument --lr: invalid float value: '--'"),
    ],
)
def test_a_double_dash_attached_to_a_flag_is_its_value(argv, needle, tmp_path, capsys):
    """Python 3.11's argparse dropped a '--' given as `--flag=--` and handed the command [] for it."""
    with pytest.raises(SystemExit) as e:  # argparse's own error: one line, exit 2
        main([*argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"solm {argv[0]}: error: ") and err.count("\n") == 1, err
    assert needle in err
    assert not (tmp_path / "o").exists()


def test_a_counters_rate_whose_interval_overflows_is_refused(tmp_path, capsys):
    """--counters-hz 1e-320 is in (0, 1000] but 1 / 1e-320 is inf: was a sampler thread traceback,
    exit 0 and counters_interval_s inf in meta.json."""
    one_line_error(["capture", "--counters-hz", "1e-320", "--out", str(tmp_path / "c")], capsys, "too small")
    assert not (tmp_path / "c").exists()
