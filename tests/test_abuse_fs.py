"""File-system oddities, serving flags and the environment, given to the real command line: odd
names (a newline, bytes that are not UTF-8), links standing for an output file, huge sparse inputs,
a deleted working directory, the dashboard's address and port. Each case here ended in a
traceback (exit 1), a hang, a crash of the machine's memory, a second stderr line or a file replaced
that the command was not told to replace (each case names what it did before); now each is one
line `solm <command>: error: ...`, exit 2, and the user's folder is as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from solm.cli import main
from tests.test_abuse_io import SHIPPED, digest, refused

REPO = Path(__file__).resolve().parents[1]
PD = REPO / "traces" / "planned_diffusion-word_facts"


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """The user's folder: a trace `t`, a planned-diffusion trace `pd`, notes; the working directory."""
    shutil.copytree(SHIPPED, tmp_path / "t")
    shutil.copytree(PD, tmp_path / "pd")
    (tmp_path / "notes.txt").write_text("the user's notes\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def solm(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "solm", *argv], cwd=cwd, env=env, capture_output=True, timeout=timeout, check=False
    )


# ---- odd names ---------------------------------------------------------------------------------
def test_a_name_with_a_newline_stays_one_line(work, capsys):
    """Was: the error line named the folder `a<newline>b` as it is, so stderr held two lines."""
    (work / "t").rename(work / "a\nb")
    refused(["diff", "pd", "a\nb"], capsys, "pd and a\\nb share no request", work)
    with pytest.raises(SystemExit) as e:  # argparse's own error
        main(["inspect", "a\nb", "c\nd"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "unrecognized arguments: c\\nd" in err, err


@pytest.mark.parametrize("argv", [["inspect", "T"], ["simulate", "T", "--hardware", "h100-sxm"], ["validate", "T"]])
def test_a_name_that_is_not_utf8_is_refused(argv, work):
    """Was: internal error (a bug): UnicodeEncodeError from pyarrow opening the trace, exit 1."""
    bad = os.fsencode(work) + b"/t\xff"
    os.rename(work / "t", bad)
    before = digest(work)
    r = solm([os.fsdecode(bad) if a == "T" else a for a in argv], work)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1 and "t\\xff is not UTF-8 text" in err, err
    assert digest(work) == before


def test_a_deleted_working_directory_is_named(work, tmp_path):
    """Was: 'Intel oneMKL FATAL ERROR: Cannot load .../libtorch_cpu.so', exit 2, from torch's import."""
    (tmp_path / "gone").mkdir()
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; os.rmdir(os.getcwd()); from solm.cli import main; sys.exit(main())",
            "inspect",
            str(work / "t"),
        ],
        cwd=tmp_path / "gone",
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("solm inspect: error: the working directory no longer exists"), r.stderr


# ---- output files: export --perfetto, diff --html, calibrate --out -----------------------------
XLA_H100 = REPO / "simulator" / "data" / "xla-gemm" / "h100-sxm.csv"
FILE_OUTPUTS = [
    ["export", "t", "--perfetto"],
    ["diff", "t", "t", "--html"],
    ["calibrate", str(XLA_H100), "--hardware", "h100-sxm", "--out"],
]


@pytest.mark.parametrize("cmd", FILE_OUTPUTS)
def test_a_link_to_a_stream_is_not_replaced(cmd, work, capsys):
    """Was: `--perfetto /dev/stdout --force` (a link to /proc/self/fd/1) passed the check, which looked
    at the pipe it points to, and the rename replaced the link: run as root it turned the machine's
    /dev/stdout into a 240 KB file. A link to nothing was replaced without --force."""
    read, write = os.pipe()  # what /dev/stdout points to under `solm ... | less`
    (work / "out").symlink_to(f"/proc/self/fd/{write}")
    (work / "dangling").symlink_to("nowhere.json")
    try:
        refused([*cmd, "out", "--force"], capsys, "out exists and is not a regular file", work)
        refused([*cmd, "dangling"], capsys, "dangling exists and is not a regular file", work)
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.parametrize("cmd", FILE_OUTPUTS)
def test_a_file_name_ending_in_a_slash_is_refused(cmd, work, capsys):
    """Was: `--perfetto x.json/` wrote the file x.json, and `LINK/` with --force replaced LINK, a link
    to the user's notes."""
    (work / "link").symlink_to("notes.txt")
    refused([*cmd, "x.json/"], capsys, "ends in '/'", work)
    refused([*cmd, "link/", "--force"], capsys, "ends in '/'", work)
    assert not (work / "x.json").exists()


def test_calibrate_force_on_a_link_replaces_the_link_not_its_target(work, capsys, monkeypatch):
    """Was: `calibrate --out LINK --force` wrote through LINK over the user's notes (export and diff
    replace the link itself). The fit is not what this checks: it returns the carried parameters
    (a minute of fitting saved; tests/simulator/test_gemm_calibration.py runs the real one)."""
    import simulator.gemm_fit as gemm_fit
    from simulator.cost import default_params

    monkeypatch.setattr(gemm_fit, "fit_gemm", lambda rows, hardware, fixed=(): default_params(hardware).gemm)
    (work / "cal.json").symlink_to("notes.txt")
    assert main(["calibrate", str(XLA_H100), "--hardware", "h100-sxm", "--out", "cal.json", "--force", "--json"]) == 0
    capsys.readouterr()
    assert (work / "notes.txt").read_text() == "the user's notes\n"
    assert not (work / "cal.json").is_symlink() and '"format"' in (work / "cal.json").read_text()


# ---- huge sparse files read whole ------------------------------------------------------------
def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)  # no blocks on disk: a file of zeros as large as asked


