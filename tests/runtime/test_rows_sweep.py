"""The rows sweep times the server's own forward over R requests' decode rows and a pool of S slots,
and counts the keys that forward scored: every row x the pool (mask) or each request's own slots
(gather)."""

from __future__ import annotations

import pytest

from runtime.rows_sweep import rows_sweep


@pytest.mark.parametrize("attention", ["mask", "gather"])
def test_rows_sweep_counts_the_keys_each_attention_scores(tiny_model, attention):
    out = rows_sweep(tiny_model, page_size=16, attention=attention, rows=(1, 3), slots=(64, 128), reps=2)
    # the pool spans the pages the requests' contexts fill (each request its own pages) plus their new slots
    assert [(p["rows"], p["slots"]) for p in out] == [(1, 80), (3, 96), (1, 144), (3, 144)]
    for p, context in zip(out, (64, 21, 128, 42)):  # each request holds S // R slots
        r = p["rows"]
        assert p["keys"] == (r * p["slots"] if attention == "mask" else r * (context + 1)) and p["duration_s"] > 0


def test_idle_sweep_times_a_pass_after_each_sleep_beside_it_back_to_back(tiny_model, monkeypatch):
    import runtime.rows_sweep as rs

    slept = []
    monkeypatch.setattr(rs.time, "sleep", slept.append)  # no real sleeping in a test
    out = rs.idle_sweep(tiny_model, shapes=((1, 32), (4, 64)), sleeps_s=(0.001, 0.01), reps=2)
    assert [(p["rows"], p["slots"], p["idle_s"]) for p in out] == [
        (1, 32, 0.001),
        (1, 32, 0.01),
        (4, 64, 0.001),
        (4, 64, 0.01),
    ]
    assert all(p["busy_s"] > 0 and p["after_idle_s"] > 0 for p in out)
    assert slept == [0.001, 0.001, 0.01, 0.01] * 2  # each sleep `reps` times, right before its timed pass


class FakePasses:
    """Stands in for `timed_pass`: call k takes k**2 seconds (so a median is no mean) and scores
    10 k keys over a span of 100 k slots; each call is logged beside the sleeps."""

    def __init__(self) -> None:
        self.calls, self.log = 0, []

    def __call__(self, model, kv, context, attention):
        self.calls += 1
        self.log.append(("pass", context))
        return float(self.calls**2), 10 * self.calls, 100 * self.calls


@pytest.fixture
def fake(monkeypatch):
    import runtime.rows_sweep as rs

    f = FakePasses()
    monkeypatch.setattr(rs, "timed_pass", f)
    monkeypatch.setattr(rs, "decode_context", lambda model, page_size, r, s: (None, (r, s)))
    monkeypatch.setattr(rs.time, "sleep", lambda s: f.log.append(("sleep", s)))
    return rs, f


def test_rows_sweep_times_each_shape_after_its_warmup_and_keeps_the_median(fake):
    """`WARMUP` untimed passes before the first shape, one before each later one; then `reps` timed
    passes whose median is kept; keys and span are those of the shape's last pass. Slots outer,
    rows inner."""
    rs, f = fake
    out = rs.rows_sweep(None, rows=(1, 2), slots=(64, 128), reps=3)
    w = rs.WARMUP
    assert [c for _, c in f.log] == [(1, 64)] * (w + 3) + [(2, 64)] * 4 + [(1, 128)] * 4 + [(2, 128)] * 4
    ends = [w + 3, w + 7, w + 11, w + 15]  # the call number of each shape's last pass
    firsts = [1, w + 4, w + 8, w + 12]  # ... and of its first
    assert out == [
        {  # median of calls e-2, e-1, e; the first pass's own time beside it
            "rows": r,
            "slots": 100 * e,
            "keys": 10 * e,
            "duration_s": float((e - 1) ** 2),
            "first_s": float(f**2),
        }
        for (r, _), e, f in zip([(1, 64), (2, 64), (1, 128), (2, 128)], ends, firsts)
    ]


