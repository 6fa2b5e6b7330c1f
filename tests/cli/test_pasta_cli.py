"""`solm capture --system pasta` with its defaults (the shipped model, word_facts) writes a valid
trace whose summary carries the theoretical speedup and the quality."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from tests.cli import solm


def test_capture_pasta_defaults_then_inspect(tmp_path):
    out = tmp_path / "pasta"
    r = solm("capture", "--system", "pasta", "--n", "3", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    r = solm("inspect", str(out), "--json", "--validate")
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["valid"] is True and s["requests"] == 3 and s["system"] == "pasta"
    assert s["theoretical_speedup_geomean"] > 1.0 and s["quality_mean"] is not None
    graphs = json.loads((out / "graph.json").read_text())
    assert any(n["kind"] == "async" for g in graphs.values() for n in g["nodes"])
    toks = pq.read_table(out / "tokens.parquet").to_pandas()
    assert {"tag", "content"} <= set(toks["kind"]) and toks["stream"].max() >= 1
    steps = pq.read_table(out / "steps.parquet").to_pandas()
    assert steps["active_streams"].max() >= 2


def test_capture_pasta_knobs_and_bad_knob(tmp_path):
    r = solm(
        "capture",
        "--system",
        "pasta",
        "--model",
        "tiny-2l",
        "--n",
        "1",
        "--max-tokens",
        "8",
        "--knob",
        "max_threads=2",
        "--knob",
        "max_chunk_tokens=16",
        "--out",
        str(tmp_path / "a"),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    r = solm(
        "capture",
        "--system",
        "pasta",
        "--model",
        "tiny-2l",
        "--n",
        "1",
        "--knob",
        "max_threads=0",
        "--out",
        str(tmp_path / "b"),
    )
    assert r.returncode == 2 and "max_threads" in r.stderr and "Traceback" not in r.stderr


def test_train_prints_the_preference_stage_statistics():
    """`solm train`'s JSON line carries what a preference stage records in config.json (docs/pasta.md
    quotes its pairs and chosen structures); an SFT stage's has no such key."""
    from solm.commands.train import result_line

    root = Path(__file__).resolve().parents[2] / "checkpoints"
    quality = json.loads((root / "pasta-quality" / "config.json").read_text())["info"]
    line = result_line("pasta", "out", quality)
    assert line["preference"] == quality["preference"] and line["heldout_quality"] == quality["heldout_quality"]
    assert line["preference"]["pairs"] == sum(line["preference"]["chosen_structures"].values())
    sft = json.loads((root / "pasta-sft" / "config.json").read_text())["info"]
    assert "preference" not in result_line("pasta", "out", sft)
