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
    assert out == [
        {"rows": r, "slots": 100 * e, "keys": 10 * e, "duration_s": float((e - 1) ** 2)}  # median of calls e-2, e-1, e
        for (r, _), e in zip([(1, 64), (2, 64), (1, 128), (2, 128)], ends)
    ]


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
            {"rows": r, "slots": s, "keys": 0, "duration_s": r * 1e-3 + s * 1e-6} for s in rs.SLOTS for r in rs.ROWS
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
    for line, r in zip(lines[2:], rs.ROWS, strict=True):
        assert [float(x) for x in line.split()] == pytest.approx([r, *(r + s * 1e-3 for s in rs.SLOTS)], abs=1e-3)
    rs.main(["--model", "m", "--idle"])
    lines = capsys.readouterr().out.splitlines()
    for line, (r, s) in zip(lines[2:], rs.IDLE_SHAPES, strict=True):
        assert [float(x) for x in line.split()] == pytest.approx(
            [r, s, *(1 + i / 2 for i in rs.IDLE_SLEEPS_S)], abs=1e-3
        )
