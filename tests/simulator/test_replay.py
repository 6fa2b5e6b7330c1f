"""SimPy replay: exact timelines on toy traces with round numbers on a made-up part (1 s per pass)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

import simulator.replay as replay_mod
from profiler.reader import read_trace
from profiler.validate import problems
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, replay
from simulator.simtrace import write_simulated_trace
from simulator.workload import load_workload, uniform
from tests.simulator.toy_traces import (
    BLOCK_BYTES,
    MODEL_META,
    LinearCost,
    one_second_cost,
    pasta,
    planned_diffusion,
    seq,
    tip,
    toy_part,
    write_toy_trace,
)

MODEL = ModelSpec.from_trace_meta(MODEL_META)


def run(w, config=None, hardware=None, cost=None):
    config = config or ReplayConfig()
    hw = hardware or toy_part()
    return replay(w, hw, MODEL, config, cost=cost or one_second_cost(hw, MODEL))


def test_exact_timeline_continuous_batching(tmp_path):
    # A: prefill + 2 decodes, arrives at 0; B: prefill + 1 decode, arrives at 0.5 and joins at the next boundary
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3), seq(4, 2)], [4, 4], arrivals=[0.0, 0.5]))
    res = run(w, ReplayConfig(max_seqs=2))
    assert res.timeline() == [
        (0, "arrive", 0.0),
        (0, "admit", 0.0),
        (1, "arrive", 0.5),
        (0, "first_token", 1.0),
        (1, "admit", 1.0),
        (1, "first_token", 2.0),
        (0, "finish", 3.0),
        (1, "finish", 3.0),
    ]
    m = res.metrics
    assert (m["passes"], m["duration_s"], m["mean_ttft_ms"], m["mean_e2el_ms"]) == (3, 3.0, 1250.0, 2750.0)
    assert m["mean_itl_ms"] == 1000.0 and m["mean_tpot_ms"] == 1000.0
    assert m["request_throughput"] == 2 / 3 and m["output_throughput"] == 5 / 3
    assert m["total_token_throughput"] == (8 + 5) / 3  # prompts and outputs
    assert m["p99_ttft_ms"] == 1000.0 + 0.99 * 500.0  # np.percentile, linear, over TTFTs of 1 and 1.5 s
    assert m["mean_batch_requests"] == 5 / 3  # A in 3 passes, B in 2
    wide = run(w, ReplayConfig(max_seqs=2, block_size=32))  # pages of 32 tokens for the trace's 16
    pages = wide.requests["peak_kv_bytes"] // wide.bytes_per_block  # whole pages that hold each request's KV
    assert pages.tolist() == [1, 1]


def test_exact_timeline_one_sequence_at_a_time(tmp_path):
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3), seq(4, 2)], [4, 4], arrivals=[0.0, 0.5]))
    res = run(w, ReplayConfig(max_seqs=1))
    assert res.timeline() == [
        (0, "arrive", 0.0),
        (0, "admit", 0.0),
        (1, "arrive", 0.5),
        (0, "first_token", 1.0),
        (0, "finish", 3.0),
        (1, "admit", 3.0),
        (1, "first_token", 4.0),
        (1, "finish", 5.0),
    ]
    assert res.requests["e2e_s"].tolist() == [3.0, 4.5]


def test_token_dependent_cost_timeline(tmp_path):
    # LinearCost: 1 s + 0.25 s per query token of the batch
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 2), seq(8, 2)], [4, 8]))
    res = run(w, ReplayConfig(max_seqs=2), cost=LinearCost())
    # pass 1: prefills 4 + 8 = 12 tokens -> 4 s; pass 2: two decodes -> 1.5 s
    assert [e for e in res.timeline() if e[1] in ("first_token", "finish")] == [
        (0, "first_token", 4.0),
        (1, "first_token", 4.0),
        (0, "finish", 5.5),
        (1, "finish", 5.5),
    ]


class RecordingCost(LinearCost):
    """LinearCost that keeps the (query tokens, KV tokens scored) of every pass it was asked to time."""

    def __init__(self) -> None:
        self.seen: dict[tuple[float, float], None] = {}

    def step_time_s(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        self.seen.update({pair: None for pair in zip(np.atleast_1d(query_tokens), np.atleast_1d(kv_tokens_read))})
        return super().step_time_s(query_tokens, kv_tokens_read, query_groups, logit_tokens)


@pytest.mark.parametrize("attention", ["visible", "pool"])
def test_attention_scores_visible_kv_or_the_whole_pool(tmp_path, attention):
    # A: 4-token prompt + 2 decodes (1 page); B: 20-token prompt + 1 decode (2 pages), both at 0.
    # visible: each row its own KV. pool (the runtime's mask): every row x the pages' high-water mark
    # (3 pages of 16 slots from the first pass on, also once B has finished and freed its 2)
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3), seq(20, 2)], [4, 20]))
    cost = RecordingCost()
    res = run(w, ReplayConfig(max_seqs=2, attention=attention), cost=cost)
    visible = [(24, 10 + 210), (2, 5 + 21), (1, 6)]
    pool = [(24, 24 * 48), (2, 2 * 48), (1, 48)]
    assert list(cost.seen) == (pool if attention == "pool" else visible)
    # the simulated trace records the keys each pass scored, as a serving trace of the runtime does
    steps = read_trace(write_simulated_trace(res, tmp_path / "sim")).steps
    scored = steps.groupby("batch_index")["attention_kv_tokens"].sum().tolist()
    assert scored == [k for _, k in (pool if attention == "pool" else visible)]
    assert steps["kv_tokens_read"].sum() == sum(k for _, k in visible)


def test_token_cap_splits_batches(tmp_path):
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(6, 2), seq(6, 2)], [6, 6]))
    res = run(w, ReplayConfig(max_batch_tokens=8, chunked_prefill=False))  # both prefills (12 tokens) do not fit
    assert [e for e in res.timeline() if e[1] == "admit"] == [(0, "admit", 0.0), (1, "admit", 1.0)]


def test_chunked_prefill_fills_the_token_budget(tmp_path):
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(6, 2), seq(6, 2)], [6, 6]))
    res = run(w, ReplayConfig(max_batch_tokens=8))  # vLLM's default: B's prefill runs as chunks of 2, then 4
    assert res.timeline() == [
        (0, "arrive", 0.0),
        (1, "arrive", 0.0),
        (0, "admit", 0.0),
        (1, "admit", 0.0),
        (0, "first_token", 1.0),
        (1, "first_token", 2.0),
        (0, "finish", 2.0),
        (1, "finish", 3.0),
    ]
    assert res.metrics["prefill_chunks"] == 1 and res.requests["steps"].tolist() == [2, 3]
    steps = read_trace(write_simulated_trace(res, tmp_path / "sim")).steps
    b = steps[steps["request_id"] == 1].sort_values("step_index")
    assert b["query_tokens"].tolist() == [2, 4, 1] and b["emitted_tokens"].tolist() == [0, 1, 1]
    assert b["note"].tolist() == ["prefill chunk", "", ""] and b["phase"].tolist() == ["prefill", "prefill", "decode"]
    assert b["kv_tokens_read"].tolist()[:2] == [3, 18]  # rows 1-2 and 3-6 of a causal 6-token prefill (21 slots)


def test_a_prefill_sitting_out_rejoins_when_the_budget_frees(tmp_path):
    """A (PASTA: 4-token prefill, 3 passes of 8 thread rows, 1 joined row) and B (10-token prompt)
    under a budget of 8: B's first chunk (4) rides A's prefill, then B sits out while A's threads
    take all 8 tokens, and runs its last 6 beside A's 1-row pass (5.0), not after A finishes."""
    w = load_workload(write_toy_trace(tmp_path / "t", [pasta(4, 8, 3), seq(10, 2)], [4, 10]))
    res = run(w, ReplayConfig(max_batch_tokens=8))
    assert [e for e in res.timeline() if e[1] in ("first_token", "finish")] == [
        (0, "first_token", 1.0),
        (1, "first_token", 5.0),
        (0, "finish", 5.0),
        (1, "finish", 6.0),
    ]


