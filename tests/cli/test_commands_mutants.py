"""The command-line layer (solm/cli.py, solm/jsonline.py, solm/commands/*.py): what a mutation
round found unpinned. Each test names the behaviour a surviving mutant broke.

The round: 106 mutants (argument checks, exit codes, output-path safety, flag plumbing, defaults,
the JSON line) run against tests/cli/*, tests/test_abuse_*.py and each command's own tests; 56
killed there, 47 of the 50 survivors killed here. Left: an equivalent one (diff's second --html
check taking force=True: the same check with the user's --force refused an existing file before
the work, so only a file created during the diff would tell), and cost's `--calibrate-from needs
>= 4 passes` moved to 3 (it needs a measured trace of exactly three passes). simulate
--gemm-calibration being ignored is killed by tests/simulator/test_gemm_calibration.py."""

from __future__ import annotations

import argparse
import errno
import json
import shutil
from pathlib import Path

import pytest

from solm.cli import is_user_path_error, main

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "traces" / "sequential-reverse_words"


def refused(argv: list[str], capsys, needle: str) -> None:
    """`solm ARGV` is one line `solm <command>: error: ...` naming `needle`, exit 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"solm {argv[0]}: error: ") and needle in err and err.count("\n") == 1, err


@pytest.fixture
def t(tmp_path) -> Path:
    """A copy of a shipped trace (an input the commands must leave as it is)."""
    return Path(shutil.copytree(SHIPPED, tmp_path / "t"))


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


# --- solm/cli.py ---------------------------------------------------------------------------------


def test_an_unknown_flag_is_named_by_the_command_it_was_given_to(capsys):
    """`solm inspect T --bogus`: the line is the command's (`solm inspect: error: ...`, its own
    --help), not the top-level parser's."""
    with pytest.raises(SystemExit) as e:
        main(["inspect", str(SHIPPED), "--bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("solm inspect: error: unrecognized arguments: --bogus"), err
    assert "(see solm inspect --help)" in err


def test_no_command_prints_the_help_and_exits_2(capsys):
    """`solm` alone is bad input (nothing to do): the usage on stdout, exit 2, not 0."""
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys):
    import solm.commands.inspect as inspect_command

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_command, "run", interrupted)
    assert main(["inspect", str(SHIPPED)]) == 130
    assert capsys.readouterr().err == "solm inspect: interrupted\n"


def test_a_reader_that_left_is_no_error(monkeypatch, tmp_path, capsys):
    """`solm ... | head`: a BrokenPipeError is the reader leaving, exit 0 and nothing on stderr
    (stdout is pointed at a null device so the interpreter's last flush raises nothing)."""
    import solm.commands.inspect as inspect_command

    def pipe_closed(args):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(inspect_command, "run", pipe_closed)
    with open(tmp_path / "stdout", "w") as stdout:
        monkeypatch.setattr("sys.stdout", stdout)
        assert main(["inspect", str(SHIPPED)]) == 0
    assert capsys.readouterr().err == ""


def test_a_path_error_on_an_existing_folder_above_a_given_path_is_a_bug(tmp_path):
    """Only a *missing* folder above a path the user gave is theirs (creating --out's parents);
    a permission error on one that exists (solm writing where it should not) is a bug, exit 1."""
    args = argparse.Namespace(out=str(tmp_path / "a" / "b"))
    assert not is_user_path_error(PermissionError(errno.EACCES, "denied", str(tmp_path)), args)
    assert is_user_path_error(FileNotFoundError(errno.ENOENT, "missing", str(tmp_path / "a")), args)


def test_a_path_error_on_any_of_a_list_of_given_paths_is_the_users(tmp_path):
    """`solm export A B ...`: a path in a list argument (nargs='+') is the user's as much as a
    single one: its missing file is bad input (exit 2), not a bug."""
    missing = tmp_path / "gone"
    args = argparse.Namespace(traces=[str(tmp_path), str(missing)], perfetto="out.json")
    assert is_user_path_error(FileNotFoundError(errno.ENOENT, "missing", str(missing)), args)
    assert is_user_path_error(FileNotFoundError(errno.ENOENT, "missing", str(missing / "meta.json")), args)


