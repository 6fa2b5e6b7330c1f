"""Disaggregation (`simulator/cluster/disaggregation.py`) and the interleaved pipeline
(`simulator/cluster/pipeline.py`): exact small timelines worked out by hand on the made-up part,
and the invariants a deployment's figures keep (every pass run once, every KV sent once, the
costs of each side). Written against hand-made mutants of the two modules: each docstring says
what wrong code it fails on, where the timeline alone does not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from profiler.errors import UsageError
from simulator.cluster.parallel import ParallelCost, Parallelism, memory_plan
from simulator.cluster.run import ClusterConfig, simulate
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig
from simulator.workload import load_workload
from tests.simulator.cluster_helpers import HeadedLayer, by_request, one_second_stages, simulate_with
from tests.simulator.toy_traces import (
    BLOCK_BYTES,
    KV_BYTES_PER_TOKEN,
    MODEL_META,
    P,
    one_second_cost,
    seq,
    toy_part,
    write_toy_trace,
)

MODEL = ModelSpec.from_trace_meta(MODEL_META)  # 2 layers, 512 KV bytes a token


# ---- helpers (the round-number costs: tests/simulator/cluster_helpers.py) ----------------------
def trace(tmp_path, requests, arrivals, prompts=None):
    prompts = prompts or [p[0].q for p in requests]
    return load_workload(write_toy_trace(tmp_path / "t", requests, prompts, arrivals=arrivals))


def disagg(w, hw=None, pd=(1, 1), config=None, **cluster):
    """A P:D run on the made-up part: every pass 1 s (its step overhead), nothing else."""
    hw = hw or toy_part(interconnect_bytes_per_s=1e30)
    cfg = config or ReplayConfig(max_seqs=2)
    return simulate(
        w, hw, MODEL, cfg, ClusterConfig(disaggregate=pd, **cluster), params=one_second_cost(hw, MODEL).params
    )


def fake_transfers(monkeypatch, seconds: float = 0.25) -> list:
    """Replace the KV transfer's timing by `seconds` a send; return the calls' (bytes, workers, across)."""
    from simulator.cluster import disaggregation

    sent = []

    def fake(kind, nbytes, workers, hardware, topology, across_nodes):
        sent.append((kind, np.asarray(nbytes).tolist(), workers, across_nodes))
        return seconds + 0 * np.asarray(nbytes)

    monkeypatch.setattr(disaggregation, "collective_time_s", fake)
    return sent


# ---- disaggregation ------------------------------------------------------------------------------
def test_transfers_of_one_prefill_replica_queue_on_its_link(tmp_path, quarter_second_collectives):
    """1:1, A (3 passes) and B (2 passes) both at 0, prefilled together 0-1. Their KVs leave on the
    prefill replica's one link one after the other: A 1-1.25, B 1.25-1.5 (queued 0.25 s, a
    transfer's own time still 0.25 s). Decode: A alone 1.25-2.25 (B lands in that pass), then A
    and B 2.25-3.25. Every pass runs once (1 prefill + 2 decode passes = 3 s of device time), in
    batches numbered once across both sides. Fails if a transfer is timed from when it queued, if
    a link carries two at once, if the prefill's finish or the decode's arrive shows in the
    timeline, if the decode side's passes, batch numbers, pass mapping or busy time are lost, or
    if a request's start is its decode admission."""
    w = trace(tmp_path, [seq(4, 3), seq(4, 2)], [0.0, 0.0])
    res = disagg(w)
    assert res.extra["kv_transfers"] == [(0, 1.0, 1.25), (1, 1.25, 1.5)]
    assert res.timeline() == [
        (0, "arrive", 0.0),
        (1, "arrive", 0.0),
        (0, "admit", 0.0),
        (1, "admit", 0.0),
        (0, "first_token", 1.0),
        (1, "first_token", 1.0),
        (0, "admit", 1.25),  # the decode replica takes A when its transfer ends
        (1, "admit", 2.25),  # B's transfer ends at 1.5, mid-pass: it joins the next pass
        (0, "finish", 3.25),
        (1, "finish", 3.25),
    ]
    m = res.metrics
    assert m["mean_kv_transfer_ms"] == 250.0 and m["kv_transfers"] == 2
    assert m["kv_transfer_bytes"] == 2 * 4 * KV_BYTES_PER_TOKEN
    assert m["passes"] == 3 and m["device_busy_s"] == 3.0 and m["completed"] == 2
    assert m["total_output_tokens"] == 5 and m["duration_s"] == 3.25
    # each request's passes once, in order, each the workload's own pass
    assert by_request(res, "query") == {0: [4, 1, 1], 1: [4, 1]}
    assert by_request(res, "live") == {0: [4, 5, 6], 1: [4, 5]}
    assert by_request(res, "batch_index") == {0: [0, 1, 2], 1: [0, 2]}
    assert by_request(res, "start_s") == {0: [0.0, 1.25, 2.25], 1: [0.0, 2.25]}
    assert res.requests["ttft_s"].tolist() == [1.0, 1.0] and res.requests["e2e_s"].tolist() == [3.25, 3.25]
    assert res.requests["start_s"].tolist() == [0.0, 0.0]  # started on the prefill side, not on the decode side


