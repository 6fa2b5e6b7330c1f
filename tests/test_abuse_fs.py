"""File-system oddities, serving flags and the environment, given to the real command line: odd
names (a newline, bytes that are not UTF-8), links standing for an output file, huge sparse inputs,
a deleted working directory, the dashboard's address and port. Each case here ended in a
traceback (exit 1), a hang, a crash of the machine's memory, a second stderr line or a file replaced
that the command was not told to replace (each case names what it did before); now each is one
line `solm <command>: error: ...`, exit 2, and the user's folder is as it was."""

from __future__ import annotations

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
