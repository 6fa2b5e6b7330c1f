"""bench/flag_fuzz.py: its flags come from solm's own parser, its base invocations are valid, and
its classifier tells a clean refusal from a bug, a second line, a runaway line and a hang."""

from __future__ import annotations

import subprocess

from tests.benches import load_bench

fuzz = load_bench("flag_fuzz")


def _proc(code: int, err: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], code, "", err)


def test_the_flags_are_solms_own_and_train_only_when_asked():
    cases = fuzz.flag_cases()
    assert ("simulate", "--router") in cases and ("cost", "--tp") in cases and ("capture", "--rate") in cases
    assert all(command != "train" for command, _ in cases) and all(flag.startswith("--") for _, flag in cases)
    assert ("train", "--steps") in fuzz.flag_cases(["train"])
    assert ("simulate", "--chunked-prefill") not in cases  # a switch takes no value


def test_a_fuzzed_flag_replaces_the_base_value_and_out_is_the_cases_own(tmp_path):
    argv = fuzz.argv_of("simulate", "--num-requests", "nan", tmp_path)
    assert argv.count("--num-requests") == 1 and argv[-2:] == ["--num-requests", "nan"]
    assert fuzz.argv_of("sweep", "--seed", "1", tmp_path)[fuzz.BASE["sweep"].index("OUT") + 1] == str(tmp_path / "out")


def test_the_classifier():
    assert fuzz.classify("cost", _proc(0, "")) == "ok"
    assert fuzz.classify("cost", _proc(2, "solm cost: error: --tp must be >= 1\n")) == "ok"
    assert fuzz.classify("cost", _proc(1, "solm cost: internal error (a bug): KeyError\n")) == "bug"
    assert fuzz.classify("cost", _proc(2, "Traceback (most recent call last):\n")) == "bug"
    assert fuzz.classify("cost", _proc(2, "solm cost: error: a\nmore\n")) == "multi_line"
    assert fuzz.classify("cost", _proc(2, "usage: solm cost\n")) == "multi_line"
    assert fuzz.classify("cost", _proc(2, "solm cost: error: " + "x" * 500 + "\n")) == "long_line"
    assert fuzz.classify("cost", None) == "hang"


def test_a_real_case_end_to_end():
    outcome, last = fuzz.run_case("cost", "--tp", "v" * 3000, 120)
    assert outcome == "ok" and last.startswith("solm cost: error: --tp") and "(3002 characters)" in last
