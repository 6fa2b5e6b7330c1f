"""Bad input to `solm simulate`, `validate`, `cost`, `calibrate` and `sweep` that used to end in a
traceback, a multi-line error, a silently ignored flag or a NaN/inf/absurd figure: now one line
`solm <command>: error: ...` and exit 2 (or, for `cost --comm --workers 1`, no NaN printed), with
every file of the user's folder untouched. Each case says what it did before."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from solm.cli import main

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "traces" / "sequential-reverse_words"
XLA_H100 = REPO / "simulator" / "data" / "xla-gemm" / "h100-sxm.csv"
HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".solm.lock"
    }


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """The user's folder, the working directory: a trace `t`, a workload, a GEMM table, notes."""
    shutil.copytree(SHIPPED, tmp_path / "t")
    (tmp_path / "w.csv").write_text(HEADER + "0,10,5\n0.5,12,6\n1.0,8,4\n")
    shutil.copy(XLA_H100, tmp_path / "g.csv")
    (tmp_path / "notes.txt").write_text("the user's notes\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(argv: list[str], home: Path, capsys, needle: str) -> str:
    """Exit 2, one stderr line `solm <command>: error: ...` containing `needle`, nothing changed."""
    before = digest(home)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors leave through parser.exit
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"solm {argv[0]}: error: ") and err.count("\n") == 1 and needle in err, err
    assert digest(home) == before
    return err


SIM = ["simulate", "t", "--hardware", "h100-sxm", "--num-requests", "4"]
WORKLOAD = ["simulate", "--workload", "w.csv", "--structure-from", "t", "--hardware", "h100-sxm"]
COST = ["cost", "--hardware", "h100-sxm", "--model", "llama-3-8b"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        # was: the command's 21-line usage block, then the error
        ([*SIM, "--max-seqs", "abc"], "argument --max-seqs: invalid int value: 'abc'"),
        (["simulate", "t"], "the following arguments are required: --hardware"),
        (["sweep", "t", "--hardware", "h100-sxm", "--bogus"], "unrecognized arguments: --bogus"),
        (["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--json", "x"], "unrecognized arguments: x"),
    ],
)
def test_argparse_errors_are_one_line(argv, needle, home, capsys):
    refused(argv, home, capsys, needle)


