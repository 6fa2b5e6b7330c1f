"""`solm capture --system tip` with its defaults (the shipped tip-tiny checkpoint) writes a valid
trace whose summary carries the KV figures; a bad policy knob is one clear error line."""

from __future__ import annotations

import json

import pytest

from runtime.checkpoint import CHECKPOINTS_DIR
from tests.cli import solm

pytestmark = pytest.mark.skipif(not (CHECKPOINTS_DIR / "tip-tiny").is_dir(), reason="checkpoints/tip-tiny not shipped")


def test_capture_tip_defaults_then_inspect(tmp_path):
    out = tmp_path / "tip"
    r = solm("capture", "--system", "tip", "--n", "3", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    r = solm("inspect", str(out), "--json", "--validate")
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["valid"] is True and s["requests"] == 3 and s["system"] == "tip" and s["task"] == "var_tracking"
    assert s["peak_kv_tokens"] > 0 and 0 < s["mean_live_kv_tokens"] < s["peak_kv_tokens"]
    assert s["quality_mean"] is not None


def test_capture_tip_baseline_knobs(tmp_path):
    out = tmp_path / "h2o"
    r = solm(
        "capture",
        "--system",
        "tip",
        "--n",
        "1",
        "--max-tokens",
        "24",
        "--knob",
        "policy=h2o",
        "--knob",
        "budget_tokens=16",
        "--out",
        str(out),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["peak_kv_tokens"] <= 16
    r = solm("capture", "--system", "tip", "--n", "1", "--knob", "policy=h2o", "--out", str(tmp_path / "bad"))
    assert r.returncode == 2 and "needs a KV budget" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