def test_small_pool_preempts_and_recomputes(tmp_path):
    # prompt 14, 6 tokens: KV grows from 1 block (<= 16 tokens) to 2; a 3-block pool cannot hold both at 2
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(14, 6), seq(14, 6)], [14, 14]))
    res = run(w, ReplayConfig(kv_capacity_bytes=3 * BLOCK_BYTES))
    assert res.timeline() == [
        (0, "arrive", 0.0),
        (1, "arrive", 0.0),
        (0, "admit", 0.0),
        (1, "admit", 0.0),
        (0, "first_token", 1.0),
        (1, "first_token", 1.0),
        (1, "preempt", 3.0),
        (0, "finish", 6.0),
        (1, "admit", 6.0),
        (1, "finish", 9.0),
    ]
    assert res.metrics["preemptions"] == 1 and res.metrics["completed"] == 2
    assert res.metrics["peak_kv_bytes"] == 2 * BLOCK_BYTES
    assert res.requests["steps"].tolist() == [6, 6]  # the re-prefill rides B's next pass (vLLM RECOMPUTE)
    assert res.metrics["recomputed_tokens"] == 16 and res.metrics["total_output_tokens"] == 12  # not new demand
    out = write_simulated_trace(res, tmp_path / "sim")
    steps = read_trace(out).steps
    rebuild = steps[steps["note"] != ""]
    assert len(rebuild) == 1 and rebuild.iloc[0]["note"] == "recompute after preemption (16 tokens)"
    # B had 16 tokens of KV (14 prompt + 2 written by decodes): re-prefilled with its next decode row
    assert rebuild.iloc[0]["query_tokens"] == 17 and rebuild.iloc[0]["start_s"] == 6.0
    assert rebuild.iloc[0]["emitted_tokens"] == 1 and rebuild.iloc[0]["phase"] == "decode"