@pytest.mark.parametrize(
    "argv,needle",
    [
        # was: exit 0 with "cost_usd": Infinity and "cost per 1M output tokens inf"
        ([*SIM, "--price-per-gpu-hour", "inf"], "price_per_gpu_hour must be a finite number >= 0, got inf"),
        ([*SIM, "--set", "price_per_gpu_hour=1e400"], "finite"),
        # was: internal error (a bug): ValueError: expected non-negative integer (numpy's generator)
        ([*SIM, "--rate", "1", "--seed", "-1"], "seed must be an integer >= 0, got -1"),
        ([*WORKLOAD, "--seed", "-1"], "seed must be an integer >= 0, got -1"),
        (
            ["sweep", "t", "--hardware", "h100-sxm", "--rate", "1", "--seed", "-1", "--workers", "1"],
            "seed must be an integer >= 0",
        ),
        # was: the positional trace silently ignored, the --structure-from one replayed instead
        (["simulate", "t", "--workload", "w.csv", "--structure-from", "t2", "--hardware", "h100-sxm"], "once"),
        # was: internal error (a bug): OSError: [Errno 36] File name too long
        ([*SIM, "--out", "x" * 300], "File name too long"),
        # was: the last --set of a field silently won; a blank field name was set as ' '
        ([*SIM, "--set", "num_sms=100", "--set", "num_sms=200"], "--set num_sms is given twice"),
        # was: accepted and recorded as given (the fields only describe the part)
        ([*SIM, "--set", "nvlink_generation=banana"], "nvlink_generation must be a whole number in 1..6, got 'banana'"),
        ([*SIM, "--set", "pcie_generation=0"], "pcie_generation must be a whole number in 1..7, got 0"),
        (["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--set", " =3"], "--set expects FIELD=VALUE"),
        # was: the value echoed whole (an int of 5,000 digits is kept as text, then refused as no number)
        (
            [*SIM, "--set", "hbm_bytes_per_s=" + "9" * 5000],
            "hbm_bytes_per_s must be a number > 0, got '" + "9" * 59 + "... (5002",
        ),
        ([*SIM, "--set", "num_sms=" + "9" * 5000], "num_sms must be a number > 0, got '" + "9" * 59 + "... (5002"),
        ([*SIM, "--set", "x" * 5000], "--set expects FIELD=VALUE, got '" + "x" * 59 + "... (5002"),
        # was: exit 0, the GPU's KV sent to a CPU over NVLink in 0.02 ms, the deployment "= 2 GPUs"
        (
            [*SIM, "--model", "llama-3-8b", "--disaggregate", "1:1", "--decode-hardware", "host-cpu"],
            "--decode-hardware host-cpu is a CPU and --hardware h100-sxm a GPU",
        ),
        # was: exit 0, a pass of 1e20 tokens reading 5e39 KV tokens in 1.4e15 ms (--kv-tokens alike)
        ([*COST, "--tokens", "1,99999999999999999999"], "--tokens must be at most 1048576 (a 1M-token context"),
        ([*COST, "--kv-tokens", "99999999999999"], "--kv-tokens must be at most 1048576"),
        # was: exit 0, the column (or the collective's rows) printed twice
        ([*COST, "--tokens", "512,1,512"], "--tokens names 512 twice"),
        ([*COST[:3], "--comm", "all_reduce", "--workers", "2,4,2"], "--workers names 2 twice"),
        # was: exit 0, a buffer of 1e23 bytes per GPU in 2.2e14 ms
        (
            [*COST[:3], "--comm", "all_reduce", "--bytes", "1" + "0" * 23],
            "--bytes must be at most 85899345920 (h100-sxm's",
        ),
    ],
)
def test_simulate_settings_refused(argv, needle, home, capsys):
    shutil.copytree(home / "t", home / "t2")
    refused(argv, home, capsys, needle)
    assert not (home / ("x" * 255)).exists()


@pytest.mark.parametrize(
    "rows,flags,needle",
    [
        # was: killed for memory after ~50 s (a billion decode passes stretched)
        ("0,10,1000000000\n", [], "num_decode_tokens must be a whole number in 1..1048576, got 1000000000"),
        ("0,0x10,5\n", [], "num_prefill_tokens is not a number"),
        # was: read_csv made True a boolean and to_numeric made it 1 token (False: 0)
        ("0,True,5\n1,False,5\n", [], "row 1: num_prefill_tokens is not a number (True)"),
        ("0,10,5\n1,True,5\n", [], "row 2: num_prefill_tokens is not a number ('True')"),
        ("0," + "9" * 5000 + ",5\n", [], "not a number ('" + "9" * 59 + "... (5002 characters))"),  # was: quoted whole
        # was: "duration 1e300 s", GPU-hours 2.8e296 and the second request's e2e 0 ms
        ("0,10,5\n1e300,10,5\n", [], "the arrivals span 1e+300 s"),
        # was: arrivals overflowed to inf: "duration inf s", "GPU-hours inf", a RuntimeWarning
        ("0,10,5\n1e10,10,5\n", ["--time-scale", "1e-300"], "the arrivals span inf s (after --time-scale 1e-300)"),
    ],
)
def test_workload_files_refused(rows, flags, needle, home, capsys):
    (home / "x.csv").write_text(HEADER + rows)
    argv = ["simulate", "--workload", "x.csv", "--structure-from", "t", "--hardware", "h100-sxm", *flags]
    refused(argv, home, capsys, needle)