def test_first_pass_ratios_leave_out_the_process_first_shape():
    """first_s / duration_s and first_s - duration_s over every shape but the first (and any of 0 s);
    medians and max."""
    from runtime.rows_sweep import first_pass_ratios

    sweep = [
        {"duration_s": 1.0, "first_s": 100.0},  # the process's first pass: left out
        {"duration_s": 1.0, "first_s": 3.0},
        {"duration_s": 2.0, "first_s": 2.0},
        {"duration_s": 4.0, "first_s": 6.0},
    ]
    assert first_pass_ratios(sweep) == {
        "shapes": 3,
        "first_over_median_median": 1.5,
        "first_over_median_max": 3.0,
        "first_extra_s_median": 2.0,
    }
    assert first_pass_ratios(sweep[:1]) == {"shapes": 0}
    # a later shape whose median is 0 s has no ratio: left out, not a division by zero
    assert first_pass_ratios([*sweep, {"duration_s": 0.0, "first_s": 0.5}]) == first_pass_ratios(sweep)


def test_shape_profile_names_the_operators_of_a_new_shape_and_its_repeat(tiny_model):
    """Both passes profiled on the real forward: the pool's span and keys as the sweep counts them,
    operators ranked by self CPU time (a matrix product among the first), none by device on a CPU."""
    from runtime.rows_sweep import shape_profile

    out = shape_profile(tiny_model, 3, 64, page_size=16, top=4)
    assert out["rows"] == 3 and out["slots_asked"] == 64 and out["keys"] == 3 * out["slots"]
    for name in ("new", "seen"):
        ops = out[name]["by_self_cpu"]
        assert out[name]["duration_s"] > 0 and len(ops) == 4 and out[name]["by_self_device"] == []
        assert [o["self_cpu_s"] for o in ops] == sorted((o["self_cpu_s"] for o in ops), reverse=True)
        assert any(o["name"] in ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul") for o in ops)
        assert all(o["calls"] >= 1 for o in ops)


@pytest.mark.parametrize("text", ["5", "5x", "x384", "0x384", "5x0", "-1x3", "axb", "5x384x2"])
def test_profile_shape_arg_refuses_what_is_not_two_positive_counts(text):
    import argparse

    from runtime.rows_sweep import profile_shape_arg

    with pytest.raises(argparse.ArgumentTypeError):
        profile_shape_arg(text)
    assert profile_shape_arg("5x384") == (5, 384) and profile_shape_arg("1X1") == (1, 1)


def test_idle_sweep_times_a_pass_back_to_back_and_one_after_each_sleep(fake):
    """Per shape: `WARMUP` untimed passes; then per sleep and rep: an untimed pass, the timed busy
    pass, the sleep, the timed pass after it; the medians of each kept."""
    rs, f = fake
    out = rs.idle_sweep(None, shapes=((1, 32), (4, 64)), sleeps_s=(0.5, 2.0), reps=3)
    w = rs.WARMUP
    one_sleep = lambda s, c: [("pass", c), ("pass", c), ("sleep", s), ("pass", c)] * 3  # noqa: E731
    shape = lambda c: [("pass", c)] * w + one_sleep(0.5, c) + one_sleep(2.0, c)  # noqa: E731
    assert f.log == shape((1, 32)) + shape((4, 64))
    # the first sleep's busy passes are calls w+2, w+5, w+8, its after-idle passes w+3, w+6, w+9
    starts = [w, w + 9, 2 * w + 18, 2 * w + 27]
    assert out == [
        {"rows": r, "slots": s, "idle_s": i, "busy_s": float((k + 5) ** 2), "after_idle_s": float((k + 6) ** 2)}
        for (r, s, i), k in zip([(1, 32, 0.5), (1, 32, 2.0), (4, 64, 0.5), (4, 64, 2.0)], starts)
    ]


def test_decode_context_gives_each_request_its_share_of_the_pool(tiny_model):
    """`slots // rows` slots per request (at least one), each request its own pages."""
    from runtime.rows_sweep import decode_context

    kv, context = decode_context(tiny_model, 16, 3, 64)
    assert [len(c) for c in context] == [21, 21, 21] and kv.live_tokens == 63
    assert len({s // 16 for c in context for s in c}) == 3 * 2  # 21 slots: two pages each, none shared
    _, tiny = decode_context(tiny_model, 16, 8, 4)
    assert [len(c) for c in tiny] == [1] * 8


def test_decode_rows_and_timed_pass_feed_one_row_after_each_context_and_free_it(tiny_model):
    """Each request's decode row: a new slot on its own pages, the position after its context,
    seeing its context and itself; the pass frees the new slots, so passes repeat over one pool."""
    from runtime.rows_sweep import decode_context, decode_rows, timed_pass

    kv, context = decode_context(tiny_model, 16, 2, 40)
    inputs = decode_rows(kv, context)
    for inp, held in zip(inputs, context):
        assert inp.positions == [len(held)] and inp.rows == 1
        assert list(inp.cols) == [*held, inp.slots[0]] and inp.vis.shape == (1, len(held) + 1) and inp.vis.all()
        assert inp.slots[0] // 16 == held[-1] // 16  # the request's own open page (20 slots: room left)
    kv.free([s for inp in inputs for s in inp.slots])
    live, span = kv.live_tokens, kv.num_slots
    for _ in range(2):
        dt, keys, got = timed_pass(tiny_model, kv, context, "gather")
        assert dt > 0 and keys == 2 * 21 and got == span and kv.live_tokens == live


def test_the_cli_prints_the_sweep_and_the_idle_ratios(monkeypatch, capsys):
    """`python -m runtime.rows_sweep`: a rows x slots table in ms, `--reps` passed on; `--idle`:
    after-idle / busy per shape and sleep."""
    import runtime.checkpoint
    import runtime.rows_sweep as rs

    asked = {}
    monkeypatch.setattr(runtime.checkpoint, "load_model", lambda name, device: (name, {}))

    def sweep(model, attention, reps):
        asked.update(model=model, attention=attention, reps=reps)
        return [
            {"rows": r, "slots": s, "keys": 0, "duration_s": r * 1e-3 + s * 1e-6, "first_s": (r * 1e-3 + s * 1e-6) * r}
            for s in rs.SLOTS
            for r in rs.ROWS
        ]

    def idle(model, attention):
        return [
            {"rows": r, "slots": s, "idle_s": i, "busy_s": 2.0, "after_idle_s": 2.0 + i}
            for r, s in rs.IDLE_SHAPES
            for i in rs.IDLE_SLEEPS_S
        ]

    monkeypatch.setattr(rs, "rows_sweep", sweep)
    monkeypatch.setattr(rs, "idle_sweep", idle)
    monkeypatch.setattr(rs.torch, "set_num_threads", lambda n: asked.update(threads=n))
    rs.main(["--model", "m", "--attention", "gather", "--reps", "3", "--threads", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert asked == {"model": "m", "attention": "gather", "reps": 3, "threads": 3}
    assert lines[1].split() == ["rows", *map(str, rs.SLOTS)]
    n = len(rs.ROWS)
    for line, r in zip(lines[2 : 2 + n], rs.ROWS, strict=True):
        assert [float(x) for x in line.split()] == pytest.approx([r, *(r + s * 1e-3 for s in rs.SLOTS)], abs=1e-3)
    assert lines[2 + n].startswith("first pass of each shape / its median")
    for line, r in zip(lines[3 + n :], rs.ROWS, strict=True):  # first_s / duration_s: r in the fake
        assert [float(x) for x in line.split()] == pytest.approx([r] * (1 + len(rs.SLOTS)))
    rs.main(["--model", "m", "--idle"])
    lines = capsys.readouterr().out.splitlines()
    for line, (r, s) in zip(lines[2:], rs.IDLE_SHAPES, strict=True):
        assert [float(x) for x in line.split()] == pytest.approx(
            [r, s, *(1 + i / 2 for i in rs.IDLE_SLEEPS_S)], abs=1e-3
        )


def test_the_cli_json_carries_the_sweep_its_first_pass_ratios_and_the_profiles(capsys):
    """`--json --profile RxS` on a real shipped preset: one JSON object; a bad --profile is a usage error."""
    import json

    import runtime.rows_sweep as rs

    rs.main(["--model", "tip-tiny", "--reps", "1", "--profile", "5x40", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["model"] == "tip-tiny" and report["device"] == "cpu" and report["reps"] == 1
    assert report["sdpa"] == "auto"
    assert [(p["rows"]) for p in report["sweep"]] == list(rs.ROWS) * len(rs.SLOTS)
    assert all(p["first_s"] > 0 and p["duration_s"] > 0 for p in report["sweep"])
    assert report["first_pass"] == rs.first_pass_ratios(report["sweep"])
    (prof,) = report["profiles"]
    assert prof["rows"] == 5 and prof["slots_asked"] == 40 and prof["new"]["by_self_cpu"]
    with pytest.raises(SystemExit) as e:
        rs.main(["--profile", "5"])
    assert e.value.code == 2