def test_a_transfer_ending_mid_pass_joins_the_next_decode_pass(tmp_path, quarter_second_collectives):
    """A (4 passes) at 0: prefill 0-1, KV 1-1.25, decodes 1.25-2.25-3.25-4.25. B (2 passes) at 1.1:
    prefill 1.1-2.1, KV 2.1-2.35, landing in A's second decode pass: the decode replica takes it
    when that pass ends (3.25), as a request arriving at 2.35 (not at 2.1, when the KV left,
    which would end A's stretch after its first pass and replan at 2.35)."""
    w = trace(tmp_path, [seq(4, 4), seq(4, 2)], [0.0, 1.1])
    res = disagg(w)
    assert [(r, pytest.approx(s), pytest.approx(e)) for r, s, e in res.extra["kv_transfers"]] == [
        (0, 1.0, 1.25),
        (1, 2.1, 2.35),
    ]
    admits = [t for r, e, t in res.timeline() if e == "admit"]
    assert admits == [0.0, pytest.approx(1.1), 1.25, 3.25]
    assert by_request(res, "start_s") == {0: [0.0, 1.25, 2.25, 3.25], 1: [pytest.approx(1.1), 3.25]}
    assert res.requests["e2e_s"].tolist() == [4.25, pytest.approx(3.15)]


def test_each_prefill_replica_sends_on_its_own_link(tmp_path, quarter_second_collectives):
    """2:1, round robin: A on prefill replica 0, B on 1, both prefilled 0-1; each replica's link
    carries its own KV, so both transfers run 1-1.25 (one shared link would queue B to 1.5).
    Fails if the replicas share one link."""
    w = trace(tmp_path, [seq(4, 2), seq(4, 2)], [0.0, 0.0])
    res = disagg(w, pd=(2, 1))
    assert res.requests["replica"].tolist() == [0, 1] and res.requests["decode_replica"].tolist() == [0, 0]
    assert sorted(res.extra["kv_transfers"]) == [(0, 1.0, 1.25), (1, 1.0, 1.25)]
    assert res.requests["e2e_s"].tolist() == [2.25, 2.25]  # both decoded together 1.25-2.25
    assert res.metrics["gpus"] == 3


def test_a_one_pass_request_finishes_on_the_prefill_side(tmp_path, quarter_second_collectives):
    """A writes one token (its prefill is its whole answer): nothing to decode, no KV sent, done at
    its prefill's end; B's KV alone is sent and counted. Fails if A is sent to decode (before or
    after finishing), if the decode replicas are not told A is not theirs, if the bytes and count
    are every request's rather than the transfers', or if A's finish is the decode side's."""
    w = trace(tmp_path, [seq(4, 1), seq(6, 2)], [0.0, 0.0])
    res = disagg(w)
    assert res.extra["kv_transfers"] == [(1, 1.0, 1.25)]
    m = res.metrics
    assert m["kv_transfers"] == 1 and m["kv_transfer_bytes"] == 6 * KV_BYTES_PER_TOKEN
    assert m["completed"] == 2 and m["failed"] == 0 and m["passes"] == 2
    assert res.requests["e2e_s"].tolist() == [1.0, 2.25]
    assert res.requests["decode_replica"].tolist() == [-1, 0]
    assert res.requests["status"].tolist() == ["ok", "ok"]


