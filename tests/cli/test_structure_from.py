"""`solm capture --structure-from TRACE`: an untrained model replays a shipped trace's structure
(same streams, chunk lengths, evictions), quality is marked not applicable, and a trace of another
system or a missing one is one clear error line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from profiler.reader import read_trace
from profiler.validate import validate
from tests.cli import solm

TRACES = Path(__file__).resolve().parents[2] / "traces"


@pytest.mark.parametrize("system,trace", [("pasta", "pasta-word_facts"), ("tip", "tip-var_tracking")])
def test_capture_replays_structure(tmp_path, system, trace):
    out = tmp_path / system
    r = solm(
        "capture",
        "--system",
        system,
        "--model",
        "tiny-2l",
        "--n",
        "2",
        "--structure-from",
        str(TRACES / trace),
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert "quality n/a" in r.stdout
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["quality_mean"] is None and s["requests"] == 2  # tiny-2l alone would be scored
    assert validate(out) == []
    t, ref = read_trace(out), read_trace(TRACES / trace)
    assert t.meta["quality_applicable"] is False and t.meta["structure_source"] == str(TRACES / trace)
    assert t.meta["task"] == ref.meta["task"] and t.meta["model"]["trained"] is False
    assert all(math.isnan(q) for q in t.requests["quality_score"])
    for rid in (0, 1):  # the reference's streams, token for token, and its KV story
        a, b = t.tokens[t.tokens.request_id == rid], ref.tokens[ref.tokens.request_id == rid]
        assert a["stream"].tolist() == b["stream"].tolist() and a["token_id"].tolist() == b["token_id"].tolist()
        sa, sb = t.steps[t.steps.request_id == rid], ref.steps[ref.steps.request_id == rid]
        assert sa["live_kv_tokens"].tolist() == sb["live_kv_tokens"].tolist()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--system", "tip", "--structure-from", str(TRACES / "pasta-word_facts")], "holds a 'pasta' trace"),
        (["--system", "pasta", "--structure-from", "/nonexistent/trace"], "/nonexistent/trace"),
        (["--system", "skeleton", "--structure-from", str(TRACES / "pasta-word_facts")], "supports"),
    ],
)
def test_structure_from_bad_input(tmp_path, args, needle):
    r = solm("capture", *args, "--model", "tiny-2l", "--n", "1", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