def test_workload_columns_that_read_one_column_twice_are_refused(home, capsys):
    """Was: --columns arrived_at=num_prefill_tokens replayed each prompt length as its arrival time, exit 0."""
    argv = [*WORKLOAD, "--columns", "arrived_at=num_prefill_tokens"]
    refused(argv, home, capsys, "--columns reads arrived_at and num_prefill_tokens both from the column")


@pytest.mark.parametrize(
    "text,needle",
    [
        # was: exit 0, the header taken as naming the columns after an index: a prompt of 5, an answer of 7
        (HEADER + "0,10,5,7\n1,10,5,7\n", "a row has more fields than the header's 3; not a CSV workload"),
        # was: exit 0, pandas renamed the second arrived_at.1 and the first was read
        ("arrived_at,arrived_at,num_prefill_tokens,num_decode_tokens\n0,9,10,5\n", "names column 'arrived_at' twice"),
    ],
)
def test_workload_file_misread_by_pandas_is_refused(text, needle, home, capsys):
    (home / "x.csv").write_text(text)
    refused(
        ["simulate", "--workload", "x.csv", "--structure-from", "t", "--hardware", "h100-sxm"], home, capsys, needle
    )


@pytest.mark.parametrize(
    "edit,needle",
    [
        # was: exit 0, a calibration fitted on one of the two m columns (the later one, 'm' over 'M')
        (lambda t: t.assign(M=7)[["M", "m", "n", "k", "bf16_flops_per_s"]], "the header names column 'm' twice"),
        # was: "row 1: k must be a whole number up to 2^24" (the columns read shifted by one)
        (lambda t: t.assign(extra=1), "a row has more fields than the header's 4"),
    ],
)
def test_gemm_table_misread_by_pandas_is_refused(edit, needle, home, capsys):
    table = edit(pd.read_csv(home / "g.csv"))
    text = table.to_csv(index=False)
    if "extra" in table:  # the header without the extra column's name: every row one field wider
        text = text.replace(",extra\n", "\n", 1)
    (home / "bad.csv").write_text(text)
    refused(["calibrate", "bad.csv", "--hardware", "h100-sxm", "--out", "c.json"], home, capsys, needle)


def test_workload_file_longer_than_a_replay_is_refused(home, capsys, monkeypatch):
    """Was: 2 million rows replayed for minutes, past --num-requests' own limit of 1 million."""
    from simulator.cluster import workload_file

    monkeypatch.setattr(workload_file, "MAX_REQUESTS", 2)  # the limit shared with --num-requests, made small
    refused(WORKLOAD, home, capsys, "w.csv: 3 requests; the simulator replays at most 2")


def test_validate_refuses_scheduling_flags_it_would_ignore(home, capsys):
    """Was: `validate T --scheduler sjf` ran the trace as captured and said nothing of the flag."""
    refused(["validate", "t", "--scheduler", "sjf", "--reserve", "peak"], home, capsys, "--scheduler, --reserve")


def test_calibrate_refuses_times_faster_than_the_part(home, capsys):
    """Was: times 1e6x too fast (another unit) were fitted, held-out APE 3.9e11 %, and the file written."""
    table = pd.read_csv(home / "g.csv")
    table["time_s"] = 2.0 * table.m * table.n * table.k / table.bf16_flops_per_s / 1e6
    table.drop(columns="bf16_flops_per_s").to_csv(home / "fast.csv", index=False)
    refused(["calibrate", "fast.csv", "--hardware", "h100-sxm", "--out", "c.json"], home, capsys, "TFLOP/s peak")
    assert not (home / "c.json").exists()