def test_closed_loop_clients_wait_for_the_decode(tmp_path, quarter_second_collectives):
    """One closed-loop client (--concurrency 1): each request is sent when the previous one is
    done, on the decode side, or on the prefill side for a one-pass request.
      R0 (3 passes): prefill 0-1, KV 1-1.25, decodes 1.25-3.25, done 3.25
      R1 (1 pass):   arrives 3.25, prefill 3.25-4.25, done there
      R2 (2 passes): arrives 4.25, prefill -5.25, KV -5.5, decode -6.5
    Fails if a one-pass request is never reported done, if the decode replicas do not report
    theirs, or if a request counts as done at its prefill's end."""
    w = trace(tmp_path, [seq(4, 3), seq(4, 1), seq(4, 2)], [0.0] * 3)
    res = disagg(w, config=ReplayConfig(max_seqs=2, concurrency=1))
    assert res.requests["arrival_s"].tolist() == [0.0, 3.25, 4.25]
    assert res.requests["e2e_s"].tolist() == [3.25, 1.0, 2.25]
    assert res.metrics["completed"] == 3 and res.metrics["duration_s"] == 6.5


def test_a_request_refused_by_the_prefill_pool_is_not_sent(tmp_path, quarter_second_collectives):
    """B's prompt (40 tokens) is more than the 16-token pool: it fails on arrival at the prefill
    replica and its KV goes nowhere; A runs as usual."""
    w = trace(tmp_path, [seq(4, 2), seq(40, 2)], [0.0, 0.0])
    cfg = ReplayConfig(max_seqs=2, block_size=4, kv_capacity_bytes=16 * KV_BYTES_PER_TOKEN)
    res = disagg(w, config=cfg)
    assert res.extra["kv_transfers"] == [(0, 1.0, 1.25)]
    assert res.metrics["completed"] == 1 and res.metrics["failed"] == 1
    assert res.requests["status"].tolist() == ["ok", "error"]
    assert res.requests["decode_replica"].tolist() == [0, -1]


def test_a_disaggregated_run_where_nothing_can_run_is_refused(tmp_path):
    """Every prompt (40 tokens) is more than the 16-token pool: as on one replica (and under the
    interleaved schedule), one error line saying why, not a summary of 0 completed requests
    (the disaggregated run did not check, and printed one)."""
    w = trace(tmp_path, [seq(40, 2), seq(40, 3)], [0.0, 0.0])
    cfg = ReplayConfig(max_seqs=2, kv_capacity_bytes=16 * KV_BYTES_PER_TOKEN)
    with pytest.raises(
        UsageError, match="no request can run on toy-part with these settings: needs .* whole pool"
    ) as one:
        simulate(w, toy_part(), MODEL, cfg, ClusterConfig(), params=one_second_cost(toy_part(), MODEL).params)
    with pytest.raises(UsageError) as split:
        disagg(w, config=cfg)
    assert str(split.value) == str(one.value)


def test_replicas_where_nothing_can_run_are_refused(tmp_path):
    """The same prompts more than the pool, on two replicas behind the router: the same one error
    line as on one replica (the replicas did not check, and printed 0 completed requests)."""
    w = trace(tmp_path, [seq(40, 2), seq(40, 3)], [0.0, 0.0])
    cfg = ReplayConfig(max_seqs=2, kv_capacity_bytes=16 * KV_BYTES_PER_TOKEN)
    params = one_second_cost(toy_part(), MODEL).params
    with pytest.raises(UsageError) as one:
        simulate(w, toy_part(), MODEL, cfg, ClusterConfig(), params=params)
    with pytest.raises(UsageError) as two:
        simulate(w, toy_part(), MODEL, cfg, ClusterConfig(replicas=2), params=params)
    assert str(two.value) == str(one.value)


def test_a_request_that_starts_without_a_prefill_is_refused(tmp_path):
    """Disaggregation needs every request's leading prefill; one request of decode passes only
    (the other starts with its prefill) is refused."""
    w = trace(tmp_path, [seq(4, 2), [P("decode", 1, 5, 5, 1), P("decode", 1, 6, 6, 1)]], [0.0, 0.0], [4, 4])
    with pytest.raises(UsageError, match="some requests do not start with a prefill pass"):
        disagg(w)


