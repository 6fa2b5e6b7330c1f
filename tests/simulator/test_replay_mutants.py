"""The replay (simulator/replay.py) on toy traces, each test killing mutants a mutation round on it
left alive: exact timelines worked out by hand, passes of 1 s on the toy part (`toy_traces`) unless
a test's own cost says otherwise. The mutant each test kills is named in its docstring."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import simulator.replay as replay_mod
from profiler.errors import UsageError
from profiler.reader import read_trace
from simulator.replay import ReplayConfig
from simulator.workload import from_trace, load_workload, uniform
from tests.simulator.test_replay import MODEL, run  # the toy model, replayed on the toy part
from tests.simulator.toy_traces import (
    BLOCK_BYTES,
    pasta,
    second_turn,
    seq,
    toy_part,
    write_toy_trace,
)


def toy(tmp_path, requests, prompts, arrivals=None, name="t"):
    return load_workload(write_toy_trace(tmp_path / name, requests, prompts, arrivals=arrivals))


def events(res, request: int) -> list[tuple[str, float]]:
    return [(e, t) for r, e, t in res.timeline() if r == request]


class OneSecond:
    """1 s a pass with query rows, 0 s without (the replay's cost protocol)."""

    def step_time_s(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        return np.ones(np.shape(query_tokens)) if np.ndim(query_tokens) else 1.0


# ---- arrivals ----------------------------------------------------------------------------
def test_two_arrivals_in_one_stretch_both_join_at_its_end(tmp_path):
    """B at 1.5 cuts A's stretch after its second pass (1-2); C arrives at 2.0, that pass's end,
    and joins with B at 2.0. (Mutant: the engine not pulling the arrivals due at the top of its loop
    scheduled at 2.0 before the arrival process had handed C over: C admitted at 3.0.)"""
    res = run(toy(tmp_path, [seq(4, 4), seq(4, 2), seq(4, 2)], [4] * 3, arrivals=[0.0, 1.5, 2.0]))
    assert events(res, 1) == [("arrive", 1.5), ("admit", 2.0), ("first_token", 3.0), ("finish", 4.0)]
    assert events(res, 2) == [("arrive", 2.0), ("admit", 2.0), ("first_token", 3.0), ("finish", 4.0)]


def test_arrivals_at_the_same_time_queue_in_request_order(tmp_path):
    """20 one-pass requests, the odd ones at 0 s and the even ones at 1 s, one at a time: odd ids
    run 0, 1, ..., 9 s in id order, then the even ones 10, ..., 19 s. (Mutant: numpy's default
    argsort, not stable for 20 times with ties, put request 7 before 5.)"""
    arrivals = [1.0, 0.0] * 10
    res = run(toy(tmp_path, [seq(4, 1)] * 20, [4] * 20, arrivals=arrivals), ReplayConfig(max_seqs=1))
    expected = [10 + i // 2 if i % 2 == 0 else (i - 1) // 2 for i in range(20)]
    assert res.requests["start_s"].tolist() == expected


def test_an_arrival_at_a_pass_end_far_into_a_long_stretch(tmp_path):
    """A alone for 200 passes (costed in one vectorised call past the first 48), B arriving at
    100.0, exactly the end of A's 100th pass: B admitted at 100.0. (Mutant: the stretch cut at the
    first pass ending after the arrival: B at 101.0. The passes costed one by one stop at the
    arrival themselves, so only a long stretch shows it.)"""
    res = run(toy(tmp_path, [seq(4, 200), seq(4, 2)], [4, 4], arrivals=[0.0, 100.0]))
    assert events(res, 1) == [("arrive", 100.0), ("admit", 100.0), ("first_token", 101.0), ("finish", 102.0)]


@pytest.mark.parametrize("n, arrivals", [(4, [0.0, 1.0, 2.0, 3.0]), (2, [0.0, 1.0])])
def test_cycled_trace_arrivals_repeat_one_period_later(tmp_path, n, arrivals):
    """A trace of 3 requests at 0, 1, 2 s cycled to 4: the fourth is the first again one period
    (2 s + the mean gap 1 s) later, at 3 s; cut to 2, the first two as they were. (Mutant: the shift
    only for more than one extra request: the fourth at 0 s.)"""
    w = toy(tmp_path, [seq(4, 1)] * 3, [4] * 3, arrivals=[0.0, 1.0, 2.0])
    assert run(w, ReplayConfig(num_requests=n)).requests["arrival_s"].tolist() == arrivals


def test_closed_loop_next_request_joins_when_one_finishes(tmp_path):
    """Two clients: A (2 passes) and B (4 passes) at 0; A finishes at 2.0 and its client sends C
    at once, which joins B's third pass: C admitted at 2.0, done at 4.0 with B. (Mutant: the engine
    not yielding for the clients after a finish planned B's last two passes without C: C at 4.0.)"""
    w = toy(tmp_path, [seq(4, 2), seq(4, 4), seq(4, 2)], [4] * 3)
    res = run(w, ReplayConfig(concurrency=2))
    assert events(res, 2) == [("arrive", 2.0), ("admit", 2.0), ("first_token", 3.0), ("finish", 4.0)]
    assert res.requests["e2e_s"].tolist() == [2.0, 4.0, 2.0]


# ---- the pool ----------------------------------------------------------------------------
def test_pool_is_the_memory_share_minus_the_weights(tmp_path):
    """A part of 2 (weights + 3 pages) bytes at utilization 0.5 leaves 3 pages for KV. (Mutant:
    the utilization ignored, the whole memory less the weights.)"""
    w = toy(tmp_path, [seq(4, 2)], [4])
    hw = toy_part(capacity_bytes=2 * (MODEL.weight_bytes + 3 * BLOCK_BYTES))
    res = run(w, ReplayConfig(memory_utilization=0.5), hardware=hw)
    assert res.kv_capacity_bytes == res.metrics["kv_capacity_bytes"] == 3 * BLOCK_BYTES


def test_a_pool_holds_whole_pages_only(tmp_path):
    """2.5 pages of bytes hold 2 pages: a request that peaks at 3 pages (30 + 3 tokens) cannot run,
    one of 1 page can. (Mutant: the pool's pages rounded up to 3.)"""
    w = toy(tmp_path, [seq(30, 4), seq(4, 2)], [30, 4])
    res = run(w, ReplayConfig(kv_capacity_bytes=5 * BLOCK_BYTES // 2))
    assert res.metrics["kv_capacity_bytes"] == 2 * BLOCK_BYTES
    assert res.requests["status"].tolist() == ["error", "ok"]


def test_pages_larger_than_the_traces_round_up(tmp_path):
    """Pages of 32 tokens for the trace's 16: a request holding 16 tokens holds 1 page (16 KiB);
    one whose KV peaks at 48 tokens (30 + 3) needs 2 and cannot run in a 1-page pool. (Mutants:
    the pages of each pass, or of each request's peak, rounded down: 0 bytes; 1 page, admitted.)"""
    w = toy(tmp_path, [seq(4, 2)], [4])
    assert run(w, ReplayConfig(block_size=32)).metrics["peak_kv_bytes"] == 32 * 512
    w = toy(tmp_path, [seq(30, 4), seq(4, 2)], [30, 4], name="u")
    res = run(w, ReplayConfig(block_size=32, kv_capacity_bytes=32 * 512))
    assert res.requests["status"].tolist() == ["error", "ok"]


def test_one_request_that_cannot_run_is_a_usage_error(tmp_path):
    """A single request larger than the pool: nothing can run, the replay refuses the setting.
    (Mutant: the check only when more than one request failed: a result of no completed request.)"""
    with pytest.raises(UsageError, match="no request can run"):
        run(toy(tmp_path, [seq(40, 2)], [40]), ReplayConfig(kv_capacity_bytes=2 * BLOCK_BYTES))


def test_a_request_without_passes_gets_an_error_row(tmp_path):
    """A source request with no forward passes (an error in the source trace) is refused at arrival
    with an error row; the other runs. (Mutant: its empty pass list admitted: the replay failed.)"""
    trace = read_trace(write_toy_trace(tmp_path / "t", [seq(4, 2), seq(4, 2)], [4, 4]))
    steps = trace.steps[trace.steps["request_id"] != 1]
    requests = trace.requests.assign(status=["ok", "error"])
    res = run(from_trace(dataclasses.replace(trace, steps=steps, requests=requests)))
    assert res.requests["status"].tolist() == ["ok", "error"]
    assert "no forward passes" in res.requests.loc[1, "error"]
    assert res.metrics["completed"] == 1 and res.metrics["duration_s"] == 2.0


# ---- preemption ----------------------------------------------------------------------------
def test_a_preempted_request_keeps_its_first_start_and_the_queues_front(tmp_path):
    """A and B (14-token prompts, 6 tokens) share a 3-page pool; C (20-token prompt, 2 pages)
    arrives at 2.5. At 3.0 A and B each need 2 pages: B is preempted to the queue's front, ahead of
    C. A ends at 6.0; B (2 pages again) is readmitted and C does not fit beside it; B ends at 9.0,
    then C runs 9-11. B's start stays its first admission, 0.0. (Mutants: the preempted request at
    the queue's back, C first at 6.0; the start moved to the readmission, 6.0.)"""
    w = toy(tmp_path, [seq(14, 6), seq(14, 6), seq(20, 2)], [14, 14, 20], arrivals=[0.0, 0.0, 2.5])
    res = run(w, ReplayConfig(kv_capacity_bytes=3 * BLOCK_BYTES))
    assert events(res, 1) == [
        ("arrive", 0.0),
        ("admit", 0.0),
        ("first_token", 1.0),
        ("preempt", 3.0),
        ("admit", 6.0),
        ("finish", 9.0),
    ]
    assert events(res, 2) == [("arrive", 2.5), ("admit", 9.0), ("first_token", 10.0), ("finish", 11.0)]
    assert res.requests["start_s"].tolist() == [0.0, 0.0, 9.0]


def test_preempted_between_prefill_chunks_restarts_and_counts_the_lost_chunk(tmp_path):
    """Budget 20, pool 2 pages. A's 16-token prefill takes 16, B's 12-token prompt a 4-token chunk
    (1 page). At 1.0 A's decode needs 2 pages: B (no pass done) is preempted, its chunk lost; it
    does not fit beside A until A ends at 3.0, then re-runs its whole 12-token prefill, 4 of them
    computed before (recomputed tokens), not a re-prefill of anyone's KV. (Mutants: a request
    preempted before its first pass marked to re-prefill: the KV of the pass before it in the
    workload, A's 18 tokens, added to its prefill; the lost chunk not counted; the restarted
    request taken as usual, its recomputed tokens not counted.)"""
    w = toy(tmp_path, [seq(16, 3), seq(12, 2)], [16, 12])
    res = run(w, ReplayConfig(kv_capacity_bytes=2 * BLOCK_BYTES, max_batch_tokens=20))
    assert res.timeline() == [
        (0, "arrive", 0.0),
        (1, "arrive", 0.0),
        (0, "admit", 0.0),
        (1, "admit", 0.0),
        (0, "first_token", 1.0),
        (1, "preempt", 1.0),
        (0, "finish", 3.0),
        (1, "admit", 3.0),
        (1, "first_token", 4.0),
        (1, "finish", 5.0),
    ]
    b = res.rows["request"] == 1
    assert res.rows["query"][b].tolist() == [4, 12, 1] and res.rows["rebuild"][b].tolist() == [0, 4, 0]
    m = res.metrics
    assert (m["preemptions"], m["recomputed_tokens"], m["prefill_chunks"]) == (1, 4, 1)


def test_preempted_twice_in_its_prefill_recomputes_the_longest_lost_prefix(tmp_path):
    """Pool 2 pages, budget 6. A (2-token prompt, 6 tokens) holds 1 page throughout; B's 28-token
    prompt holds 1 page up to 14 tokens computed, 2 beyond. B runs chunks 4, 5, 5 (14 by 3.0); the
    next chunk (19) needs a 2nd page: B is preempted and restarts at once with 5, then 10; at 5.0
    (15 needs 2 pages) preempted again and restarts with 5; A ends at 6.0 and B runs alone: 6, 6,
    6, 5 (first token 10.0), its decode ends at 11.0. Recomputed: tokens 0-10 of its second run
    (computed in the first), and 0-14 of its third, 10 + 14 = 24, though only 10 were lost at the
    second preemption. (Mutant: the lost prefix taken from the last preemption alone, 10: 20.)"""
    w = toy(tmp_path, [seq(2, 6), seq(28, 2)], [2, 28])
    res = run(w, ReplayConfig(kv_capacity_bytes=2 * BLOCK_BYTES, max_batch_tokens=6))
    assert events(res, 1) == [
        ("arrive", 0.0),
        ("admit", 0.0),
        ("preempt", 3.0),
        ("admit", 3.0),
        ("preempt", 5.0),
        ("admit", 5.0),
        ("first_token", 10.0),
        ("finish", 11.0),
    ]
    b = res.rows["request"] == 1
    assert res.rows["query"][b].tolist() == [4, 5, 5, 5, 5, 5, 6, 6, 6, 5, 1]
    assert res.rows["rebuild"][b].tolist() == [0, 0, 0, 5, 5, 5, 6, 3, 0, 0, 0]
    assert (res.metrics["preemptions"], res.metrics["recomputed_tokens"]) == (2, 24)


def test_preempted_in_a_later_prefill_recomputes_its_kv_and_its_chunks(tmp_path):
    """A later prefill in chunks (SoT's expansion, a second turn): X (14-token prompt, 6 tokens)
    holds 1 page, 2 from its 4th pass (17 tokens); A: 4-token prompt, a decode, a 24-token prefill,
    a decode. Pool 3 pages, budget 18. 0-1: 14 + 4; 1-2: two decodes; 2-3: X 1 and A's prefill cut
    to 17 (2 pages). At 3.0 X needs 2 pages and A's last 7 rows 2: A is preempted, losing the KV of
    5 tokens and of the 17 rows; readmitted when X ends at 6.0 with a 29-row pass (5 re-prefilled +
    24) in chunks of 18 (6-7) and 11 (7-8), its decode 8-9. Recomputed: 5 + 17 = 22 of those rows.
    (Bug, fixed: the larger of the two lost counts, 17.)"""
    turns = second_turn(4, 24)
    w = toy(tmp_path, [seq(14, 6), turns], [14, 4])
    res = run(w, ReplayConfig(kv_capacity_bytes=3 * BLOCK_BYTES, max_batch_tokens=18))
    assert events(res, 1) == [
        ("arrive", 0.0),
        ("admit", 0.0),
        ("first_token", 1.0),
        ("preempt", 3.0),
        ("admit", 6.0),
        ("finish", 9.0),
    ]
    a = res.rows["request"] == 1
    assert res.rows["query"][a].tolist() == [4, 1, 17, 18, 11, 1]
    assert res.rows["rebuild"][a].tolist() == [0, 0, 0, 18, 4, 0]
    assert (res.metrics["preemptions"], res.metrics["recomputed_tokens"]) == (1, 22)


def test_preempted_again_during_its_re_prefill_recomputes_its_kv_once(tmp_path):
    """Pool 2 pages, budget 6. A (4-token prompt, 8 tokens) holds 1 page; B (14-token prompt, 4
    tokens) runs chunks 2, 5, 5, 2 (first token 4.0) and decodes to 16 tokens by 6.0, where its next
    decode needs a 2nd page: B is preempted and readmitted at once with a 5-row chunk of its 17-row
    re-prefill (16 + its decode); at 7.0 the next chunk (10 rows) needs 2 pages: preempted again,
    the 5 rows lost being part of the 16 already counted. After A ends at 8.0, B runs 6 and 6 rows.
    Recomputed: 5 + 5 + 6 + 5 (16 of the last 17 rows) = 21. (Mutant: the lost rows of a
    re-prefill added to its KV, 16 + 5 lost: 22.)"""
    w = toy(tmp_path, [seq(4, 8), seq(14, 4)], [4, 14])
    res = run(w, ReplayConfig(kv_capacity_bytes=2 * BLOCK_BYTES, max_batch_tokens=6))
    assert events(res, 1) == [
        ("arrive", 0.0),
        ("admit", 0.0),
        ("first_token", 4.0),
        ("preempt", 6.0),
        ("admit", 6.0),
        ("preempt", 7.0),
        ("admit", 7.0),
        ("finish", 10.0),
    ]
    b = res.rows["request"] == 1
    assert res.rows["query"][b].tolist() == [2, 5, 5, 2, 1, 1, 5, 5, 6, 6]
    assert res.rows["rebuild"][b].tolist() == [0, 0, 0, 0, 0, 0, 5, 5, 6, 5]
    assert (res.metrics["preemptions"], res.metrics["recomputed_tokens"]) == (2, 21)


# ---- chunked prefill -------------------------------------------------------------------------
def test_a_prefill_in_three_chunks_adds_up_its_progress(tmp_path):
    """Budget 8: A (2-token prompt, 6 tokens) and B (15-token prompt). B runs 6 tokens beside A's
    prefill, 7 beside its decode, the last 2 at 2-3 (first token 3.0), its decode 3-4. (Mutant: a
    chunk's tokens replacing the progress instead of adding to it: B's chunks of 7 go round until A
    ends, its first token at 7.0.)"""
    res = run(toy(tmp_path, [seq(2, 6), seq(15, 2)], [2, 15]), ReplayConfig(max_batch_tokens=8))
    assert events(res, 1)[-2:] == [("first_token", 3.0), ("finish", 4.0)]
    assert res.rows["query"][res.rows["request"] == 1].tolist() == [6, 7, 2, 1]
    assert res.metrics["prefill_chunks"] == 2 and res.metrics["duration_s"] == 6.0


def test_the_head_joins_when_its_prefill_fills_the_budget_exactly(tmp_path):
    """Budget 8: A's 8-token prefill leaves nothing for B (7-token prompt) at 0; beside A's first
    decode B's 7 tokens fill the budget exactly, so B joins at 1.0 (the stretch planned from A's
    prefill stops there). (Mutant: the head fitting only strictly under the budget: B at 3.0.)"""
    res = run(toy(tmp_path, [seq(8, 3), seq(7, 2)], [8, 7]), ReplayConfig(max_batch_tokens=8))
    assert events(res, 1) == [("arrive", 0.0), ("admit", 1.0), ("first_token", 2.0), ("finish", 3.0)]
    assert res.metrics["prefill_chunks"] == 0 and res.metrics["passes"] == 3


def test_the_head_joins_when_its_peak_fills_the_pool_exactly(tmp_path):
    """reserve="peak", 2-page pool, budget 16 unchunked: A's 14-token prefill leaves 2 tokens, B
    (14-token prompt) waits; at A's first decode A's peak page and B's fill the pool exactly and B
    joins at 1.0. (Mutant: the planner's peak room strict: B at 3.0.)"""
    w = toy(tmp_path, [seq(14, 3), seq(14, 2)], [14, 14])
    cfg = ReplayConfig(kv_capacity_bytes=2 * BLOCK_BYTES, max_batch_tokens=16, chunked_prefill=False, reserve="peak")
    res = run(w, cfg)
    assert events(res, 1) == [("arrive", 0.0), ("admit", 1.0), ("first_token", 2.0), ("finish", 3.0)]


def test_a_later_prefill_wider_than_the_budget_is_chunked(tmp_path):
    """A request with a second turn: prefill 4, decode, a 12-token prefill, decode; budget 8. The
    second prefill runs as chunks of 8 (2-3) and 4 (3-4): 5 passes, done at 5.0. (Mutant: the
    stretch planner's stop before a chunked prefill skipped when chunking is on: the 12 tokens in
    one pass, 4 passes.)"""
    turns = second_turn(4, 12)
    res = run(toy(tmp_path, [turns], [4]), ReplayConfig(max_batch_tokens=8))
    assert res.rows["query"].tolist() == [4, 1, 8, 4, 1]
    assert (res.metrics["passes"], res.metrics["duration_s"], res.metrics["prefill_chunks"]) == (5, 5.0, 1)


@pytest.mark.parametrize("stretch", [replay_mod.MAX_STRETCH_PASSES, 1])
def test_thread_passes_past_the_budget_run_whole(tmp_path, monkeypatch, stretch):
    """Two PASTA requests (4-token prompt, 8 threads x 3 tokens, a joined token) under budget 8:
    both prefills fit (4 + 4), then 16 thread rows a pass, more than the budget, and none cut or
    left out (only prefills are chunked): both done at 5.0, planned as one stretch or pass by pass
    (then the scheduler forms every batch). (Mutant: every running pass cut to the budget left:
    pass by pass, B's thread passes sat out until A's ended.)"""
    monkeypatch.setattr(replay_mod, "MAX_STRETCH_PASSES", stretch)
    res = run(toy(tmp_path, [pasta(4, 8, 3)] * 2, [4, 4]), ReplayConfig(max_batch_tokens=8))
    assert res.requests["e2e_s"].tolist() == [5.0, 5.0] and res.metrics["passes"] == 5
    assert res.rows["query"].tolist() == [4, 8, 8, 8, 1] * 2


# ---- cost ----------------------------------------------------------------------------------
def test_per_request_host_work_is_paid_by_every_request_in_a_pass(tmp_path):
    """A cost with 0.5 s of host work per request: two requests batched make each pass 2 s, so both
    end at 4.0. (Mutant: the host work paid once per pass: 3.0.)"""

    class HostWork(OneSecond):
        per_request_s = 0.5

    res = run(toy(tmp_path, [seq(4, 2)] * 2, [4, 4]), cost=HostWork())
    assert res.requests["e2e_s"].tolist() == [4.0, 4.0] and res.metrics["device_busy_s"] == 4.0


@pytest.mark.parametrize("n", [3, 130])  # costed pass by pass; one vectorised call (>= 128 passes)
def test_a_pass_without_query_rows_takes_no_time(n):
    """A workload pass with no query rows costs 0 s (`_pass_times`): n passes, one of them empty,
    end at n - 1 s. (Mutants: the empty pass costed as any other, by either path: n s.)"""
    w = uniform(1, 4, n)
    q = w.query_tokens.copy()
    q[n // 2] = 0
    res = run(dataclasses.replace(w, query_tokens=q))
    assert res.metrics["passes"] == n and res.metrics["duration_s"] == n - 1


class Waking(OneSecond):
    """After idling s seconds the next pass takes 1 + s times as long."""

    def after_idle(self, idle_s):
        return 1.0 + idle_s


def test_the_idle_time_before_a_pass_adds_up_over_wakeups(tmp_path):
    """X runs 0-1; E (larger than the pool) arrives at 2.0 and is refused, waking the engine with
    nothing to run; C arrives at 4.0 after 3 s of idling: its pass takes 4 s, done at 8.0.
    (Mutant: the idle time restarted at each wakeup: 2 s, done at 7.0.)"""
    w = toy(tmp_path, [seq(4, 1), seq(40, 2), seq(4, 1)], [4, 40, 4], arrivals=[0.0, 2.0, 4.0])
    res = run(w, ReplayConfig(kv_capacity_bytes=2 * BLOCK_BYTES), cost=Waking())
    assert res.requests["status"].tolist() == ["ok", "error", "ok"]
    assert events(res, 2) == [("arrive", 4.0), ("admit", 4.0), ("first_token", 8.0), ("finish", 8.0)]


def test_an_arrival_in_the_slow_pass_after_idling_joins_at_its_end(tmp_path):
    """X runs 0-1; A (5 passes) arrives at 3.0 after 2 s idle, so its first pass takes 3 s (3-6);
    B arrives at 4.5, inside it, and joins at 6.0, as a pass-by-pass loop has it. (Bug, fixed: the
    stretch was cut at the arrival by the passes' times before the slowdown, in A's second pass
    (4.0-5.0 unslowed), so B waited for that pass too and joined at 7.0.)"""
    w = toy(tmp_path, [seq(4, 1), seq(4, 5), seq(4, 2)], [4] * 3, arrivals=[0.0, 3.0, 4.5])
    res = run(w, cost=Waking())
    assert events(res, 1) == [("arrive", 3.0), ("admit", 3.0), ("first_token", 6.0), ("finish", 10.0)]
    assert events(res, 2) == [("arrive", 4.5), ("admit", 6.0), ("first_token", 7.0), ("finish", 8.0)]
    starts = res.rows.pass_start_s
    assert starts.tolist() == [0.0, 3.0, 6.0, 7.0, 8.0, 9.0]


def test_a_later_prefill_ahead_of_a_decode_keeps_the_batch_to_the_budget(tmp_path):
    """A (admitted first: 4-token prompt, a decode, a 24-token later prefill, a decode) and B (4-token
    prompt, 6 tokens), budget 10: from 2.0 B's decode takes its 1 row first and A's prefill runs in
    chunks of the 9 left (9, 9, 6), so no pass batches more than 10 rows. (Bug, fixed in
    scheduling/base.py: the prefill, first in running order, was cut to the whole budget, 10 + 1.)"""
    turns = second_turn(4, 24)
    res = run(toy(tmp_path, [turns, seq(4, 6)], [4, 4]), ReplayConfig(max_batch_tokens=10))
    a = res.rows["request"] == 0
    assert res.rows["query"][a].tolist() == [4, 1, 9, 9, 6, 1]
    per_pass = np.bincount(res.rows["batch_index"], weights=res.rows["query"])
    assert per_pass.tolist() == [8, 2, 10, 10, 7, 2]
    assert events(res, 0)[-1] == ("finish", 6.0) and events(res, 1)[-1] == ("finish", 6.0)