@pytest.mark.parametrize(
    "argv,name,size,needle",
    [
        # was: killed for memory (a 20 GiB file of zeros read whole)
        (
            ["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gemm-calibration", "f"],
            "f",
            (1 << 20) + 1,
            "GEMM calibration f: 1048577 bytes, more than the 1048576",
        ),
        # was: ran for minutes (killed at 60 s) parsing 20 GiB of zeros as CSV
        (
            ["calibrate", "f", "--hardware", "h100-sxm", "--out", "cal.json"],
            "f",
            (256 << 20) + 1,
            "GEMM table f: 268435457 bytes, more than",
        ),
        (
            ["sweep", "t", "--hardware", "h100-sxm", "--workload", "f", "--workers", "1"],
            "f",
            (1 << 30) + 1,
            "workload file f: 1073741825 bytes, more than",
        ),
    ],
)
def test_a_huge_sparse_input_file_is_refused_unread(argv, name, size, needle, work, capsys):
    _sparse(work / name, size)
    refused(argv, capsys, needle, work)


# ---- capture: serving flags and the device -----------------------------------------------------
CAPTURE = ["capture", "--model", "tiny-2l", "--n", "2", "--max-tokens", "4"]


@pytest.mark.parametrize(
    "flags,needle",
    [
        # was: internal error (a bug): OverflowError: timestamp out of range for platform time_t (exit 1),
        # and the output folder left holding meta.json (complete: false) and parts/
        (["--rate", "1e-300"], "--rate must be at least 1e-05 requests/s"),
        # was: internal error (a bug): AssertionError: Torch not compiled with CUDA enabled (exit 1) under load
        (["--concurrency", "1", "--device", "cuda:99"], "--device cuda:99 asked for, but torch sees"),
        # was: internal error (a bug): NotImplementedError (exit 1), after loading the 135M-parameter model
        (["--system", "sot", "--concurrency", "1"], "sot runs one request at a time"),
    ],
)
def test_capture_serving_and_device_flags(flags, needle, work, capsys):
    refused([*CAPTURE, *flags, "--out", "c"], capsys, needle, work)
    assert not (work / "c").exists()


# ---- dashboard: refused before a server starts -------------------------------------------------
@pytest.mark.parametrize(
    "address,needle",
    [
        ("", "--address is empty"),  # was: accepted; streamlit given "" listens on every interface
        ("bogus host", "--address bogus host: not an IP address"),  # was: accepted, streamlit failed to bind
        ("127.0.0.1:8080", "--address 127.0.0.1:8080: not an IP address"),
        ("300.1.1.1", "--address 300.1.1.1: not an IP address"),
    ],
)
def test_dashboard_address_that_cannot_be_served_on(address, needle, work, capsys):
    refused(["dashboard", "t", "--address", address, "--dry-run"], capsys, needle, work)