def test_decode_replicas_on_another_part_use_its_memory_and_speed(tmp_path, quarter_second_collectives):
    """Decode on a part with room for 32 KV tokens (2 blocks) and slower memory: its pool, its
    pass times, its name; the prefill side keeps the big part's. A (8 passes, peak 11 tokens)
    runs; B (peak 43 tokens: 3 blocks) is prefilled, sent, and refused by the decode pool, in a
    message naming the decode part. Fails if decode passes are timed (or refusals worded) on
    the prefill part, if the decode pool is the prefill's, if the run's pool is the decode
    side's, if the decode side's errors are lost, or if the trace's capacity is one side's."""
    hw = toy_part(network_bytes_per_s=1e30)  # two parts: the KV crosses the NICs, in 0.25 s
    weights = memory_plan(hw, MODEL, Parallelism()).weight_bytes_per_gpu
    capacity = int(np.ceil((weights + 32 * KV_BYTES_PER_TOKEN) / 0.9)) + 1
    small = dataclasses.replace(
        toy_part(capacity_bytes=capacity, network_bytes_per_s=1e30), name="small-part", hbm_bytes_per_s=1e6
    )
    big_plan, small_plan = memory_plan(hw, MODEL, Parallelism()), memory_plan(small, MODEL, Parallelism())
    assert small_plan.kv_capacity_tokens == 32 < big_plan.kv_capacity_tokens
    w = trace(tmp_path, [seq(4, 8), seq(4, 40)], [0.0, 0.0])
    res = disagg(w, hw=hw, config=ReplayConfig(max_seqs=1), decode_hardware=small)
    m = res.metrics
    assert m["decode_hardware"] == "small-part" and m["decode_kv_capacity_tokens"] == 32
    assert m["decode_kv_pool_bytes_per_gpu"] == small_plan.kv_pool_bytes_per_gpu
    assert m["kv_capacity_bytes"] == big_plan.kv_capacity_bytes // BLOCK_BYTES * BLOCK_BYTES  # the prefill's pool
    assert res.kv_capacity_bytes == big_plan.kv_capacity_bytes + small_plan.kv_capacity_bytes
    assert res.requests["status"].tolist() == ["ok", "error"]
    assert "small-part" in res.requests["error"].iloc[1] and "more than the whole pool" in res.requests["error"].iloc[1]
    assert [r for r, _, _ in res.extra["kv_transfers"]] == [0, 1]  # B's prefill fit; its decode did not
    # A's decode passes take the small part's time: its TPOT is their mean
    slow = ParallelCost(small, MODEL, Parallelism(), one_second_cost(hw, MODEL).params)
    decode_s = [float(slow.step_time_s(1, kv, 1)) for kv in range(5, 12)]
    assert min(decode_s) > 1.01  # slower than the big part's 1 s
    assert res.requests["tpot_s"].iloc[0] == pytest.approx((0.25 + sum(decode_s)) / 7, rel=1e-9)
    assert res.requests["ttft_s"].iloc[0] == 1.0


def test_decode_kv_outgrowing_the_pool_preempts_on_the_decode_side(tmp_path, quarter_second_collectives):
    """A 3-block pool (16-token blocks): the two 14-token prompts (1 block each) prefill together,
    but their decodes reach 17-18 tokens (2 blocks each) on the decode replica, which preempts one.
    The run counts the decode side's preemptions and its peak (3 blocks; the prefill side's 2).
    Fails if the decode side's preemptions or peak are left out."""
    w = trace(tmp_path, [seq(14, 5), seq(14, 5)], [0.0, 0.0])
    cfg = ReplayConfig(max_seqs=2, kv_capacity_bytes=3 * BLOCK_BYTES)
    res = disagg(w, config=cfg)
    m = res.metrics
    assert m["completed"] == 2 and m["preemptions"] > 0
    assert m["preemptions"] == int(res.requests["preemptions"].sum())
    assert m["peak_kv_bytes"] == 3 * BLOCK_BYTES