def test_calibrate_refuses_times_far_slower_than_any_fit(home, capsys):
    """Was: times 1e6x too slow (microseconds in time_s) fitted with every parameter at a bound, in-sample
    median APE 100 %, and the file written, exit 0."""
    table = pd.read_csv(home / "g.csv")
    table["time_s"] = 2.0 * table.m * table.n * table.k / table.bf16_flops_per_s * 1e6
    table.drop(columns="bf16_flops_per_s").iloc[::4].to_csv(home / "slow.csv", index=False)
    refused(["calibrate", "slow.csv", "--hardware", "h100-sxm", "--out", "c.json"], home, capsys, "misses these GEMMs")
    assert not (home / "c.json").exists()


def test_calibrate_refuses_one_table_twice(home, capsys):
    """Was: the same table given twice (or under two spellings) counted each GEMM twice."""
    os.symlink(home / "g.csv", home / "g2.csv")
    argv = ["calibrate", "g.csv", "g2.csv", "--hardware", "h100-sxm", "--out", "c.json"]
    refused(argv, home, capsys, "GEMM table g2.csv is given twice (as g.csv)")
    assert not (home / "c.json").exists()


def test_calibrate_out_where_no_file_can_be_made_is_refused_before_the_fit(home, capsys, monkeypatch):
    """Was: os.access let root write in /proc, the fit ran (20 s), then writing the file was an internal
    error (FileNotFoundError, exit 1). Now refused up front, the fit never started."""
    import simulator.gemm_calibration as gc

    monkeypatch.setattr(gc, "calibrate", lambda *a, **k: pytest.fail("fitted before the --out check"))
    refused(["calibrate", "g.csv", "--hardware", "h100-sxm", "--out", "/proc/solm-cal.json"], home, capsys, "/proc")


def test_cost_calibrated_from_another_devices_trace_is_refused(home, capsys):
    """Was: exit 0, llama-3-8b on an h100-sxm fitted to a CPU capture's passes: 4.7 s a one-token pass."""
    argv = [*COST, "--tokens", "1", "--calibrate-from", "t"]
    refused(argv, home, capsys, "--calibrate-from t was captured on cpu (x86_64, 2 cores), not on h100-sxm")
    assert main([*COST[:1], "--hardware", "host-cpu", *COST[3:], "--tokens", "1", "--calibrate-from", "t"]) == 0


def test_cost_comm_on_one_worker_prints_no_nan(home, capsys):
    """Was: a bus bandwidth of `nan` GB/s for a one-GPU collective (no bytes moved, in no time)."""
    assert main(["cost", "--hardware", "h100-sxm", "--comm", "all_reduce", "--workers", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower() and "n/a" in out


SWEEP = ["sweep", "t", "--hardware", "h100-sxm", "--num-requests", "4", "--workers", "1", "--json"]


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--workers", "0"], "workers must be >= 1, got 0"),  # was: 0 taken as the default (one per core)
        (["--workers", "100000"], "processes per core"),  # was: 2500+ pool processes spawned, the machine thrashed
        (["--price-per-gpu-hour", "nan"], "price_per_gpu_hour must be a finite"),  # was: an error row per config
        # was: 399 x 399 = 159,201 replays accepted and run for hours, nothing said of the grid's size
        (
            ["--max-seqs", ",".join(map(str, range(1, 400))), "--rate", ",".join(map(str, range(1, 400)))],
            "the grid has 159,201 configurations (399 max-seqs x 399 arrivals), more than the 100,000",
        ),
        # was: ran, then writing sweep.parquet (and every resume) an internal error, OverflowError
        (["--max-seqs", "1,99999999999999999999", "--out", "sw"], "--max-seqs 99999999999999999999: beyond the 64-bit"),
        (["--rate", "1", "--seed", str(2**64)], f"--seed {2**64}: beyond the 64-bit integers"),
        # was: the value echoed whole, an error line of 5,000 characters
        (["--max-seqs", "9" * 5000], "list of ints, got '" + "9" * 59 + "... (5002 characters)"),
        (["--max-seqs", "9" * 4000 + "," + "9" * 4000], "names " + "9" * 60 + "... (4000 characters) twice, got '"),
        (["--hardware", "x" * 5000], "unknown hardware '" + "x" * 59 + "... (5002 characters); valid names"),
        (["--model", "x" * 5000], "unknown model '" + "x" * 59 + "... (5002 characters); valid names"),
        (["--scheduler", "x" * 5000], "unknown scheduler '" + "x" * 59 + "... (5002 characters); valid names"),
    ],
)
def test_sweep_settings_refused(flags, needle, home, capsys):
    refused([*SWEEP, *flags], home, capsys, needle)