def test_a_bug_is_one_line_even_when_its_message_has_several(monkeypatch, capsys):
    """A bug: exit 1, one line naming the exception's first line and SOLM_DEBUG, no traceback
    unless SOLM_DEBUG=1."""
    import solm.commands.inspect as inspect_command

    def broken(args):
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(inspect_command, "run", broken)
    monkeypatch.delenv("SOLM_DEBUG", raising=False)
    assert main(["inspect", str(SHIPPED)]) == 1
    err = capsys.readouterr().err
    assert err == (
        "solm inspect: internal error (a bug): RuntimeError: first line; rerun with SOLM_DEBUG=1 for the traceback\n"
    ), err


def test_integer_limits_are_inclusive_at_both_ends():
    """check_limits: lowest and highest are allowed values (`--n must be in 1..100000`)."""
    from profiler.errors import UsageError
    from solm.commands import check_limits

    limits = {"--n": ("n", 1, 5)}
    for ok in (1, 5, None):
        check_limits(argparse.Namespace(n=ok), limits)
    for bad in (0, 6):
        with pytest.raises(UsageError, match=f"--n must be in 1..5, got {bad}"):
            check_limits(argparse.Namespace(n=bad), limits)


def test_a_value_listed_twice_is_refused_wherever_it_stands(t, capsys):
    """The first value repeated later counts as much as any other (sweep --hardware a,b,a)."""
    refused(["sweep", str(t), "--hardware", "h100-sxm,a100-80g,h100-sxm"], capsys, "--hardware names h100-sxm twice")


@pytest.mark.parametrize("text", [",", " , ,"])
def test_sweep_list_of_nothing_is_refused(t, capsys, text):
    """`--hardware ,` (a list of no parts; no empty string, which solm.cli refuses earlier)."""
    refused(["sweep", str(t), "--hardware", text], capsys, "--hardware needs a comma-separated list")


def test_sweep_out_inside_its_trace_is_refused(t, capsys):
    """The sweep's tables would be written into the input trace's folder."""
    before = sorted(p.name for p in t.iterdir())
    refused(["sweep", str(t), "--hardware", "h100-sxm", "--out", str(t / "sweep")], capsys, "input")
    assert sorted(p.name for p in t.iterdir()) == before


def test_sweep_time_scale_with_concurrency_is_refused(t, capsys):
    """--concurrency replaces the workload's arrivals, so --time-scale would pace nothing."""
    workload = REPO / "simulator" / "data" / "workloads" / "splitwise_code.csv"
    argv = ["sweep", str(t), "--hardware", "h100-sxm", "--workload", str(workload), "--time-scale", "2"]
    refused([*argv, "--concurrency", "4"], capsys, "--time-scale paces --workload's own arrivals")


def test_validate_two_traces_without_calibrate_from_is_refused(t, capsys):
    """Without --calibrate-from one trace is validated: a second would be silently ignored."""
    refused(["validate", str(t), str(SHIPPED)], capsys, "several traces need --calibrate-from")


def test_validate_uncalibrated_with_run_is_refused(t, capsys):
    """--run picks a run for the calibrated validation; --uncalibrated would ignore it."""
    refused(["validate", str(t), "--uncalibrated", "--run", "0"], capsys, "--run applies to the calibrated")


def test_validate_run_is_named_in_the_json_line(capsys):
    """`--run K` validates run K alone (the shipped trace has 3 in runs.parquet); the line says which."""
    assert main(["validate", str(SHIPPED), "--run", "1", "--json"]) == 0
    assert last_json(capsys.readouterr().out)["run"] == 1


# --- solm cost -----------------------------------------------------------------------------------


