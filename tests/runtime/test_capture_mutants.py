"""runtime/capture.py against docs/trace-format.md, from a mutation round: warm-up runs stay out of
the trace, the request row's times are measured from arrival, the settings given are in meta.json,
the recorded run of `--repeats`/`--keep` and its place on the one timeline, and a capture never
writes over a folder it was not told to replace."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import numpy as np
import pytest

import runtime.capture as cap
from profiler.errors import UsageError
from profiler.reader import read_trace
from profiler.recorder import RecordedRun, Recorder
from profiler.runs import read_runs
from runtime.capture import CaptureConfig, Rounds, capture, check_config
from runtime.tasks import get_task

CFG = {"system": "sequential", "model": "tiny-2l", "n": 2, "max_tokens": 6, "page_size": 4}
HOST_S = 0.02  # host work slipped in between a request's arrival and its first pass


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """One capture with two warm-up runs and non-default settings; every start of a request is
    logged (request id, prompt) and delayed by HOST_S after the request arrived."""
    real = cap.make_start
    started: list[tuple[int, str]] = []

    def make_start(*a, **k):
        start = real(*a, **k)

        def slow(rid, ex, script):
            started.append((rid, ex.prompt))
            time.sleep(HOST_S)
            return start(rid, ex, script)

        return slow

    # one background sample at the start (a long interval): the last one is the sample taken at the end
    cfg = CaptureConfig(**CFG, warmup=2, seed=5, temperature=0.7, top_p=0.9, counters_interval_s=60.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cap, "make_start", make_start)
        out = capture(cfg, tmp_path_factory.mktemp("cap") / "t", progress=False)
    return read_trace(out), started, cfg


def test_warmup_runs_are_untimed_and_stay_out_of_the_trace(traced):
    t, started, cfg = traced
    task = get_task(t.meta["task"])
    held_out = [ex.prompt for ex in task.examples("test", cfg.n, cfg.seed)]
    warm = [p for rid, p in started if rid < 0]
    assert len(warm) == 2 and not set(warm) & set(held_out)  # warmed up, not on the held-out prompts
    assert [p for rid, p in started if rid >= 0] == held_out  # each recorded request ran once
    assert sorted(t.requests["request_id"]) == [0, 1] and set(t.steps["request_id"]) == {0, 1}
    assert t.meta["warmup_requests"] == 2 and t.meta["runs_per_request"] == 1


def test_meta_records_the_settings_given(traced):
    t, _, cfg = traced
    assert t.meta["knobs"] == {"max_tokens": 6, "temperature": 0.7, "top_p": 0.9, "page_size": 4}
    assert (t.meta["seed"], t.meta["split"], t.meta["system"]) == (5, "test", "sequential")
    assert t.meta["structure_source"] == "the model's own tokens"
    assert t.meta["counters_source"] == "host" and t.meta["nvml"] is False  # a CPU capture samples the host
    assert t.meta["wall_s"] > 0 and t.meta["n_requests"] == 2
    last_end = (t.requests["arrival_s"] + t.requests["e2e_s"]).max()
    assert t.counters["t_s"].max() >= last_end  # the samples up to the end of the capture are written


def test_request_rows_hold_the_prompt_its_reference_and_times_from_arrival(traced):
    t, _, cfg = traced
    task = get_task(t.meta["task"])
    examples = task.examples("test", cfg.n, cfg.seed)
    req = t.requests.sort_values("request_id").reset_index(drop=True)
    assert list(req["prompt"]) == [ex.prompt for ex in examples]
    assert list(req["reference"]) == [ex.answer for ex in examples]
    for _, r in req.iterrows():
        s = t.steps[t.steps["request_id"] == r["request_id"]].sort_values("step_index")
        first, end = s["start_s"].iloc[0], (s["start_s"] + s["duration_s"]).max()
        assert r["start_s"] - r["arrival_s"] >= HOST_S  # arrived, then the host's work, then the first pass
        assert r["start_s"] <= first + 1e-9
        assert math.isclose(r["arrival_s"] + r["e2e_s"], end, abs_tol=1e-9)  # e2e from arrival to the last pass
        emitting = s[s["emitted_tokens"] > 0]
        first_token = emitting["start_s"].iloc[0] + emitting["duration_s"].iloc[0]
        assert math.isclose(r["arrival_s"] + r["ttft_s"], first_token, abs_tol=1e-9)
        assert r["ttft_s"] >= HOST_S and r["ttft_s"] <= r["e2e_s"]
        tk = t.tokens[t.tokens["request_id"] == r["request_id"]]
        assert list(tk["token_index"]) == list(range(len(tk)))
        assert r["status"] in ("ok", "truncated") and r["stop_reason"] not in ("", "ok", "truncated")
    assert (req["arrival_s"].diff().dropna() > 0).all()


def test_a_capture_never_writes_over_a_folder_it_was_not_told_to_replace(traced, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(Exception, match="exists and is not empty"):
        capture(CaptureConfig(**{**CFG, "n": 1}, warmup=0), out, progress=False)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    "bad",
    [{"n": 0}, {"max_tokens": 0}, {"warmup": -1}, {"repeats": 0}, {"keep": "max"}],
)
def test_check_config_refuses_each_bad_setting(bad):
    with pytest.raises(UsageError):
        check_config(CaptureConfig(**{**CFG, **bad}).resolved())


def test_check_config_takes_the_smallest_good_settings():
    check_config(CaptureConfig(**{**CFG, "n": 1, "max_tokens": 1}, warmup=0, repeats=1).resolved())


def test_structure_replay_takes_n_requests_and_the_references_task(traced, tmp_path, monkeypatch):
    t, _, _ = traced
    warm: list[int] = []
    monkeypatch.setattr(cap, "drain", lambda steps: warm.append(1))  # warm-up runs, none asked for
    out = capture(
        CaptureConfig(**{**CFG, "n": 1}, task="copy_line", warmup=0, structure_from=str(t.path)),
        tmp_path / "r",
        progress=False,
    )
    r = read_trace(out)
    assert len(r.requests) == 1 and r.meta["task"] == t.meta["task"] != "copy_line"  # the reference's task
    assert r.meta["structure_source"] == str(t.path) and not r.meta["quality_applicable"]
    assert np.isnan(r.requests["quality_score"]).all() and warm == []


def test_two_repeats_on_another_split_are_recorded(tmp_path):
    cfg = CaptureConfig(**{**CFG, "n": 1}, split="dev", warmup=0, repeats=2)
    t = read_trace(capture(cfg, tmp_path / "r2", progress=False))
    assert t.meta["split"] == "dev" and t.meta["runs_per_request"] == 2
    assert t.meta["repeats"]["runs_per_request"] == 2  # the spread of the two runs is in meta.json
    assert list(t.requests["prompt"]) == [ex.prompt for ex in get_task(t.meta["task"]).examples("dev", 1, 0)]
    assert sorted(read_runs(t.path)["run"].unique()) == [0, 1]


def test_cut_short_in_the_first_round_keeps_the_runs_so_far(tmp_path, monkeypatch):
    real_run, calls = Recorder.run, []

    def run_then_die(self, steps):
        calls.append(1)
        if len(calls) == 2:  # round 0, request 1: request 0 ran, request 1 never did
            raise KeyboardInterrupt
        return real_run(self, steps)

    monkeypatch.setattr(Recorder, "run", run_then_die)
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        capture(CaptureConfig(**CFG, warmup=0, repeats=2), out, progress=False)
    runs = read_runs(out)
    assert runs is not None and set(map(tuple, runs[["request_id", "run"]].to_numpy())) == {(0, 0)}


@pytest.mark.parametrize("system", ["sequential", "pasta", "skeleton", "tip", "planned_diffusion", "masked_diffusion"])
def test_every_engine_records_one_token_row_per_output_token(system, tmp_path):
    """A request's `output_tokens` is its text's length (`len(output_ids)`); every engine writes one
    token record per output token, so counting the records instead would give the same figure, and
    the validator holds every capture to it (the SoT engine needs a real chat model and is covered
    by its own tests)."""
    from profiler.validate import validate

    out = capture(CaptureConfig(system=system, n=1, max_tokens=12, warmup=0), tmp_path / system, progress=False)
    t = read_trace(out)
    rows = t.tokens.groupby("request_id").size()
    assert [int(rows.get(r, 0)) for r in t.requests["request_id"]] == t.requests["output_tokens"].tolist()
    assert (t.requests["output_tokens"] > 0).all() and validate(out) == []


def test_engine_settings_are_the_defaults_overlaid_with_the_knobs_given():
    from runtime.capture import engine_settings

    s = engine_settings(CaptureConfig(system="planned_diffusion", knobs={"steps_ratio": 0.5, "order": "left"}))
    assert s["steps_ratio"] == 0.5 and s["order"] == "left" and s["max_rounds"] == 8


# Rounds on made-up runs: which run is recorded, and the one timeline they are laid on.


def _run(arrival: float, e2e: float, out=(1, 2), passes: int = 2) -> RecordedRun:
    start, d = arrival + 0.1, (e2e - 0.1) / passes
    rows = [{"step_index": i, "start_s": start + i * d, "duration_s": d, "batch_index": 99} for i in range(passes)]
    return RecordedRun(SimpleNamespace(output_ids=list(out)), rows, start, start + d, arrival + e2e)


def _two_rounds(keep: str) -> Rounds:
    r = Rounds(2, keep)
    r.add(0, 0, 1.0, _run(1.0, 3.0))  # ends 4.0
    r.add(1, 0, 4.5, _run(4.5, 2.0))  # gap 0.5, ends 6.5
    r.add(0, 1, 7.0, _run(7.0, 1.0, out=(1, 3)))  # faster, other tokens; ends 8.0
    r.add(1, 1, 8.25, _run(8.25, 5.0))  # gap 0.25
    return r


def test_rounds_record_the_fastest_run_and_lay_it_after_the_one_before():
    r = _two_rounds("min")
    (k0, a0, m0), (k1, a1, m1) = r.laid(2)
    assert (k0.round, k1.round) == (1, 0)
    assert a0 == 1.0  # request 0 arrives when it first did, though its recorded run is round 1's
    assert math.isclose(m0.end_s, 2.0) and math.isclose(m0.step_rows[0]["start_s"], 1.1)
    assert math.isclose(a1, 2.0 + 0.5)  # after request 0 ended, plus the gap before it in its round
    assert [row["batch_index"] for row in m0.step_rows + m1.step_rows] == [0, 1, 2, 3]
    assert r.diverged() == 1
    rows = r.table_rows()
    recorded = {(x["request_id"], x["run"]) for x in rows if x["recorded"]}
    assert recorded == {(0, 1), (1, 0)}


def test_rounds_median_of_three_and_the_spread_in_meta():
    r = Rounds(1, "median")
    for i, e2e in enumerate([4.0, 2.0, 3.0]):
        r.add(0, i, 10.0 * i, _run(10.0 * i, e2e))
    assert math.isclose(r.kept(0).e2e_s, 3.0)
    m = r.meta(3)
    assert m["e2e_spread_percent_max"] == m["e2e_spread_percent_median"] == round(100 * (4 - 2) / 3, 2)
    assert m["diverged_runs"] == 0 and m["runs_per_request"] == 3


def test_rounds_median_of_an_even_count_records_the_faster_middle_run():
    r = Rounds(1, "median")
    for i, e2e in enumerate([4.0, 2.0, 3.0, 1.0]):
        r.add(0, i, 10.0 * i, _run(10.0 * i, e2e))
    assert math.isclose(r.kept(0).e2e_s, 2.0)  # sorted 1, 2, 3, 4: the faster of the middle two
    two = Rounds(1, "median")
    for i, e2e in enumerate([3.0, 2.0]):
        two.add(0, i, 10.0 * i, _run(10.0 * i, e2e))
    assert math.isclose(two.kept(0).e2e_s, 2.0)  # of two runs, the median is the faster (as min)


def test_spread_leaves_out_requests_without_every_run():
    r = Rounds(2, "min")
    for i, e2e in enumerate([1.0, 1.1, 1.2]):
        r.add(0, i, 10.0 * i, _run(10.0 * i, e2e))
    r.add(1, 0, 5.0, _run(5.0, 1.0))
    r.add(1, 1, 15.0, _run(15.0, 3.0))  # cut short: request 1 ran twice of three
    m = r.meta(3)
    assert m["e2e_spread_percent_max"] == m["e2e_spread_percent_median"] == round(100 * 0.2 / 1.1, 2)


# meta.json's model and device parts, and the quality note, from their builders.


def test_model_meta_names_a_checkpoint_folder_by_its_name_and_keeps_untrained(tiny_model, tmp_path):
    from runtime.capture import model_meta

    folder = tmp_path / "runs" / "my-ckpt"
    folder.mkdir(parents=True)
    m = model_meta(tiny_model, str(folder), {"trained": False})
    assert m["name"] == "my-ckpt" and m["trained"] is False
    assert model_meta(tiny_model, "tiny-2l", {})["trained"] is True  # a preset's info says nothing: trained


def test_cpu_device_meta_records_torchs_threads():
    import torch

    from profiler.counters import CounterSampler
    from runtime.capture import device_meta

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        info = device_meta("cpu", CounterSampler(1.0, origin=0.0, use_nvml=False))
    finally:
        torch.set_num_threads(before)
    assert info["type"] == "cpu" and info["threads"] == 1


def test_a_task_without_a_scorer_gives_its_own_quality_note():
    from runtime.capture import NOT_APPLICABLE, _not_applicable_note

    assert _not_applicable_note("open_questions") == get_task("open_questions").quality_note != NOT_APPLICABLE
    assert _not_applicable_note("copy_line") == NOT_APPLICABLE


def test_a_request_moved_on_the_timeline_is_written_again(tok):
    """Round 1 makes request 0 faster: request 1 keeps its run but arrives earlier, so its row is
    rewritten (arrival = request 0's end + its gap), not left at the old place."""
    from runtime.capture import Session
    from runtime.tasks import Example

    written: list[tuple[int, float, bool]] = []
    writer = SimpleNamespace(
        add_request=lambda row, steps, toks, graph, replace: written.append(
            (row["request_id"], row["arrival_s"], replace)
        )
    )
    done = {
        "prompt_tokens": 1,
        "text": "",
        "steps": 2,
        "critical_path_tokens": 2,
        "theoretical_speedup": 1.0,
        "peak_live_kv_tokens": 3,
        "peak_kv_bytes": 1,
        "status": "ok",
        "stop_reason": "stop_token",
        "error": "",
        "events": [],
        "tokens": [],
        "graph": {},
    }
    r = Rounds(2, "min")
    s = Session(writer, None, tok, [Example("p0", "a0"), Example("p1", "a1")], False, r)
    runs = [(0, 0, 1.0, 3.0), (1, 0, 4.5, 2.0), (0, 1, 7.0, 1.0), (1, 1, 8.25, 5.0)]
    for rid, round_, arrival, e2e in runs:
        rec = _run(arrival, e2e)
        rec.result = SimpleNamespace(request_id=rid, output_ids=[1, 2], **done)
        r.add(rid, round_, arrival, rec)
        if round_ == 0:
            s.commit(rid + 1)
    s.commit(2)
    assert [(rid, replace) for rid, _, replace in written] == [(0, False), (1, False), (0, True), (1, True)]
    assert math.isclose(written[-1][1], 2.0 + 0.5)
