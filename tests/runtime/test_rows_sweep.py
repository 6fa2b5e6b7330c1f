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
