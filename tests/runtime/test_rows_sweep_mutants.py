"""runtime/rows_sweep.py: tests that kill the mutants a mutation round found the rest of the suite
let through (each test names the mutant it kills: the code as it would be, mutated)."""

from __future__ import annotations

import pytest


@pytest.fixture
def logged(monkeypatch):
    """The sweep module with its passes, contexts and sleeps logged, not run: each pass takes 1 s,
    scores 1 key over a span of 1 slot."""
    import runtime.rows_sweep as rs

    log: dict[str, list] = {"context": [], "pass": [], "sleep": []}

    def context(model, page_size, r, s):
        log["context"].append((page_size, r, s))
        return None, (r, s)

    def timed(model, kv, ctx, attention):
        log["pass"].append((ctx, attention))
        return 1.0, 1, 1

    monkeypatch.setattr(rs, "decode_context", context)
    monkeypatch.setattr(rs, "timed_pass", timed)
    monkeypatch.setattr(rs.time, "sleep", log["sleep"].append)
    return rs, log


def test_the_sweeps_defaults_are_the_captures_pages_attention_and_reps(logged):
    """`solm capture --rows-sweep` passes the page size and attention only: the sweeps' own
    defaults, 16-slot pages and mask attention, `REPS` timings per rows shape and `IDLE_REPS` per
    idle sleep (the counts `main` prints) (kills R29: another default page size; R28: the idle
    sweep timed `REPS` times per sleep)."""
    rs, log = logged
    rs.rows_sweep(None, rows=(2,), slots=(64,))
    assert log["context"] == [(16, 2, 64)] and len(log["pass"]) == rs.WARMUP + rs.REPS
    assert {a for _, a in log["pass"]} == {"mask"}
    log["context"].clear(), log["sleep"].clear()
    rs.idle_sweep(None, shapes=((1, 64),), sleeps_s=(0.5,))
    assert log["context"] == [(16, 1, 64)] and log["sleep"] == [0.5] * rs.IDLE_REPS


def test_the_cli_runs_torch_on_one_thread_unless_told(monkeypatch, capsys):
    """`python -m runtime.rows_sweep` times on one CPU thread, as `solm capture` does (kills R25:
    another default thread count)."""
    import runtime.checkpoint
    import runtime.rows_sweep as rs

    threads = []
    monkeypatch.setattr(runtime.checkpoint, "load_model", lambda name, device: (name, {}))
    monkeypatch.setattr(rs, "rows_sweep", lambda model, attention, reps: [])
    monkeypatch.setattr(rs.torch, "set_num_threads", threads.append)
    rs.main(["--model", "m"])
    assert threads == [1]


def test_each_sweep_row_is_a_decode(tiny_model):
    """The rows the sweep times are decode rows, as the server's decode passes (kills R22: marked
    a prefill)."""
    from runtime.rows_sweep import decode_context, decode_rows

    kv, context = decode_context(tiny_model, 16, 3, 48)
    assert [inp.phase for inp in decode_rows(kv, context)] == ["decode"] * 3
