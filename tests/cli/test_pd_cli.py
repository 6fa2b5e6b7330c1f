"""`solm capture --system planned_diffusion` / `masked_diffusion` write valid traces that `solm inspect` reads."""

from __future__ import annotations

import json

from tests.cli import solm

PLAN = "<promise>-<topic>a 1</topic><promise>-<topic>b 2</topic><sync/>ok<eos>"


def test_capture_planned_diffusion_then_inspect(tmp_path):
    out = tmp_path / "pd"
    r = solm(
        "capture",
        "--system",
        "planned_diffusion",
        "--model",
        "tiny-2l",
        "--task",
        "reverse_words",
        "--n",
        "2",
        "--max-tokens",
        "48",
        "--knob",
        f"forced_plan={PLAN}",
        "--knob",
        "length_scale=4",
        "--knob",
        "confidence_threshold=null",
        "--out",
        str(out),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    r = solm("inspect", str(out), "--json", "--validate")
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["requests"] == 2 and s["quality_mean"] is not None and s["valid"] is True
    assert s["e2e_s_p50"] > 0 and s["ttft_s_p50"] > 0

    import pandas as pd

    steps = pd.read_parquet(out / "steps.parquet")
    tokens = pd.read_parquet(out / "tokens.parquet")
    assert set(steps["phase"]) == {"prefill", "plan", "denoise", "sync"}
    notes = [json.loads(n) for n in steps[steps["phase"] == "denoise"]["note"]]
    assert notes[0]["masks_left"] == {"1": 3, "2": 7}
    assert set(tokens["stream"]) == {0, 1, 2} and {"plan", "tag"} <= set(tokens["kind"])
    req = pd.read_parquet(out / "requests.parquet")
    events = json.loads(req["events"][0])
    assert any(e["event"] == "round" and e["span_lengths"] == [4, 8] for e in events)


def test_capture_masked_diffusion_and_bad_knob(tmp_path):
    r = solm(
        "capture",
        "--system",
        "masked_diffusion",
        "--model",
        "tiny-2l",
        "--task",
        "reverse_words",
        "--n",
        "1",
        "--knob",
        "length=8",
        "--knob",
        "steps=4",
        "--out",
        str(tmp_path / "m"),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["steps"] == 4
    r = solm(
        "capture",
        "--system",
        "planned_diffusion",
        "--model",
        "tiny-2l",
        "--knob",
        "order=sideways",
        "--out",
        str(tmp_path / "bad"),
    )
    assert r.returncode == 2 and "order" in r.stderr and "Traceback" not in r.stderr