def test_cost_context_limit_is_inclusive(capsys):
    """--kv-tokens up to a 1M-token context (simulator.workload.MAX_CONTEXT_TOKENS) is accepted;
    one more is refused."""
    from simulator.workload import MAX_CONTEXT_TOKENS

    base = ["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--tokens", "1", "--json"]
    assert main([*base, "--kv-tokens", str(MAX_CONTEXT_TOKENS)]) == 0
    assert last_json(capsys.readouterr().out)["steps"][0]["kv_tokens_read"] == MAX_CONTEXT_TOKENS
    assert main([*base, "--kv-tokens", str(MAX_CONTEXT_TOKENS + 1)]) == 2
    assert f"--kv-tokens must be at most {MAX_CONTEXT_TOKENS}" in capsys.readouterr().err


def test_cost_token_count_listed_twice_is_refused(capsys):
    assert main(["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--tokens", "1,512,1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("solm cost: error: --tokens names 1 twice") and err.count("\n") == 1, err


def test_cost_tensor_parallel_that_does_not_divide_the_heads_is_refused(capsys):
    """llama-3-8b has 32 heads: --tp 3 cannot shard them (was accepted by the cost model)."""
    refused(["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--tp", "3"], capsys, "does not divide")


def test_cost_bytes_without_comm_is_refused(capsys):
    """--bytes sizes --comm's collectives: alone it would be accepted and ignored."""
    refused(["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--bytes", "4096"], capsys, "give --comm too")


def test_cost_workers_up_to_the_parts_gpus_per_node(capsys):
    """h100-sxm has 8 GPUs per node: --workers 8 is timed, 9 is refused."""
    base = ["cost", "--hardware", "h100-sxm", "--comm", "all_reduce", "--bytes", "4096", "--json"]
    assert main([*base, "--workers", "8"]) == 0
    assert [row["workers"] for row in last_json(capsys.readouterr().out)["comm"]] == [8]
    refused([*base, "--workers", "9"], capsys, "--workers 9 exceeds h100-sxm's 8 GPUs per node")


def test_cost_defaults_and_groups(capsys):
    """Without --tokens the documented 1,512,4096; --groups is capped by the rows of each pass
    (one token is one stream however many groups are asked for)."""
    assert main(["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--groups", "32", "--json"]) == 0
    steps = last_json(capsys.readouterr().out)["steps"]
    assert [s["num_tokens"] for s in steps] == [1, 512, 4096]
    assert [s["query_groups"] for s in steps] == [1, 32, 32]


def test_cost_calibrate_from_a_trace_of_another_gpu_is_refused(t, capsys):
    """A trace captured on an H200 times the H200's passes: fitting h100-sxm to it is refused,
    fitting h200 to it is what it is for."""
    meta = json.loads((t / "meta.json").read_text())
    meta["device"] = {"type": "cuda", "name": "NVIDIA H200", "memory_bytes": 141 * 2**30}
    (t / "meta.json").write_text(json.dumps(meta))
    base = ["cost", "--model", "llama-3-8b", "--tokens", "1", "--calibrate-from", str(t), "--json"]
    refused([*base, "--hardware", "h100-sxm"], capsys, "was captured on NVIDIA H200, not on h100-sxm")
    assert main([*base, "--hardware", "h200"]) == 0
    assert "fitted to" in last_json(capsys.readouterr().out)["calibration"]


def test_cost_explain_adds_the_kernels_to_the_json_line(capsys):
    base = ["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--tokens", "1", "--json"]
    assert main(base) == 0
    assert "explain" not in last_json(capsys.readouterr().out)
    assert main([*base, "--explain"]) == 0
    rows = last_json(capsys.readouterr().out)["explain"]
    assert rows and all(row["num_tokens"] == 1 and row["tile"] for row in rows)


# --- solm inspect, calibrate ---------------------------------------------------------------------


def test_inspect_valid_is_null_unless_validated(capsys):
    """`valid` in the JSON line says what --validate found; without it nothing was asked (null)."""
    assert main(["inspect", str(SHIPPED), "--json"]) == 0
    assert last_json(capsys.readouterr().out)["valid"] is None
    assert main(["inspect", str(SHIPPED), "--json", "--validate"]) == 0
    line = last_json(capsys.readouterr().out)
    assert line["valid"] is True and line["problems"] == []


def test_calibrate_never_writes_over_its_own_table_even_with_force(tmp_path, capsys):
    """`solm calibrate G.csv --out G.csv --force`: --force replaces an old output, never the input."""
    table = tmp_path / "gemms.csv"
    shutil.copy(REPO / "simulator" / "data" / "xla-gemm" / "h100-sxm.csv", table)
    before = table.read_bytes()
    refused(["calibrate", str(table), "--hardware", "h100-sxm", "--out", str(table), "--force"], capsys, "is the input")
    assert table.read_bytes() == before


def test_calibrate_refuses_an_existing_output_without_force(tmp_path, capsys):
    out = tmp_path / "cal.json"
    out.write_text("mine\n")
    table = REPO / "simulator" / "data" / "xla-gemm" / "h100-sxm.csv"
    refused(["calibrate", str(table), "--hardware", "h100-sxm", "--out", str(out)], capsys, "pass --force")
    assert out.read_text() == "mine\n"


def test_calibrate_refuses_a_table_given_twice(tmp_path, capsys):
    """Its GEMMs would weigh twice in the fit (as ./name, spelled otherwise)."""
    table = REPO / "simulator" / "data" / "xla-gemm" / "h100-sxm.csv"
    again = tmp_path / "link.csv"
    again.symlink_to(table)
    argv = ["calibrate", str(table), str(again), "--hardware", "h100-sxm", "--out", str(tmp_path / "cal.json")]
    refused(argv, capsys, f"GEMM table {again} is given twice")
    assert not (tmp_path / "cal.json").exists()


def test_diff_refuses_an_existing_html_before_the_work(t, tmp_path, monkeypatch, capsys):
    """A refused --html costs nothing: the traces are not even compared."""
    import profiler.diff

    def compared(*a, **k):
        raise AssertionError("diffed before the output was checked")

    monkeypatch.setattr(profiler.diff, "diff_paths", compared)
    html = tmp_path / "report.html"
    html.write_text("mine\n")
    refused(["diff", str(t), str(SHIPPED), "--html", str(html)], capsys, "pass --force")
    assert html.read_text() == "mine\n"


# --- solm simulate -------------------------------------------------------------------------------


def test_simulate_off_and_text_settings_reach_the_replay(capsys):
    """--no-chunked-prefill (a False given) reaches the replay, not the default True; a text field
    of --set keeps the text given (`name=123` names the part "123", not the number 123)."""
    argv = ["simulate", str(SHIPPED), "--hardware", "h100-sxm", "--num-requests", "2", "--json"]
    assert main([*argv, "--no-chunked-prefill", "--set", "name=123"]) == 0
    line = last_json(capsys.readouterr().out)
    assert line["chunked_prefill"] is False and line["hardware"] == "123"
    # --block-size pages the KV: a request of 64 tokens takes four 16-token pages, two of 48 (96 tokens)
    assert main([*argv, "--block-size", "48"]) == 0
    assert last_json(capsys.readouterr().out)["peak_kv_bytes"] == line["peak_kv_bytes"] * 3 // 2


# --- solm capture (flags checked before anything runs) -------------------------------------------


def capture_args(*flags: str) -> argparse.Namespace:
    from solm.cli import build_parser

    parser, _ = build_parser()
    return parser.parse_args(["capture", "--out", "unused", *flags])


@pytest.mark.parametrize(
    "flags",
    [
        ["--counters-hz", "1000"],  # (0, 1000]: the top is allowed
        ["--temperature", "0.7", "--top-p", "1"],  # (0, 1]
        ["--device", "cuda:1"],
        ["--device", "cuda"],
    ],
)
def test_capture_accepts_the_edges_of_its_ranges(flags):
    from solm.commands.capture import check_args

    check_args(capture_args(*flags))


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--counters-hz", "1000.5"], "--counters-hz must be a number in (0, 1000]"),
        (["--temperature", "0.7", "--top-p", "1.01"], "--top-p must be in (0, 1]"),
        (["--device", "cuda:"], "--device must be cpu or cuda[:i]"),
        (["--rows-sweep"], "--rows-sweep times the serving runtime's forward"),  # without --rate: ignored
    ],
)
def test_capture_refuses_just_beyond_its_ranges(flags, needle):
    from profiler.errors import UsageError
    from solm.commands.capture import check_args

    with pytest.raises(UsageError) as e:
        check_args(capture_args(*flags))
    assert needle in str(e.value)


