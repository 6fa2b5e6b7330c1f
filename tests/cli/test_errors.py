"""The top-level handler tells bad input (exit 2, one line) from a bug (exit 1, one line saying so,
the traceback only with SOLM_DEBUG=1), by the project's own error types, not by KeyError/ValueError."""

from __future__ import annotations

from pathlib import Path

import pytest

import solm.commands.inspect as inspect_cmd
from profiler.errors import KVPoolFull, SolmError, TraceError, UnknownName, UsageError
from profiler.reader import TraceError as ReaderTraceError
from solm.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _fail_with(monkeypatch, exc: BaseException) -> None:
    def run(args):
        raise exc

    monkeypatch.setattr(inspect_cmd, "run", run)


@pytest.mark.parametrize(
    "exc",
    [
        UsageError("--n must be >= 1"),
        TraceError("t: no meta.json"),
        UnknownName("unknown hardware 'z9'"),
        KVPoolFull("pool of 0 bytes"),
    ],
)
def test_own_errors_are_one_line_exit_2(exc, monkeypatch, capsys):
    _fail_with(monkeypatch, exc)
    assert main(["inspect", "x"]) == 2
    err = capsys.readouterr().err
    assert err == f"solm inspect: error: {exc}\n" and not str(exc).startswith("'")


@pytest.mark.parametrize(
    "exc",
    [
        KeyError("slot 3 is not allocated"),
        ValueError("bad shape"),
        MemoryError(),
        RuntimeError("No scheduled events left"),
        TypeError("x"),
    ],
)
def test_other_exceptions_are_bugs_exit_1(exc, monkeypatch, capsys):
    monkeypatch.delenv("SOLM_DEBUG", raising=False)
    _fail_with(monkeypatch, exc)
    assert main(["inspect", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"solm inspect: internal error (a bug): {type(exc).__name__}")
    assert "SOLM_DEBUG=1" in err and "Traceback" not in err and err.count("\n") == 1


def test_debug_prints_the_traceback(monkeypatch, capsys):
    monkeypatch.setenv("SOLM_DEBUG", "1")
    _fail_with(monkeypatch, KeyError("slot 3 is not allocated"))
    assert main(["inspect", "x"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "internal error (a bug): KeyError" in err


def test_path_errors_on_user_paths_are_usage_errors(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "out"
    _fail_with(monkeypatch, PermissionError(13, "Permission denied", str(mine / "meta.json")))
    assert main(["inspect", str(mine)]) == 2
    assert "error: " in capsys.readouterr().err
    # the same error on a file the user never named is a bug
    _fail_with(monkeypatch, PermissionError(13, "Permission denied", "/etc/solm-internal"))
    assert main(["inspect", str(mine)]) == 1


def test_error_types():
    assert issubclass(UsageError, ValueError) and issubclass(UsageError, SolmError)
    assert ReaderTraceError is TraceError and issubclass(TraceError, SolmError)
    assert not issubclass(KVPoolFull, MemoryError)
    assert str(UnknownName("unknown model 'x'")) == "unknown model 'x'"  # not quoted like a KeyError
    assert isinstance(UnknownName("x"), KeyError)


def test_shorten_words_keeps_a_short_line_and_cuts_only_the_runaway_word():
    from profiler.errors import shorten_words

    short = "unknown router 'zz'; valid names: kv_aware, least_outstanding, round_robin"
    assert shorten_words(short) == short
    value = "'" + "x" * 5000 + "'"
    line = shorten_words(f"unknown router {value}; valid names: kv_aware, least_outstanding, round_robin")
    assert line.startswith("unknown router '" + "x" * 29 + "...")
    assert "(5003 characters) valid names: kv_aware, least_outstanding, round_robin" in line
    assert len(line) < 200
    # a line of many short words past `most` is cut there
    many = " ".join(["word"] * 600)
    assert len(shorten_words(many)) < 1100 and shorten_words(many).endswith(f"({len(many)} characters)")


@pytest.mark.parametrize(
    "exc",
    [
        UnknownName("unknown router '" + "r" * 4000 + "'; valid names: kv_aware, round_robin"),
        FileNotFoundError(2, "No such file or directory", "/tmp/" + "p" * 3000),
        KeyError("slot " + "9" * 4000 + " is not allocated"),
    ],
)
def test_a_value_of_thousands_of_characters_is_not_echoed_whole(exc, monkeypatch, capsys):
    """Every error line (bad input and bug alike) names a runaway value by its head, tail and length
    (was: `solm simulate --router <3,000 characters>` echoed all of them, one 3,094-character line)."""
    _fail_with(monkeypatch, exc)
    code = main(["inspect", "x" if not isinstance(exc, FileNotFoundError) else exc.filename])
    err = capsys.readouterr().err
    assert code in (1, 2) and err.count("\n") == 1 and len(err) < 300, err
    assert "characters)" in err


def test_long_router_value_end_to_end(capsys):
    assert (
        main(["simulate", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--replicas", "2", "--router", "q" * 3000])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("solm simulate: error: unknown router 'qqq") and len(err) < 300
    assert "valid names: kv_aware, least_outstanding, round_robin" in err


def test_inspect_validate_json_names_a_long_path_in_one_short_line(tmp_path, capsys):
    """`inspect --validate --json` on a damaged trace under a 3,000-character path: exit 2, the
    problems in the JSON line, and the stderr line shortened like every other error line."""
    import json
    import shutil

    import pandas as pd

    deep = tmp_path
    for i in range(15):
        deep = deep / (f"{i:02d}" + "d" * 198)
    shutil.copytree(ROOT / "traces" / "sequential-reverse_words", deep / "t")
    requests = pd.read_parquet(deep / "t" / "requests.parquet")
    requests.loc[0, "ttft_s"] = -1.0  # a problem the validator names, not the reader
    requests.to_parquet(deep / "t" / "requests.parquet", index=False)
    assert len(str(deep / "t")) > 3000
    assert main(["inspect", str(deep / "t"), "--validate", "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1])["problems"]
    (line,) = err.strip().splitlines()
    assert line.startswith("solm inspect: error: ") and "not a valid trace" in line and len(line) < 400