def _sweep_into(home: Path, *flags: str) -> None:
    assert main([*SWEEP, "--out", "sw", "--max-seqs", "1,2", *flags]) == 0


def test_sweep_does_not_resume_another_sweep(home, capsys):
    """Was: a sweep into another sweep's folder replaced its sweep.parquet with this grid's rows."""
    _sweep_into(home)
    capsys.readouterr()
    refused([*SWEEP, "--out", "sw", "--max-seqs", "4"], home, capsys, "holds 2 finished configuration(s) of another")
    assert main([*SWEEP, "--out", "sw", "--max-seqs", "1,2,4"]) == 0  # a grid that extends it still resumes


def test_sweep_refuses_results_it_cannot_read(home, capsys):
    """Was: a FIFO as results.jsonl blocked the resume for ever; a line `{bad}` was a JSONDecodeError."""
    _sweep_into(home)
    capsys.readouterr()
    results = home / "sw" / "results.jsonl"
    results.write_text("{bad}\n")
    refused([*SWEEP, "--out", "sw", "--max-seqs", "1,2"], home, capsys, "not a sweep's results")
    # was: json's ValueError for an integer of more than 4300 digits, an internal error (exit 1)
    results.write_text('{"key": ' + "9" * 5000 + "}\n")
    refused([*SWEEP, "--out", "sw", "--max-seqs", "1,2"], home, capsys, "an integer of more than 4300 digits")
    results.write_text('{"key": ' + "[" * 100000 + "]" * 100000 + "}\n")  # was: RecursionError, exit 1
    refused([*SWEEP, "--out", "sw", "--max-seqs", "1,2"], home, capsys, "nested too deeply")
    results.unlink()
    os.mkfifo(results)
    refused([*SWEEP, "--out", "sw", "--max-seqs", "1,2"], home, capsys, "not a regular file")