def test_the_head_joins_when_its_pages_fill_the_pool_exactly(tmp_path):
    """B (14-token prompt, 1 page) waits while A's prefill takes the 16-token budget; at A's first
    decode B's page and A's fill the 2-page pool exactly and B joins at once (the stretch planned
    from A's prefill must stop there, as a pass-by-pass loop would)."""
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(14, 3), seq(14, 2)], [14, 14]))
    res = run(w, ReplayConfig(kv_capacity_bytes=2 * BLOCK_BYTES, max_batch_tokens=16, chunked_prefill=False))
    assert [e for e in res.timeline() if e[1] == "admit"] == [(0, "admit", 0.0), (1, "admit", 1.0)]
    assert res.metrics["preemptions"] == 0 and res.metrics["peak_kv_bytes"] == 2 * BLOCK_BYTES


def test_small_pool_queues_without_dropping(tmp_path):
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(14, 2)] * 3, [14] * 3))
    res = run(w, ReplayConfig(kv_capacity_bytes=1 * BLOCK_BYTES))
    assert [e for e in res.timeline() if e[1] == "finish"] == [
        (0, "finish", 2.0),
        (1, "finish", 4.0),
        (2, "finish", 6.0),
    ]
    assert res.metrics["completed"] == 3 and res.metrics["preemptions"] == 0


def test_request_larger_than_pool_gets_error_row(tmp_path):
    reqs, prompts = [seq(4, 2), seq(40, 2), seq(4, 2)], [4, 40, 4]
    w = load_workload(write_toy_trace(tmp_path / "t", reqs, prompts, quality=[1.0, 0.0, 0.5]))
    res = run(w, ReplayConfig(kv_capacity_bytes=2 * BLOCK_BYTES))
    rows = res.requests
    assert rows["status"].tolist() == ["ok", "error", "ok"]
    assert "more than the whole pool" in rows.loc[1, "error"] and "toy-part" in rows.loc[1, "error"]
    assert res.metrics["completed"] == 2 and res.metrics["failed"] == 1
    # the failed request counts in no completed figure: tokens, latencies, quality
    ok = rows[rows["status"] == "ok"]
    assert res.metrics["total_output_tokens"] == ok["output_tokens"].sum() < rows["output_tokens"].sum()
    assert res.metrics["mean_e2el_ms"] == pytest.approx(ok["e2e_s"].mean() * 1e3)
    assert res.metrics["quality_mean"] == 0.75
    trace = read_trace(write_simulated_trace(res, tmp_path / "sim"))
    assert len(trace.requests) == 3 and trace.requests.loc[1, "status"] == "error"


