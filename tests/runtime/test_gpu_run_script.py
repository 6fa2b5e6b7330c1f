"""bench/gpu_run.sh's `shapes` step, the one prepared GPU experiment, run on the CPU with two
variants: each served load and each rows sweep runs under its own attention strategy (SOLM_SDPA
reaches both, and both record it), and pass_shapes compares the loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_shapes_step_serves_and_sweeps_each_variant_under_its_strategy(tmp_path):
    out = tmp_path / "run"
    env = {
        **os.environ,
        "PY": sys.executable,
        "DEVICE": "cpu",
        "ARCH": "tiny-llama",
        "STEPS": "shapes",
        "SHAPES_VARIANTS": "auto,bucket",
        "SERVE_N": "4",
        "MAX_TOKENS": "4",
        "SERVE_KV_MIB": "8",
        "SWEEP_REPS": "1",
        "VALIDATE": "0",
        "OUT": str(out),
    }
    r = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_run.sh")], env=env, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["ok"] is True
    for variant in ("auto", "bucket"):
        sweep = json.loads((out / f"sweep-{variant}.log").read_text().strip().splitlines()[-1])
        assert sweep["sdpa"] == variant and len(sweep["sweep"]) == 50 and len(sweep["profiles"]) == 2
        meta = json.loads((out / "shapes-tiny-llama" / variant / "meta.json").read_text())
        assert meta["device"]["sdpa"] == variant and meta["complete"]
    compare = json.loads((out / "shapes-compare.log").read_text().strip().splitlines()[-1])
    assert [f["sdpa"] for f in compare["traces"].values()] == ["auto", "bucket"]