def test_sweep_refuses_results_edited_into_other_shapes(home, capsys):
    """Was: a line `[1, 2]` skipped as if torn (the resume appended after it), and a row whose
    max_seqs was made the text "1" an internal error (ArrowTypeError) once the grid had run."""
    import json

    _sweep_into(home)
    capsys.readouterr()
    results = home / "sw" / "results.jsonl"
    first, second = results.read_text().splitlines()
    results.write_text("[1, 2]\n" + first + "\n")
    refused([*SWEEP, "--out", "sw", "--max-seqs", "1,2"], home, capsys, "not a sweep's result row")
    results.write_text(json.dumps({**json.loads(first), "max_seqs": "1"}) + "\n" + second + "\n")
    refused([*SWEEP, "--out", "sw", "--max-seqs", "1,2"], home, capsys, "rows of mixed types")
    edited = json.dumps({**json.loads(first), "max_seqs": "1"}) + "\n"
    results.write_text(edited)  # the mix comes with the resume's row: the rows are kept, the table not written
    assert main([*SWEEP, "--out", "sw", "--max-seqs", "1,2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rows of mixed types" in err, err
    assert results.read_text().startswith(edited) and len(results.read_text().splitlines()) == 2


def test_sweep_refuses_results_holding_an_integer_beyond_64_bits(home, capsys):
    """Was: a row edited to max_seqs 99999999999999999999 beside the others was an internal error
    (OverflowError) at every resume, not the one line of a row of the wrong type."""
    import json

    _sweep_into(home)
    capsys.readouterr()
    results = home / "sw" / "results.jsonl"
    first, second = results.read_text().splitlines()
    results.write_text(json.dumps({**json.loads(first), "max_seqs": 10**20}) + "\n" + second + "\n")
    refused([*SWEEP, "--out", "sw", "--max-seqs", "1,2"], home, capsys, "rows of mixed types")


def test_sweep_does_not_append_through_a_link(home, capsys):
    """Was: a results.jsonl that is a link to a file elsewhere had the resume's rows appended to it."""
    _sweep_into(home)
    capsys.readouterr()
    results = home / "sw" / "results.jsonl"
    elsewhere = home / "elsewhere.jsonl"
    results.rename(elsewhere)
    results.symlink_to(elsewhere)
    before = elsewhere.read_bytes()
    refused([*SWEEP, "--out", "sw", "--max-seqs", "1,2,4"], home, capsys, "results.jsonl: a link, not the results")
    assert elsewhere.read_bytes() == before


def test_sweep_does_not_write_its_table_through_a_link(home, capsys):
    """Was: the table went to a fixed `.sweep.parquet.tmp` first: a link there had it written into
    the file the link named (the user's notes replaced by Parquet bytes)."""
    _sweep_into(home)
    (home / "sw" / ".sweep.parquet.tmp").symlink_to(home / "notes.txt")
    assert main([*SWEEP, "--out", "sw", "--max-seqs", "1,2,4"]) == 0  # resumed: one more row, the table rewritten
    assert (home / "notes.txt").read_text() == "the user's notes\n"
    assert len(pd.read_parquet(home / "sw" / "sweep.parquet")) == 3


def test_sweep_refuses_a_folder_as_its_table(home, capsys):
    """Was: a folder named sweep.parquet let the whole grid run, then failed to be replaced (an error
    naming `.sweep.parquet.tmp`, after the rows were appended)."""
    _sweep_into(home)
    capsys.readouterr()
    (home / "sw" / "sweep.parquet").unlink()
    (home / "sw" / "sweep.parquet").mkdir()
    refused([*SWEEP, "--out", "sw", "--max-seqs", "1,2,4"], home, capsys, "sweep.parquet: a folder, not the table")


def test_sweep_refuses_a_table_without_its_rows(home, capsys):
    """Was: with results.jsonl gone, the grid ran again and replaced sweep.parquet, whichever grid it held."""
    _sweep_into(home)
    capsys.readouterr()
    (home / "sw" / "results.jsonl").unlink()
    before = (home / "sw" / "sweep.parquet").read_bytes()
    refused([*SWEEP, "--out", "sw", "--max-seqs", "1,2,4"], home, capsys, "holds a sweep.parquet but no results.jsonl")
    assert (home / "sw" / "sweep.parquet").read_bytes() == before


def test_sweep_resumes_twice_after_a_torn_row(home, capsys):
    """Was: the resume appended its rows to the torn last line, and the next resume could not parse it."""
    _sweep_into(home)
    results = home / "sw" / "results.jsonl"
    results.write_text(results.read_text()[:-40])  # the second row cut short
    _sweep_into(home)
    _sweep_into(home)
    assert sum(line.endswith("}") for line in results.read_text().splitlines()) == 2


def _edit_steps(t: Path, col: str, value) -> None:
    steps = pd.read_parquet(t / "steps.parquet")
    steps.loc[0, col] = value
    steps.to_parquet(t / "steps.parquet", index=False)


@pytest.mark.parametrize("duration", [float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "t"],
        ["validate", "t", "--uncalibrated"],
        ["cost", "--model", "llama-3-8b", "--hardware", "host-cpu", "--calibrate-from", "t"],
    ],
)
def test_a_pass_of_no_finite_duration_is_a_trace_error(argv, duration, home, capsys):
    """Was: internal error (a bug): scipy's ValueError ('Initial guess is outside of provided bounds',
    'Residuals are not finite') or calibrate's own bare ValueError."""
    _edit_steps(home / "t", "duration_s", duration)
    refused(argv, home, capsys, "t: not a valid trace: steps: 1 rows with duration_s infinite, negative or NaN")


@pytest.mark.parametrize("col", ["active_streams", "query_tokens"])
@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "t"],
        ["validate", "t", "--uncalibrated"],
        ["cost", "--model", "llama-3-8b", "--hardware", "host-cpu", "--calibrate-from", "t"],
        WORKLOAD,
    ],
)
def test_a_pass_of_no_query_row_or_stream_is_a_trace_error(argv, col, home, capsys):
    """Was: internal error (a bug): the cost model's 'query_groups must be >= 1' (a pass of 37 query rows
    for 0 streams, or a workload stretched from passes of 0 query rows). A serving trace's prefill-chunk
    rows (no rows of their own) stay valid."""
    steps = pd.read_parquet(home / "t" / "steps.parquet")
    steps[col] = 0 if col == "query_tokens" else steps[col].where(steps.index > 0, 0)
    steps.to_parquet(home / "t" / "steps.parquet", index=False)
    refused(
        argv,
        home,
        capsys,
        f"not a valid trace: steps: {len(steps) if col == 'query_tokens' else 1} passes with {col} < 1",
    )