@pytest.mark.parametrize(("tp", "path"), [(1, "node"), (2, "pcie")])
def test_the_kv_send_is_one_pair_of_gpus_on_its_link(tmp_path, tp, path):
    """1:1 replicas on an NVLink-pairs node (GPUs 2i and 2i + 1 bridged), numbered prefill first:
    of one GPU each, prefill GPU 0 sends to decode GPU 1 over their bridge; of TP 2 each, prefill
    GPUs 0, 1 send rank to rank to GPUs 2, 3, outside their pair: over PCIe. Either way a
    send/recv between two GPUs (not the ring of more), each rank its share. Fails if a TP-2 pair
    is timed over the bridge (the old rule), or the lone pair over PCIe."""
    from simulator.comm import collective_time_s

    hw = toy_part(topology="nvlink_pairs", interconnect_bytes_per_s=400e9, pcie_bytes_per_s=1e9)
    w = trace(tmp_path, [seq(64, 2)], [0.0])
    res = simulate(
        w,
        hw,
        MODEL,
        ReplayConfig(max_seqs=1),
        ClusterConfig(Parallelism(tp=tp), disaggregate=(1, 1)),
        params=one_second_cost(hw, MODEL).params,
    )
    shard = 64 * KV_BYTES_PER_TOKEN / tp
    expected = collective_time_s("send_recv", shard, 2, hw, topology="pcie" if path == "pcie" else None)
    bridge = collective_time_s("send_recv", shard, 2, hw)
    assert (expected > bridge) == (path == "pcie")
    assert res.metrics["kv_transfer_link"] == path and res.metrics["kv_transfer_across_nodes"] is False
    assert res.metrics["mean_kv_transfer_ms"] == pytest.approx(expected * 1e3, rel=1e-12)


def test_two_parts_send_the_kv_over_the_slower_nics(tmp_path, monkeypatch):
    """Prefill on one part, decode on another (2 GPUs in all: one node's worth): no node holds two
    kinds of GPU, so the KV crosses the NICs, at the slower part's rate (the decode part's 1e9 B/s
    against the prefill part's 1e30). Fails if the transfer is timed over the prefill part's node
    links (the old rule: the deployment fits one node), or at the faster NIC."""
    sent = []

    def fake(kind, nbytes, workers, hardware, topology, across_nodes):
        sent.append((hardware.network_bytes_per_s, across_nodes))
        return 0.25 + 0 * np.asarray(nbytes)

    from simulator.cluster import disaggregation

    monkeypatch.setattr(disaggregation, "collective_time_s", fake)
    hw = toy_part(network_bytes_per_s=1e30)
    other = dataclasses.replace(toy_part(network_bytes_per_s=1e9), name="other-part")
    res = simulate(
        trace(tmp_path, [seq(4, 2)], [0.0]),
        hw,
        MODEL,
        ReplayConfig(max_seqs=1),
        ClusterConfig(Parallelism(), disaggregate=(1, 1), decode_hardware=other),
        params=one_second_cost(hw, MODEL).params,
    )
    assert sent == [(1e9, True)]
    assert res.metrics["kv_transfer_link"] == "network"


def test_a_deployment_past_one_node_sends_over_the_nics(tmp_path, monkeypatch):
    """5:4 of one GPU each is 9 GPUs on 8-GPU nodes: the KV crosses nodes."""
    sent = fake_transfers(monkeypatch)
    res = disagg(trace(tmp_path, [seq(4, 2)], [0.0]), pd=(5, 4))
    assert [across for *_, across in sent] == [True] and res.metrics["kv_transfer_across_nodes"] is True
    assert sent[0][2] == 2  # a pair of GPUs