def test_capture_flags_reach_the_capture_config():
    """What the flags say is what the capture runs with (not the config's defaults)."""
    from solm.commands.capture import _capture_config, check_args

    args = capture_args(
        *("--temperature", "0.7", "--top-p", "0.5", "--counters-hz", "50", "--warmup", "0"),
        *("--repeats", "3", "--keep", "median", "--knob", "max_threads=4"),
    )
    check_args(args)
    cfg = _capture_config(args)
    assert (cfg.temperature, cfg.top_p, cfg.counters_interval_s) == (0.7, 0.5, 1 / 50)
    assert (cfg.warmup, cfg.repeats, cfg.keep, cfg.knobs) == (0, 3, "median", {"max_threads": 4})


def test_capture_serving_flags_reach_the_load_config():
    from solm.commands.capture import _load_config, check_args

    args = capture_args("--concurrency", "2", "--rows-sweep", "--max-seqs", "3", "--chunked-prefill")
    check_args(args)
    load = _load_config(args)
    assert (load.concurrency, load.rows_sweep, load.max_seqs, load.chunked_prefill) == (2, True, 3, True)


def test_capture_knob_without_a_key_is_refused():
    from profiler.errors import UsageError
    from solm.commands.capture import parse_knobs

    assert parse_knobs(["mode=greedy", "max_threads=4"]) == {"mode": "greedy", "max_threads": 4}
    with pytest.raises(UsageError, match="--knob expects KEY=VALUE"):
        parse_knobs(["=4"])


