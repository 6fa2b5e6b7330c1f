"""`capture --repeats N`: every request is committed after its first run and refined as rounds
finish; arrivals come from one timeline; every run's timings are kept (runs.parquet)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from profiler.reader import read_trace
from profiler.recorder import Recorder
from profiler.runs import read_runs, single_run
from profiler.validate import validate as trace_problems
from runtime.capture import CaptureConfig, capture

CFG = {"system": "sequential", "model": "tiny-2l", "n": 3, "max_tokens": 8, "page_size": 4}


def _assert_one_timeline(t) -> None:
    req = t.requests.sort_values("request_id")
    arrivals = req["arrival_s"].to_numpy()
    ends = arrivals + req["e2e_s"].to_numpy()
    assert (arrivals >= 0).all() and (np.diff(arrivals) > 0).all()
    assert (arrivals[1:] >= ends[:-1] - 1e-12).all()  # one request at a time, none before the last ended
    for _, r in req.iterrows():  # a request's passes lie inside its own run
        s = t.steps[t.steps["request_id"] == r["request_id"]]
        assert s["start_s"].min() >= r["arrival_s"] - 1e-12
        assert (s["start_s"] + s["duration_s"]).max() <= r["arrival_s"] + r["e2e_s"] + 1e-9
    batches = t.steps.sort_values(["request_id", "step_index"])["batch_index"].to_numpy()
    assert (batches == np.arange(len(batches))).all()


def test_repeats_lay_recorded_runs_on_one_timeline_and_keep_every_run(tmp_path):
    out = capture(CaptureConfig(**CFG, repeats=3), tmp_path / "rep", progress=False)
    t = read_trace(out)
    assert t.complete and sorted(t.requests["request_id"]) == [0, 1, 2]
    _assert_one_timeline(t)
    assert not trace_problems(out)
    runs = read_runs(out)
    per = runs.groupby(["request_id", "run"])
    assert len(per) == 9 and set(runs["run"]) == {0, 1, 2}
    kept = runs[runs["recorded"]].groupby("request_id")["e2e_s"].first()
    fastest = runs.groupby("request_id")["e2e_s"].min()
    pd.testing.assert_series_equal(kept, fastest)  # --keep min: the recorded run is the fastest
    req = t.requests.set_index("request_id").sort_index()
    assert np.allclose(req["e2e_s"], kept.sort_index())  # the tables hold it, moved but not stretched
    assert runs["same_output"].all() and t.meta["repeats"]["diverged_runs"] == 0
    view, info = single_run(t, run=0)  # the trace as a --repeats 1 capture would have recorded it
    first = runs[runs["run"] == 0].groupby("request_id")["e2e_s"].first()
    assert info == {"run": 0, "requests": 3, "left_out": 0}
    assert np.allclose(view.requests.set_index("request_id").sort_index()["e2e_s"], first.sort_index())
    assert (
        view.requests["e2e_s"] >= req["e2e_s"].to_numpy() - 1e-12
    ).all()  # the first run is never faster than the fastest
    assert len(view.steps) == len(t.steps)
    from simulator.validation import (
        validate,  # the view validates as a trace (bench/simulator.py's first-run figure)
    )

    assert validate(view)["check_requests"] == 1 and validate(t)["check_requests"] == 1


def test_capture_cut_short_after_round_one_keeps_every_request(tmp_path, monkeypatch):
    real_run, calls = Recorder.run, []

    def run_then_die(self, steps):
        calls.append(1)
        if len(calls) == 5:  # round 1 (the second), request 1
            raise KeyboardInterrupt
        return real_run(self, steps)

    monkeypatch.setattr(Recorder, "run", run_then_die)
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        capture(CaptureConfig(**CFG, repeats=3), out, progress=False)
    t = read_trace(out)
    assert not t.complete and sorted(t.requests["request_id"]) == [0, 1, 2]
    _assert_one_timeline(t)
    runs = read_runs(out)  # round 0 whole and request 0 of round 1
    assert sorted(map(tuple, runs[["request_id", "run"]].drop_duplicates().to_numpy())) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (2, 0),
    ]


def test_repeats_one_is_the_measured_timeline(tmp_path):
    out = capture(CaptureConfig(**CFG, repeats=1), tmp_path / "one", progress=False)
    t = read_trace(out)
    _assert_one_timeline(t)
    assert read_runs(out) is None and "repeats" not in t.meta
    with pytest.raises(ValueError, match="no runs.parquet"):
        single_run(t)


def test_reader_takes_a_refined_requests_newest_generation(tmp_path):
    """Cut short between committing a refined request and removing its older generation: the
    reader sees one request, the newest."""
    from profiler.writer import TraceWriter

    w = TraceWriter(tmp_path / "t", {"kind": "measured", "system": "x", "model": {}, "device": {}, "created_at": "now"})
    t0 = read_trace(capture(CaptureConfig(**{**CFG, "n": 1}), tmp_path / "src", progress=False))
    row = t0.requests.iloc[0].to_dict()
    steps, toks = t0.steps.to_dict("records"), t0.tokens.to_dict("records")
    w.add_request(row, steps, toks, t0.graphs[0])
    w.add_request({**row, "e2e_s": 123.0}, steps, toks, t0.graphs[0], replace=True)
    parts = tmp_path / "t" / "parts"
    assert sorted(p.name for p in parts.glob("request-*")) == ["request-00000000.g1.parquet"]
    (parts / "request-00000000.parquet").write_bytes((parts / "request-00000000.g1.parquet").read_bytes())
    t = read_trace(tmp_path / "t")
    assert len(t.requests) == 1 and t.requests["e2e_s"].iloc[0] == 123.0
    with pytest.raises(ValueError, match="already written"):
        w.add_request(row, steps, toks, t0.graphs[0])


def test_validate_run_zero_on_the_command_line(tmp_path):
    """`solm validate T --run 0`: the same figures on the first round alone; a trace without every
    run's timings is one clear error line, exit 2."""
    import json

    from tests.cli import solm

    rep = capture(CaptureConfig(**CFG, repeats=2), tmp_path / "rep", progress=False)
    one = capture(CaptureConfig(**CFG), tmp_path / "one", progress=False)
    r = solm("validate", str(rep), "--run", "0")
    assert r.returncode == 0, r.stderr
    assert "run 0 alone: 3 requests" in r.stdout and json.loads(r.stdout.splitlines()[-1])["run"] == 0
    bad = solm("validate", str(one), "--run", "0")
    assert bad.returncode == 2 and "no runs.parquet" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