def test_each_side_priced_or_no_cost(tmp_path, monkeypatch):
    """Prefill at $3, decode at $1 an hour: the cost is each side's GPUs at its price, per million
    output tokens that over the tokens; the run has no single price. With the decode part unpriced
    there is no cost at all (not the prefill side's alone)."""
    import dataclasses

    fake_transfers(monkeypatch)
    hw = toy_part(interconnect_bytes_per_s=1e30, price_per_gpu_hour=3.0)
    w = trace(tmp_path, [seq(4, 3), seq(4, 2)], [0.0, 0.5])
    cheap = dataclasses.replace(hw, name="cheap", price_per_gpu_hour=1.0)
    m = disagg(w, hw=hw, pd=(1, 2), decode_hardware=cheap).metrics
    cost = m["duration_s"] / 3600 * (1 * 3.0 + 2 * 1.0)
    assert m["cost_usd"] == pytest.approx(cost)
    assert m["cost_per_million_output_tokens"] == pytest.approx(cost / 5 * 1e6)
    assert m["price_per_gpu_hour"] is None
    unpriced = dataclasses.replace(hw, name="unpriced", price_per_gpu_hour=None)
    m = disagg(w, hw=hw, pd=(1, 2), decode_hardware=unpriced).metrics
    assert m["cost_usd"] is None and m["cost_per_million_output_tokens"] is None


# ---- the interleaved pipeline ---------------------------------------------------------------------
def interleaved(tmp_path, requests, arrivals, pp=2, micro=None, replicas=1, overhead_s=0.0, layer=None, **config):
    hw = toy_part(interconnect_bytes_per_s=1e30)
    par = Parallelism(pp=pp, micro_batches=micro, schedule="interleave")
    cost = one_second_stages(hw, par, overhead_s=overhead_s, layer=layer)
    w = trace(tmp_path, requests, arrivals)
    return simulate_with(cost, w, hw, ClusterConfig(par, replicas=replicas), **config)


def test_host_work_holds_stage_one(tmp_path, quarter_second_collectives):
    """PP 2, two engines, host work 0.5 s a pass on stage 1's driver before its layer (1 s a
    stage, send/recv 0.25 s). A (3 passes) and B (2) at 0, on engines 0 and 1. A pass enters
    stage 1 at max(its engine's previous end, stage 1 free), stage 1 being busy through the host
    work and the layer:
      A1 host [0, 0.5]    s1 [0.5, 1.5]  s2 [1.75, 2.75]
      B1 host [1.5, 2]    s1 [2, 3]      s2 [3.25, 4.25]
      A2 host [3, 3.5]    s1 [3.5, 4.5]  s2 [4.75, 5.75]
      B2 host [4.5, 5]    s1 [5, 6]      s2 [6.25, 7.25]   B done 7.25
      A3 host [6, 6.5]    s1 [6.5, 7.5]  s2 [7.75, 8.75]   A done 8.75
    Busy (host work included) 8.75 s; on the GPUs 0.5-8.75 = 8.25 s, each stage 5 s of layers: a
    bubble of 3.25 s over 8.75. Fails if a pass enters stage 1 before it is free, if stage 1 is
    free during the host work, or if the busy time leaves the host work out."""
    res = interleaved(tmp_path, [seq(4, 3), seq(4, 2)], [0.0, 0.0], overhead_s=0.5)
    assert res.requests["virtual_engine"].tolist() == [0, 1]
    assert (res.requests["ttft_s"].tolist(), res.requests["e2e_s"].tolist()) == ([2.75, 4.25], [8.75, 7.25])
    assert by_request(res, "start_s") == {0: [0.0, 2.75, 5.75], 1: [0.0, 4.25]}
    assert by_request(res, "duration_s") == {0: [2.75, 3.0, 3.0], 1: [4.25, 3.0]}
    m = res.metrics
    assert m["device_busy_s"] == 8.75 and m["duration_s"] == 8.75
    assert m["pipeline_bubble_percent"] == pytest.approx(100 * 3.25 / 8.75)


def test_uneven_stages(tmp_path, quarter_second_collectives):
    """Stages of 1 s and 1.5 s (the lm_head on the last), send/recv 0.25 s, no host work; A (3
    passes) and B (2) at 0 on engines 0 and 1:
      A1 s1 [0, 1]        s2 [1.25, 2.75]
      B1 s1 [1, 2]        s2 [2.75, 4.25]   (waits for stage 2)
      A2 s1 [2.75, 3.75]  s2 [4.25, 5.75]
      B2 s1 [4.25, 5.25]  s2 [5.75, 7.25]   B done 7.25
      A3 s1 [5.75, 6.75]  s2 [7.25, 8.75]   A done 8.75 (stage 2 busy until 7.25)
    Busy 8.75 s, 5 passes x 2.5 s of layers over 2 stages = 6.25: bubble 2.5 s. Fails if a
    pass does not wait for a busy stage, if stage 1 is timed as the last, or if the work is the
    slowest stage's."""
    res = interleaved(tmp_path, [seq(4, 3), seq(4, 2)], [0.0, 0.0], layer=HeadedLayer())
    assert res.requests["e2e_s"].tolist() == [8.75, 7.25] and res.requests["ttft_s"].tolist() == [2.75, 4.25]
    m = res.metrics
    assert m["device_busy_s"] == 8.75 and m["pipeline_bubble_percent"] == pytest.approx(100 * 2.5 / 8.75)


