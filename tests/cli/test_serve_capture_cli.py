"""`solm capture` under load: a serving trace that reads back with its new columns; bad load
settings are one line and exit 2."""

from __future__ import annotations

import json

import pytest

from profiler.reader import read_trace
from profiler.schema import SCHEMA_MINOR
from profiler.validate import validate
from tests.cli import solm


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--rate", "-1"], "--rate must be at least"),
        (["--rate", "nan"], "--rate must be at least"),
        (["--concurrency", "0"], "--concurrency must be >= 1"),
        (["--rate", "2", "--concurrency", "2"], "exactly one of --rate and --concurrency"),
        (["--rate", "5", "--kv-budget-mib", "0.000001"], "smaller than one page"),
        (["--rate", "5", "--kv-budget-mib", "0"], "--kv-budget-mib must be > 0"),
        (["--concurrency", "2", "--scheduler", "lifo"], "lifo"),
        (["--rows-sweep"], "--rows-sweep times the serving runtime's forward"),
    ],
)
def test_bad_load_settings_are_one_line_exit_2(tmp_path, flags, message):
    r = solm("capture", "--system", "sequential", "--n", "2", "--max-tokens", "4", *flags, "--out", str(tmp_path / "t"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("solm capture: error:") and message in lines[0]
    assert not (tmp_path / "t").exists()


def test_closed_loop_capture_writes_a_serving_trace(tmp_path):
    out = tmp_path / "t"
    r = solm(
        "capture",
        "--system",
        "sequential",
        "--n",
        "4",
        "--max-tokens",
        "8",
        "--concurrency",
        "3",
        "--page-size",
        "4",
        "--kv-budget-mib",
        "0.5",
        "--warmup",
        "0",
        "--out",
        str(out),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout.strip().splitlines()[-1])
    tr = read_trace(out)
    assert tr.meta["schema_minor"] == SCHEMA_MINOR and tr.meta["serving"]["concurrency"] == 3
    steps = tr.steps.to_pandas() if hasattr(tr.steps, "to_pandas") else tr.steps
    reqs = tr.requests.to_pandas() if hasattr(tr.requests, "to_pandas") else tr.requests
    assert len(reqs) == 4 and (reqs["status"] != "error").all()
    assert steps["batch_requests"].max() >= 2  # passes carried several requests
    per_pass = steps.groupby("batch_index").agg(
        n=("request_id", "size"),
        b=("batch_requests", "first"),
        q=("query_tokens", "sum"),
        bq=("batch_query_tokens", "first"),
    )
    assert (per_pass["n"] == per_pass["b"]).all() and (per_pass["q"] == per_pass["bq"]).all()
    assert (reqs["queue_s"] >= 0).all() and (reqs["ttft_s"] >= reqs["queue_s"]).all()
    assert (steps.loc[~steps["chunk"], "host_s"] > 0).all()  # each request's own host work in the pass
    # the forward alone (minor 3): the same on every row of a pass, inside the pass's duration
    assert (steps.groupby("batch_index")["forward_s"].nunique() == 1).all()
    assert ((steps["forward_s"] > 0) & (steps["forward_s"] <= steps["duration_s"])).all()


def test_rate_inf_is_a_burst(tmp_path):
    """`--rate inf` (as vLLM's benchmark): every request arrives at 0, the meta says so, and the
    JSON meta stays standard (no Infinity)."""
    out = tmp_path / "t"
    r = solm(
        "capture", "--system", "sequential", "--n", "3", "--max-tokens", "4", "--rate", "inf",
        "--warmup", "0", "--out", str(out), "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    tr = read_trace(out)
    reqs = tr.requests.to_pandas() if hasattr(tr.requests, "to_pandas") else tr.requests
    assert len(reqs) == 3 and (reqs["arrival_s"] == reqs["arrival_s"].min()).all()
    raw = (out / "meta.json").read_text()
    assert "Infinity" not in raw and json.loads(raw)["serving"]["arrivals"].startswith("all at once")


def test_rows_sweep_is_kept_in_the_meta(tmp_path):
    """`--rows-sweep`: the forward timed over rows x pool sizes after serving, in meta.json, what
    `solm validate --calibrate-from` fits beside the passes."""
    from runtime.rows_sweep import ROWS, SLOTS
    from simulator.load_calibration import sweep_passes

    out = tmp_path / "t"
    r = solm(
        "capture", "--system", "sequential", "--n", "2", "--max-tokens", "4", "--concurrency", "1",
        "--rows-sweep", "--warmup", "0", "--out", str(out), "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    sweep = read_trace(out).meta["rows_sweep"]
    assert sweep["attention"] == "mask" and len(sweep["passes"]) == len(ROWS) * len(SLOTS)
    assert all(p["keys"] == p["rows"] * p["slots"] and p["duration_s"] > 0 for p in sweep["passes"])
    assert sweep_passes(read_trace(out).meta).shape == (len(ROWS) * len(SLOTS), 4)


def test_chunked_load_capture_with_the_task_default_max_tokens(tmp_path):
    """No --max-tokens (the task's default, as one-at-a-time capture) and prefill chunks of 8 tokens:
    the run completes, its chunk rows are recorded, and every request's answer is whole."""
    out = tmp_path / "t"
    r = solm(
        "capture",
        "--system",
        "sequential",
        "--n",
        "3",
        "--concurrency",
        "2",
        "--chunked-prefill",
        "--max-batch-tokens",
        "8",
        "--out",
        str(out),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    t = read_trace(out)
    assert len(t.requests) == 3 and (t.requests["status"] == "ok").all()
    assert t.steps["chunk"].any() and (t.steps.loc[t.steps["chunk"], "query_tokens"] <= 8).all()
    # was: its chunk rows (step_index -1, live KV -1) made it invalid, so inspect, simulate and validate refused it
    assert validate(out) == []
    assert json.loads(r.stdout.strip().splitlines()[-1])["quality_mean"] == 1.0


@pytest.mark.parametrize("where", ["step", "_after_pass"])
def test_serving_capture_cut_short_keeps_the_requests_that_ended(tmp_path, monkeypatch, where):
    """Was: a serving capture wrote its requests when serving ended, so Ctrl-C kept none (a folder
    every reader refused). Now the cut writes the requests that ended before it: an incomplete trace
    of exactly those, valid, with all their passes. `_after_pass`: the cut falls after a pass's
    requests finished but before the pass was recorded; those requests are left out, not kept short."""
    from runtime.capture import CaptureConfig
    from runtime.serve_capture import LoadConfig, capture_load
    from runtime.server import Server

    original, calls = getattr(Server, where), []

    def then_interrupt(self, *args):
        calls.append(1)
        if where == "step":
            if len(calls) > 40:  # Ctrl-C in the middle of serving, between passes
                raise KeyboardInterrupt
            return original(self, *args)
        ended = len(self.finished)
        out = original(self, *args)
        if len(calls) > 20 and len(self.finished) > ended:  # a request just finished in this pass
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(Server, where, then_interrupt)
    cfg = CaptureConfig(system="sequential", n=12, max_tokens=8, warmup=0)
    with pytest.raises(KeyboardInterrupt):
        capture_load(cfg, LoadConfig(concurrency=2, kv_budget_mib=0.5), tmp_path / "t")
    t = read_trace(tmp_path / "t")
    assert not t.meta["complete"] and 0 < len(t.requests) < 12
    assert validate(tmp_path / "t") == []
    rows = t.requests["request_id"].map(t.steps.groupby("request_id").size())
    assert (t.requests["output_tokens"] > 0).all() and (t.requests["steps"] == rows).all()