def test_pool_from_device_memory_minus_weights(tmp_path):
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(14, 6)] * 2, [14] * 2))
    hw = toy_part(capacity_bytes=MODEL.weight_bytes + 3 * BLOCK_BYTES)
    res = run(w, ReplayConfig(memory_utilization=1.0), hardware=hw)
    assert res.kv_capacity_bytes == 3 * BLOCK_BYTES and res.metrics["preemptions"] == 1
    with pytest.raises(ValueError, match="leave no room for KV"):
        run(w, ReplayConfig(memory_utilization=1.0), hardware=toy_part(capacity_bytes=MODEL.weight_bytes))


def test_pasta_costs_fewer_passes_than_sequential_twin(tmp_path):
    k, length = 4, 10
    w = load_workload(write_toy_trace(tmp_path / "t", [pasta(8, k, length), seq(8, 2 + k * length)], [8, 8]))
    res = run(w, ReplayConfig(max_seqs=1))
    e2e = res.requests["e2e_s"].tolist()
    assert e2e[0] == 2 + length and e2e[1] - e2e[0] == 2 + k * length  # 12 passes, then 42 after them
    assert res.requests["steps"].tolist() == [12, 42]


def test_tip_holds_less_kv_than_sequential_twin(tmp_path):
    a = run(load_workload(write_toy_trace(tmp_path / "a", [tip(8, 6, 10)], [8])))
    b = run(load_workload(write_toy_trace(tmp_path / "b", [seq(8, 60)], [8])))
    assert a.metrics["peak_kv_bytes"] == 2 * BLOCK_BYTES and b.metrics["peak_kv_bytes"] == 5 * BLOCK_BYTES
    assert a.metrics["duration_s"] == b.metrics["duration_s"] == 60.0
    steps = read_trace(write_simulated_trace(a, tmp_path / "sim")).steps
    assert steps["evicted_tokens"].sum() == 40


def test_planned_diffusion_round_takes_longest_span_steps(tmp_path):
    spans = [10, 30, 20]
    res = run(load_workload(write_toy_trace(tmp_path / "t", [planned_diffusion(8, 4, spans)], [8])))
    assert res.metrics["duration_s"] == 4 + max(spans)  # 4 plan passes, then one pass per denoise step
    steps = read_trace(write_simulated_trace(res, tmp_path / "sim")).steps
    assert (steps["phase"] == "denoise").sum() == max(spans)
    assert res.metrics["total_output_tokens"] == 4 + sum(spans)


def test_simulated_trace_is_valid_and_says_what_it_is(small_trace, tmp_path):
    from simulator.hardware import get_hardware
    from simulator.models import get_model

    trace = read_trace(small_trace)
    res = replay(
        load_workload(small_trace),
        get_hardware("h100-sxm"),
        get_model("llama-3-8b"),
        ReplayConfig(rate=4.0, num_requests=7),
    )
    out = read_trace(write_simulated_trace(res, tmp_path / "sim"))
    assert problems(out) == []
    meta = out.meta
    assert meta["kind"] == "simulated" and meta["simulation"]["hardware"] == "h100-sxm"
    assert meta["model"]["name"] == "llama-3-8b" and meta["simulation"]["source_trace"] == str(small_trace)
    assert meta["simulation"]["batch"]["rate"] == 4.0 and meta["simulation"]["arrival"] == "poisson"
    q = trace.requests.set_index("request_id")["quality_score"]
    assert out.requests["quality_score"].tolist() == [q[i % 3] for i in range(7)]  # copied, never invented
    assert len(out.tokens) == sum(trace.requests.set_index("request_id")["output_tokens"][i % 3] for i in range(7))
    assert json.dumps(res.metrics)  # JSON-ready


STRETCH_CASES = {  # uniform(requests, prompt, output), config: each exercises another scheduling path
    "preempt": ((40, 30, 25), {}),
    "chunked": ((40, 100, 25), {"max_batch_tokens": 64}),  # every prefill in chunks, with preemptions
    "unchunked": ((40, 60, 40), {"max_batch_tokens": 128, "chunked_prefill": False}),
    "peak": ((40, 30, 25), {"reserve": "peak"}),
    "sjf": ((40, 30, 25), {"scheduler": "sjf", "max_batch_tokens": 64}),
    "pool": ((40, 30, 25), {"attention": "pool", "max_batch_tokens": 64}),  # keys: rows x the pool's high-water
}