def test_more_batches_in_flight_than_stages(tmp_path, quarter_second_collectives):
    """PP 2 with --micro-batches 3: three engines (each 1/3 of the pool) share the two stages.
    Three requests of 2 passes at 0, one an engine:
      R0 s1 [0, 1] s2 [1.25, 2.25];  R1 s1 [1, 2] s2 [2.25, 3.25];  R2 s1 [2, 3] s2 [3.25, 4.25]
      R0 s1 [3, 4] s2 [4.25, 5.25];  R1 s1 [4, 5] s2 [5.25, 6.25];  R2 s1 [5, 6] s2 [6.25, 7.25]
    Busy 7.25 s, 6 s of layers a stage: bubble 1.25 s."""
    res = interleaved(tmp_path, [seq(4, 2)] * 3, [0.0] * 3, micro=3, max_seqs=3)
    assert res.requests["virtual_engine"].tolist() == [0, 1, 2]
    assert res.requests["ttft_s"].tolist() == [2.25, 3.25, 4.25]
    assert res.requests["e2e_s"].tolist() == [5.25, 6.25, 7.25]
    m = res.metrics
    assert m["micro_batches"] == 3 and m["device_busy_s"] == 7.25
    assert m["pipeline_bubble_percent"] == pytest.approx(100 * 1.25 / 7.25)


@pytest.mark.parametrize("replicas", [1, 2])
def test_kv_peak_is_the_most_pages_held_at_once(tmp_path, replicas):
    """Small requests (2 passes, 1 block) and big ones (40 passes, up to 43 tokens: 3 blocks) at 0.
    One replica, small then big: they ride its two engines, the small one's block freed when it
    ends, so the replica's peak is the big one's 3 blocks (not the small one's block kept past its
    end, 4). Two replicas (round robin), big, small, small, big: each replica a big one on one
    engine and a small one on the other; the run's peak is one replica's, 3 (not the two
    replicas' peaks summed, nor their engines' pages mixed, 6). Both as the drained schedule,
    whose one batch a replica holds them in one pool; and the pool is the engines' shares
    together, as drained. Fails if a finished engine's pages are kept, if the replicas' peaks are
    summed or their engines' pages counted together, or if a replica's engines include the next
    one's first."""
    hw = toy_part()
    small, big = seq(4, 2), seq(4, 40)
    w = trace(tmp_path, [small, big] if replicas == 1 else [big, small, small, big], [0.0] * 2 * replicas)
    shown = {}
    for schedule in ("drain", "interleave"):
        deployment = ClusterConfig(Parallelism(pp=2, schedule=schedule), replicas=replicas)
        res = simulate(w, hw, MODEL, ReplayConfig(max_seqs=2), deployment, params=one_second_cost(hw, MODEL).params)
        assert res.metrics["completed"] == 2 * replicas
        shown[schedule] = (res.metrics["peak_kv_bytes"], res.metrics["kv_capacity_bytes"])
    assert shown["drain"][0] == shown["interleave"][0] == 3 * BLOCK_BYTES
    assert 0 <= shown["drain"][1] - shown["interleave"][1] < 2 * BLOCK_BYTES  # each engine's share in whole blocks