# --- solm train (flags checked and applied before any training) ----------------------------------


def train_config(*flags: str):
    from solm.cli import build_parser
    from solm.commands.train import _recipe_and_config

    parser, _ = build_parser()
    return _recipe_and_config(parser.parse_args(["train", "--out", "unused", *flags]))[1]


def test_train_flags_reach_the_training_config():
    cfg = train_config("--seed", "7", "--lr", "0.002", "--steps", "3", "--batch-size", "5")
    assert (cfg.seed, cfg.lr, cfg.steps, cfg.batch_size) == (7, 0.002, 3, 5)


def test_train_learning_rate_zero_is_refused():
    from profiler.errors import UsageError

    with pytest.raises(UsageError, match=r"--lr must be a number in \(0, "):
        train_config("--lr", "0")


@pytest.mark.parametrize("lam", ["inf", "nan"])
def test_train_lambda_must_be_finite(lam):
    from profiler.errors import UsageError

    with pytest.raises(UsageError, match=f"--lambda must be a finite number, got {lam}"):
        train_config("--system", "pasta", "--stage", "preference", "--lambda", lam)


# --- solm dashboard ------------------------------------------------------------------------------


def test_dashboard_port_range(tmp_path, capsys):
    """1..65535: the top port is served (dry run: the command line), 65536 is refused."""
    refused(["dashboard", str(tmp_path), "--port", "65536", "--dry-run"], capsys, "--port 65536 is not a port")
    pytest.importorskip("streamlit")  # the dry run still checks streamlit is there
    assert main(["dashboard", str(tmp_path), "--port", "65535", "--dry-run"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["url"] == "http://127.0.0.1:65535" and line["command"][-3:] == ["65535", "--", str(tmp_path)]
    assert main(["dashboard", str(tmp_path), "--dry-run", "--allow-any-path"]) == 0
    assert json.loads(capsys.readouterr().out)["command"][-2:] == [str(tmp_path), "--allow-any-path"]
