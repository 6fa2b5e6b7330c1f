"""The replay (simulator/replay.py) on toy traces, each test killing mutants a mutation round on it
left alive: exact timelines worked out by hand, passes of 1 s on the toy part (`toy_traces`) unless
a test's own cost says otherwise. The mutant each test kills is named in its docstring."""

from __future__ import annotations

import numpy as np

from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, replay
from simulator.workload import load_workload
from tests.simulator.toy_traces import (
    BLOCK_BYTES,
    MODEL_META,
    P,
    one_second_cost,
    seq,
    toy_part,
    write_toy_trace,
)

MODEL = ModelSpec.from_trace_meta(MODEL_META)


def run(w, config=None, hardware=None, cost=None):
    hw = hardware or toy_part()
    return replay(w, hw, MODEL, config or ReplayConfig(), cost=cost or one_second_cost(hw, MODEL))


def toy(tmp_path, requests, prompts, arrivals=None, name="t"):
    return load_workload(write_toy_trace(tmp_path / name, requests, prompts, arrivals=arrivals))


def events(res, request: int) -> list[tuple[str, float]]:
    return [(e, t) for r, e, t in res.timeline() if r == request]


class OneSecond:
    """1 s a pass with query rows, 0 s without (the replay's cost protocol)."""

    def step_time_s(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        return np.ones(np.shape(query_tokens)) if np.ndim(query_tokens) else 1.0


def test_preempted_in_a_later_prefill_recomputes_its_kv_and_its_chunks(tmp_path):
    """A later prefill in chunks (SoT's expansion, a second turn): X (14-token prompt, 6 tokens)
    holds 1 page, 2 from its 4th pass (17 tokens); A: 4-token prompt, a decode, a 24-token prefill,
    a decode. Pool 3 pages, budget 18. 0-1: 14 + 4; 1-2: two decodes; 2-3: X 1 and A's prefill cut
    to 17 (2 pages). At 3.0 X needs 2 pages and A's last 7 rows 2: A is preempted, losing the KV of
    5 tokens and of the 17 rows; readmitted when X ends at 6.0 with a 29-row pass (5 re-prefilled +
    24) in chunks of 18 (6-7) and 11 (7-8), its decode 8-9. Recomputed: 5 + 17 = 22 of those rows.
    (Bug, fixed: the larger of the two lost counts, 17.)"""
    turns = [
        P("prefill", 4, 10, 4, 1),
        P("decode", 1, 5, 5, 1),
        P("prefill", 24, 420, 29, 1),
        P("decode", 1, 30, 30, 1),
    ]
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


class Waking(OneSecond):
    """After idling s seconds the next pass takes 1 + s times as long."""

    def after_idle(self, idle_s):
        return 1.0 + idle_s


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