def test_dashboard_folder_given_twice_and_an_ipv6_url(work, capsys):
    """Was: `dashboard t ./t/` listed every trace twice; `--address ::1` printed http://::1:8501."""
    refused(["dashboard", "t", "./t/", "--dry-run"], capsys, "DIR ./t/ is given twice (as t)", work)
    assert main(["dashboard", "t", "--address", "::1", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["url"] == "http://[::1]:8501"


def test_dashboard_port_in_use_is_refused_before_serving(work, capsys, monkeypatch):
    """Was: 'serving 1 folder(s) at http://127.0.0.1:P' printed, then streamlit's 'Port P is not
    available' and exit 1."""
    import socket

    import solm.commands.dashboard as dashboard

    def not_reached(*a, **kw):
        raise AssertionError("started a server")

    monkeypatch.setattr(dashboard, "serve", not_reached)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused(
            ["dashboard", "t", "--port", str(port)], capsys, f"--port {port}: cannot serve on 127.0.0.1:{port}", work
        )


@pytest.mark.parametrize(
    "flags,needle",
    [
        # was: exit 0, a local Ray started ('--address "$RAY"' with RAY unset)
        (["--backend", "ray", "--address", ""], "--address is empty"),
        # was: exit 0, the grid run on the local process pool, the cluster never asked
        (["--address", "127.0.0.1:1"], "--address names a Ray cluster: give it with --backend ray"),
    ],
)
def test_sweep_address_that_would_be_ignored(flags, needle, work, capsys):
    refused(["sweep", "t", "--hardware", "h100-sxm", "--num-requests", "2", *flags], capsys, needle, work)


def test_dashboard_trace_folder_named_in_other_bytes_is_one_error_row(tmp_path, monkeypatch):
    """Was: a trace or sweep folder whose name is not UTF-8, under a folder given to the dashboard,
    made Streamlit's cache (and the Overview's error frame) raise UnicodeEncodeError: every page
    down, the good trace too."""
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    shutil.copytree(SHIPPED, tmp_path / "good")
    shutil.copytree(SHIPPED, os.fsdecode(os.fsencode(tmp_path) + b"/t\xff"))
    os.mkdir(os.fsencode(tmp_path) + b"/sw\xff")
    Path(os.fsdecode(os.fsencode(tmp_path) + b"/sw\xff/sweep.parquet")).write_bytes(b"not read")
    monkeypatch.setenv("SOLM_TRACE_DIRS", str(tmp_path))
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=60)
    at.run()
    for page in ("overview", "pareto"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        if page == "pareto":
            assert any("sw\\xff/sweep.parquet: the name is not UTF-8" in e.value for e in at.error), at.error
        else:
            table = at.dataframe[0].value
            assert "t\\xff" in set(table["trace"]) and "good" in set(table["trace"]), table


def test_export_refuses_a_trace_given_twice(work, capsys):
    """Was: `export t ./t/` wrote one file holding every request twice (32 of 16, exit 0)."""
    (work / "link").symlink_to("t")
    refused(["export", "t", "./t/", "--perfetto", "x.json"], capsys, "trace ./t/ is given twice (as t)", work)
    refused(["export", "t", "link", "--perfetto", "x.json"], capsys, "trace link is given twice (as t)", work)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["export", "t", "--perfetto", "~/x.json"], "--perfetto ~/x.json exists (pass --force"),
        (["diff", "t", "t", "--html", "~/x.json"], "--html ~/x.json exists (pass --force"),
        (["simulate", "t", "--hardware", "h100-sxm", "--num-requests", "2", "--out", "~/s"], "exists and is not empty"),
        (["sweep", "t", "--hardware", "h100-sxm", "--num-requests", "2", "--out", "~/s"], "exists and is not empty"),
    ],
)
def test_a_quoted_tilde_is_checked_where_it_is_written(argv, needle, work, capsys, monkeypatch):
    """Was: '~/X' (quoted, so the shell left it) was checked as $HOME/X but written to ./~/X: export
    and diff overwrote ./~/x.json without --force, simulate wrote its trace over the user's files in
    ./~/s (exit 0), sweep ran and then failed with its files split between the two folders."""
    monkeypatch.setenv("HOME", str(work / "home"))
    (work / "home").mkdir()
    (work / "~" / "s").mkdir(parents=True)
    (work / "~" / "x.json").write_text("the user's\n")
    (work / "~" / "s" / "meta.json").write_text("the user's own meta.json\n")
    refused(argv, capsys, needle, work)