def test_a_chunked_prefill_holds_its_chunks_pages(tmp_path, quarter_second_collectives):
    """Stages of 1 s, send/recv 0.25 s. B (4 tokens, 1 block, one pass) on engine 0: s1 [0, 1],
    s2 [1.25, 2.25]. A's 40-token prompt (3 blocks) in chunks of 16 tokens on engine 1: the first
    s1 [1, 2] s2 [2.25, 3.25], holding its pages (2 blocks, the replay's rows say) beside B's 1
    block; its next chunks (3 blocks) after B is done. The replica's peak is 3 blocks (not A's
    whole prompt held from its first chunk beside B's block, 4)."""
    res = interleaved(tmp_path, [seq(4, 1), seq(40, 2)], [0.0, 0.0], max_batch_tokens=16)
    assert res.metrics["completed"] == 2 and res.metrics["prefill_chunks"] == 2
    assert by_request(res, "query") == {0: [4], 1: [16, 16, 8, 1]}
    assert by_request(res, "blocks") == {0: [1], 1: [2, 3, 3, 3]}
    assert by_request(res, "start_s") == {0: [0.0], 1: [0.0, 3.25, 5.5, 7.75]}
    assert res.requests["e2e_s"].tolist() == [2.25, 10.0]
    assert res.metrics["peak_kv_bytes"] == 3 * BLOCK_BYTES


def test_a_replicas_engines_report_their_requests_next_pages(tmp_path):
    """The replica router sees a replica's engines as one (`EngineGroup`): the next pass's query
    tokens and pages of each request waiting on it are those its engine has for it. Two replicas
    of two engines, round robin: R0, R2 on replica 0's engines, R1, R3 on replica 1's (engines 2
    and 3)."""
    from simulator.cluster.pipeline import PipelinedCluster

    hw = toy_part()
    cost = ParallelCost(hw, MODEL, Parallelism(pp=2, schedule="interleave"), one_second_cost(hw, MODEL).params)
    w = trace(tmp_path, [seq(4, 2), seq(20, 2), seq(36, 2), seq(52, 2)], [0.0] * 4)
    cluster = PipelinedCluster(w, cost, MODEL, hw, ReplayConfig(), 2**24, 2, "round_robin")
    for r in range(4):
        cluster.arrive(r, 0.0)
    assert cluster.owner.tolist() == [0, 2, 1, 3]
    for group, mine in zip(cluster.groups, ([0, 2], [1, 3])):
        assert sorted(group.waiting) == mine
        q, blocks = group.next_tokens_and_blocks(mine)
        own = [e.next_tokens_and_blocks([r]) for r in mine for e in cluster.engines() if r in e.waiting]
        assert q.tolist() == [int(o[0][0]) for o in own] == [w.query_tokens[w.pass_starts[r]] for r in mine]
        assert blocks.tolist() == [int(o[1][0]) for o in own] and min(blocks) > 0


@pytest.mark.parametrize("replicas", [1, 2])
def test_requests_per_replica_as_under_drain(tmp_path, replicas):
    """One request: with one replica no per-replica count (as the drained run); with two, one
    replica idle is counted as 0."""
    hw = toy_part()
    w = trace(tmp_path, [seq(4, 2)], [0.0])
    shown = {}
    for schedule in ("drain", "interleave"):
        deployment = ClusterConfig(Parallelism(pp=2, schedule=schedule), replicas=replicas)
        m = simulate(w, hw, MODEL, ReplayConfig(), deployment, params=one_second_cost(hw, MODEL).params).metrics
        shown[schedule] = m.get("requests_per_replica", "absent")
    assert shown["interleave"] == shown["drain"] == ("absent" if replicas == 1 else [1, 0])


def test_a_refusal_blames_the_engines_share_only_when_it_is_the_cause(tmp_path):
    """Engines of half the pool: a request whose peak (16 tokens) is exactly an engine's share
    fits; refused for its 4-token prefill over --max-batch-tokens 3, the message is the drained
    schedule's, without the engine's share."""
    hw = toy_part()
    w = trace(tmp_path, [seq(4, 5)], [0.0])
    cfg = ReplayConfig(
        block_size=4, kv_capacity_bytes=2 * 16 * KV_BYTES_PER_TOKEN, max_batch_tokens=3, chunked_prefill=False
    )
    said = {}
    for schedule in ("drain", "interleave"):
        with pytest.raises(UsageError) as err:
            simulate(w, hw, MODEL, cfg, ClusterConfig(Parallelism(pp=2, schedule=schedule)))
        said[schedule] = str(err.value)
    assert "exceeds max-batch-tokens 3" in said["drain"] and said["interleave"] == said["drain"]