def _stretch_runs(monkeypatch, case: str, run_one):
    """(stretches planned as usual, one pass at a time) of STRETCH_CASES[case] through `run_one`."""
    from simulator.hardware import get_hardware
    from simulator.models import get_model

    shape, extra = STRETCH_CASES[case]
    w, llama = uniform(*shape), get_model("llama-3-8b")
    cfg = ReplayConfig(rate=6.0, max_seqs=8, kv_capacity_bytes=20 * 16 * llama.kv_bytes_per_token, **extra)
    fast = run_one(w, get_hardware("l4"), llama, cfg)
    with monkeypatch.context() as mp:
        mp.setattr(replay_mod, "MAX_STRETCH_PASSES", 1)
        slow = run_one(w, get_hardware("l4"), llama, cfg)
    return fast, slow


def _assert_same_passes(fast, slow, case: str) -> None:
    m = fast.metrics
    assert m["passes"] == slow.metrics["passes"] and m["completed"] == 40
    assert (m["preemptions"] > 0) == (case != "peak") and (m["prefill_chunks"] > 0) == (
        case in ("chunked", "sjf", "pool")
    )
    for key in ("request", "batch_index", "query", "kv_read", "blocks", "emits", "rebuild", "final"):
        assert np.array_equal(fast.rows[key], slow.rows[key]), key  # the same batches, pass by pass
    per_request = [{r: [(n, t) for r2, n, t in res.timeline() if r2 == r] for r in range(40)} for res in (fast, slow)]
    for r in range(40):  # the same events per request (summed in another order: float noise only)
        (a, b) = (per_request[0][r], per_request[1][r])
        assert [n for n, _ in a] == [n for n, _ in b] and np.allclose([t for _, t in a], [t for _, t in b], rtol=1e-12)
    for key, v in m.items():
        if isinstance(v, float):
            assert math.isclose(v, slow.metrics[key], rel_tol=1e-9), key


@pytest.mark.parametrize("case", sorted(STRETCH_CASES))
def test_stretches_equal_pass_by_pass(monkeypatch, case):
    """Planning stretches of passes gives the timeline a pass-by-pass loop gives."""
    _assert_same_passes(*_stretch_runs(monkeypatch, case, replay), case)


@pytest.mark.parametrize("schedule", ["drain", "interleave"])
@pytest.mark.parametrize("case", ["chunked", "preempt"])
def test_pipeline_stretches_equal_pass_by_pass(monkeypatch, case, schedule):
    """PP 2: drained passes are planned in stretches (a pass's time is its own shape's) and give the
    pass-by-pass timeline; interleaved engines plan one pass at a time whatever the stretch limit
    (a pass's time depends on the other engines' passes in the stages), through the same paths."""
    from simulator.cluster.parallel import Parallelism
    from simulator.cluster.run import ClusterConfig, simulate

    deployment = ClusterConfig(Parallelism(pp=2, schedule=schedule))
    fast, slow = _stretch_runs(monkeypatch, case, lambda *a: simulate(*a, deployment))
    _assert_same_passes(fast, slow, case)
    assert fast.metrics["pp_schedule"] == schedule
    assert ("virtual_engine" in fast.requests.columns) == (schedule == "interleave")


