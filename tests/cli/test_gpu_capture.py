"""`bench/gpu_capture.py` end to end on CPU with the tiny Llama architecture: one valid trace per
engine under one folder, a top-level meta.json that describes the device (NVML absent, and why),
quality NaN for random weights; structure replayed from the shipped tiny models; bad input is one clear line and a non-zero exit."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install 'solm[hf]')")

from profiler.reader import read_trace  # noqa: E402
from profiler.validate import validate  # noqa: E402
from tests.benches import load_bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_capture.py"


def _load():
    return load_bench("gpu_capture")


def test_gpu_capture_tiny_arch_on_cpu(tmp_path, capsys):
    out = tmp_path / "cap"
    rc = _load().main(
        [
            "--device",
            "cpu",
            "--arch",
            "tiny-llama",
            "--n",
            "1",
            "--max-tokens",
            "6",
            "--page-size",
            "4",
            "--out",
            str(out),
        ]
    )
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and last["bench"] == "gpu_capture" and last["failed"] == []
    meta = json.loads((out / "meta.json").read_text())
    assert meta["kind"] == "gpu_capture" and meta["model_spec"] == "arch:tiny-llama"
    assert meta["device"]["type"] == "cpu" and meta["device"]["nvml"] is False and meta["device"]["nvml_reason"]
    assert meta["quality_applicable"] is False and meta["model"]["trained"] is False
    from simulator.models import ModelSpec

    spec = ModelSpec.from_trace_meta(meta["model"])  # the simulator reads the real architecture back
    assert spec.n_layers == 2 and meta["model"]["head_dim"] == 16 and meta["model"]["tied_embeddings"] is False
    assert "sequential" in last["ok"]
    for system in last["ok"]:
        assert validate(out / system) == [], system
        t = read_trace(out / system)
        assert t.meta["system"] == system and t.meta["nvml"] is False and t.meta["quality_applicable"] is False
        assert len(t.requests) == 1 and all(math.isnan(q) for q in t.requests["quality_score"])
        assert len(t.steps) >= 1 and (t.steps["duration_s"] > 0).all()
        ref = out / "reference" / system  # structure replayed from the shipped tiny model's capture
        if t.meta["structure_source"] != "the model's own tokens":
            r = read_trace(ref)
            assert t.tokens["stream"].tolist() == r.tokens["stream"].tolist()
            assert t.steps["live_kv_tokens"].tolist() == r.steps["live_kv_tokens"].tolist()


def test_gpu_capture_own_structure(tmp_path, capsys):
    out = tmp_path / "own"
    rc = _load().main(
        [
            "--device",
            "cpu",
            "--arch",
            "tiny-qwen2",
            "--n",
            "1",
            "--max-tokens",
            "4",
            "--systems",
            "sequential,nope",
            "--structure-from",
            "none",
            "--out",
            str(out),
        ]
    )
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    meta = json.loads((out / "meta.json").read_text())
    assert rc == 0 and last["ok"] == ["sequential"] and meta["systems"]["nope"]["status"] == "skipped"
    assert read_trace(out / "sequential").meta["structure_source"] == "the model's own tokens"


def test_gpu_capture_bad_input_is_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--arch", "nope-1b", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2 and "unknown architecture" in r.stderr and "Traceback" not in r.stderr