def test_a_pass_wider_than_any_context_is_a_trace_error(home, capsys):
    """Was: 1e12 query tokens in one pass, chunked into 1e8 prefill chunks: simulate never ended."""
    _edit_steps(home / "t", "query_tokens", 10**12)
    refused(SIM, home, capsys, "a pass of 1000000000000 query tokens")


@pytest.mark.parametrize(
    "argv",
    [
        [*SIM, "--out", ""],  # was: exit 0 and no trace written (taken for no --out)
        ["sweep", "t", "--hardware", "h100-sxm", "--num-requests", "4", "--workers", "1", "--out", " "],
        ["calibrate", "g.csv", "--hardware", "h100-sxm", "--out", ""],  # was: "--out  is a directory"
    ],
)
def test_an_empty_output_path_is_refused(argv, home, capsys):
    refused(argv, home, capsys, "--out is empty")


@pytest.mark.parametrize("flags", [["--micro-batches", "4"], ["--pp-schedule", "interleave"]])
def test_pipeline_flags_without_a_pipeline_are_refused(flags, home, capsys):
    """Was: exit 0 with the flag silently ignored (one stage: no micro-batches, no schedule)."""
    refused([*SIM, "--model", "llama-3-8b", *flags], home, capsys, "apply to a pipeline: give --pp 2 or more")


def test_validate_under_load_refuses_a_trace_given_twice(home, capsys):
    """Was: exit 0 with the same load level validated and printed twice (however the path is spelled)."""
    refused(["validate", "t", "./t/", "--calibrate-from", "t"], home, capsys, "trace ./t/ is given twice (as t)")


@pytest.mark.parametrize("flags", [["--uncalibrated"], ["--run", "0"]])
def test_validate_under_load_refuses_single_trace_flags(flags, home, capsys):
    """Was: `validate T --calibrate-from B --run 0` (or --uncalibrated) ran the load validation, flag ignored."""
    refused(["validate", "t", "--calibrate-from", "t", *flags], home, capsys, "not with --calibrate-from")


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["sweep", "t", "./t/", "--hardware", "h100-sxm"], "trace ./t/ is given twice"),
        (["sweep", "t", "--hardware", "h100-sxm,h200,h100-sxm"], "--hardware names h100-sxm twice"),
        (["sweep", "t", "--hardware", "h100-sxm", "--rate", "1,inf,1.0"], "--rate names 1.0 twice"),
    ],
)
def test_sweep_refuses_a_configuration_given_twice(argv, needle, home, capsys):
    """Was: exit 0 with each such configuration run twice and its rows doubled in the table."""
    refused(argv, home, capsys, needle)