def test_arrival_modes(tmp_path):
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 2)] * 4, [4] * 4))
    closed = run(w, ReplayConfig(concurrency=1))
    assert closed.requests["arrival_s"].tolist() == [0.0, 2.0, 4.0, 6.0]
    assert closed.requests["e2e_s"].tolist() == [2.0] * 4
    burst = run(w, ReplayConfig(rate=math.inf))
    assert burst.requests["arrival_s"].tolist() == [0.0] * 4 and burst.metrics["passes"] == 2
    cycled = run(
        load_workload(write_toy_trace(tmp_path / "c", [seq(4, 2)] * 3, [4] * 3, arrivals=[0.0, 1.0, 2.0])),
        ReplayConfig(num_requests=7),
    )
    assert cycled.requests["arrival_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # the pattern, repeated
    p1, p2 = run(w, ReplayConfig(rate=0.5, seed=3)), run(w, ReplayConfig(rate=0.5, seed=3))
    assert p1.requests["arrival_s"].tolist() == p2.requests["arrival_s"].tolist()
    assert p1.requests["arrival_s"].iloc[0] == 0.0 and p1.requests["arrival_s"].is_monotonic_increasing


def test_sjf_oracle_lets_the_short_job_pass(tmp_path):
    w = load_workload(
        write_toy_trace(tmp_path / "t", [seq(4, 2), seq(4, 20), seq(4, 2)], [4] * 3, arrivals=[0.0, 0.5, 0.5])
    )
    fcfs = run(w, ReplayConfig(max_seqs=1))
    sjf = run(w, ReplayConfig(max_seqs=1, scheduler="sjf", sjf_oracle=True))
    assert fcfs.requests["e2e_s"].tolist() == [2.0, 21.5, 23.5]
    assert sjf.requests["e2e_s"].tolist() == [2.0, 23.5, 3.5]


def test_sjf_ranks_by_what_a_server_knows(tmp_path):
    # B (prompt 8, 2 tokens) and C (prompt 4, 20 tokens) wait behind A; every request has max_tokens 32.
    # Without the oracle a server only sees equal max_tokens and prompts 8 vs 4: it runs C first.
    w = load_workload(
        write_toy_trace(tmp_path / "t", [seq(4, 2), seq(8, 2), seq(4, 20)], [4, 8, 4], arrivals=[0.0, 0.5, 0.5])
    )
    w = dataclasses.replace(w, source={**w.source, "knobs": {"max_tokens": 32}})
    known = run(w, ReplayConfig(max_seqs=1, scheduler="sjf"))
    oracle = run(w, ReplayConfig(max_seqs=1, scheduler="sjf", sjf_oracle=True))
    assert known.requests["e2e_s"].tolist() == [2.0, 23.5, 21.5]
    assert oracle.requests["e2e_s"].tolist() == [2.0, 3.5, 23.5]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"rate": -1.0}, "rate must be > 0"),
        ({"rate": float("nan")}, "rate must be > 0"),
        ({"concurrency": 0}, "concurrency"),
        ({"max_seqs": 0}, "max-seqs"),
        ({"max_batch_tokens": -5}, "max-batch-tokens"),
        ({"kv_capacity_bytes": 0}, "KV capacity"),
        ({"memory_utilization": 0.0}, "memory utilization"),
        ({"rate": 1.0, "concurrency": 2}, "not both"),
        ({"attention": "mask"}, "attention must be one of visible, pool"),
    ],
)
def test_bad_settings(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ReplayConfig(**kwargs)


def test_unknown_scheduler_lists_the_valid_ones():
    with pytest.raises(KeyError, match="fcfs, sjf"):
        ReplayConfig(scheduler="lottery")


def test_a_one_token_request_has_no_tpot(tmp_path):
    """TPOT is the time per output token after the first: a request that writes one token has none
    (NaN), and the run's TPOT figures are the other requests' alone."""
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 1), seq(4, 3)], [4, 4], arrivals=[0.0, 0.0]))
    res = run(w, ReplayConfig(max_seqs=2))
    tpot = res.requests["tpot_s"].tolist()
    assert np.isnan(tpot[0]) and tpot[1] == 1.0  # B: first token at 1 s, two more by 3 s
    m = res.metrics
    assert m["mean_tpot_ms"] == 1000.0 and m["p99_tpot_ms"] == 1000.0


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "kv_aware"])
def test_replica_stretches_equal_pass_by_pass(monkeypatch, router):
    """2 replicas (the chunked case: preemptions and prefill chunks on each): a replica's stretch runs
    on through arrivals routed elsewhere and is cut after the pass in which one routed to it lands,
    giving the pass-by-pass timeline."""
    from simulator.cluster.run import ClusterConfig, simulate

    deployment = ClusterConfig(replicas=2, router=router)
    fast, slow = _stretch_runs(monkeypatch, "chunked", lambda *a: simulate(*a, deployment))
    _assert_same_passes(fast, slow, "chunked")
    assert sorted(set(fast.requests["replica"].tolist())) == [0, 1]
