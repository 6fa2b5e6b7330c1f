"""Cluster what-if: exact timelines on a made-up part for TP, PP and replicas; per-GPU memory."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import comm
from simulator.cluster.parallel import (
    ParallelCost,
    Parallelism,
    memory_plan,
    stage_layers,
)
from simulator.cluster.run import ClusterConfig, comm_shares, simulate
from simulator.comm import CommParams, Ramp
from simulator.hardware import GIB, get_hardware, override
from simulator.models import ModelSpec, get_model
from simulator.replay import ReplayConfig, replay
from simulator.workload import load_workload
from tests.simulator.cluster_helpers import HeadedLayer, one_second_stages, simulate_with
from tests.simulator.toy_traces import (
    BLOCK_BYTES,
    MODEL_META,
    one_second_cost,
    seq,
    toy_part,
    write_toy_trace,
)

MODEL = ModelSpec.from_trace_meta(MODEL_META)  # 2 layers


def two_requests(tmp_path):
    # A: prefill + 2 decodes at t = 0; B: prefill + 1 decode at t = 0.5
    return load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3), seq(4, 2)], [4, 4], arrivals=[0.0, 0.5]))


def test_tp2_two_all_reduces_a_layer(tmp_path, quarter_second_collectives):
    hw = toy_part(interconnect_bytes_per_s=1e30)
    cost = ParallelCost(hw, MODEL, Parallelism(tp=2), one_second_cost(hw, MODEL).params)
    parts = cost.breakdown(4, 10, 1)
    assert parts["all_reduce_s"][0] == 2 * 2 * 0.25  # 2 layers x 2 all-reduces x 0.25 s
    assert cost.step_time_s(4, 10, 1) == pytest.approx(2.0)  # 1 s step overhead + 1 s of all-reduces
    res = simulate(
        two_requests(tmp_path),
        hw,
        MODEL,
        ReplayConfig(max_seqs=2),
        ClusterConfig(Parallelism(tp=2)),
        params=one_second_cost(hw, MODEL).params,
    )
    assert [(r, e, pytest.approx(t)) for r, e, t in res.timeline()] == [
        (0, "arrive", 0.0),
        (0, "admit", 0.0),
        (1, "arrive", 0.5),
        (0, "first_token", 2.0),
        (1, "admit", 2.0),
        (1, "first_token", 4.0),
        (0, "finish", 6.0),
        (1, "finish", 6.0),
    ]
    assert res.metrics["gpus"] == 2 and res.metrics["comm_share_percent"] == pytest.approx(50.0)


def test_pp2_pipeline_bubbles(tmp_path, quarter_second_collectives):
    hw = toy_part(interconnect_bytes_per_s=1e30)
    cost = one_second_stages(hw, Parallelism(pp=2, micro_batches=2))
    # one stream: 1 micro-batch, stage 1 s + send 0.25 s + stage 1 s; each stage idle 1.25 of 2.25 s
    one = cost.breakdown(4, 10, 1)
    assert (one["total_s"][0], one["send_recv_s"][0], one["bubble_s"][0]) == (2.25, 0.25, 1.25)
    # two streams: 2 micro-batches, 1 + 0.25 + 1 + one more bottleneck step of 1 s = 3.25 s
    two = cost.breakdown(8, 20, 2)
    assert (two["total_s"][0], two["bubble_s"][0]) == (3.25, 1.25)
    res = replay(two_requests(tmp_path), hw, MODEL, ReplayConfig(max_seqs=2), cost=cost)
    assert res.timeline() == [
        (0, "arrive", 0.0),
        (0, "admit", 0.0),
        (1, "arrive", 0.5),
        (0, "first_token", 2.25),
        (1, "admit", 2.25),
        (1, "first_token", 5.5),
        (0, "finish", 8.75),
        (1, "finish", 8.75),
    ]
    assert stage_layers(80, 3) == [27, 27, 26]


def test_pp2_interleave_keeps_two_batches_in_flight(tmp_path, quarter_second_collectives):
    """Two virtual engines (vLLM's PP schedule) on the drain test's part and requests.

    Each stage takes 1 s a pass (one layer of 1 s, whatever the batch), a send/recv 0.25 s, no host
    work: alone in the pipeline a pass takes t_1 + c + t_2 = 2.25 s. A (3 passes) arrives at 0 and
    goes to engine 0, B (2 passes) at 0.5 to engine 1 (the fewest unfinished requests). Each pass
    enters stage 1 at max(its engine's previous pass's end, stage 1 free), stage 2 at
    max(its stage-1 end + c, stage 2 free):
      A1  stage 1 [0, 1]        stage 2 [1.25, 2.25]  A's first token 2.25
      B1  stage 1 [1, 2]        stage 2 [2.25, 3.25]  B admitted at 0.5 (its engine is idle), token 3.25
      A2  stage 1 [2.25, 3.25]  stage 2 [3.5, 4.5]
      B2  stage 1 [3.25, 4.25]  stage 2 [4.5, 5.5]    B finishes 5.5
      A3  stage 1 [4.5, 5.5]    stage 2 [5.75, 6.75]  A finishes 6.75
    The drain schedule finishes both at 8.75 (test above). Bubble: busy 6.75 s, each stage runs
    5 passes x 1 s, so idle 1.75 s of 6.75 (drain: 3 x 1.25 s idle of 8.75 s)."""
    from simulator.cluster.pipeline import bubble_percent, replay_interleaved

    hw = toy_part(interconnect_bytes_per_s=1e30)
    cost = one_second_stages(hw, Parallelism(pp=2, schedule="interleave"))
    res, pipelines = replay_interleaved(two_requests(tmp_path), hw, MODEL, ReplayConfig(max_seqs=2), cost)
    assert res.timeline() == [
        (0, "arrive", 0.0),
        (0, "admit", 0.0),
        (1, "arrive", 0.5),
        (1, "admit", 0.5),
        (0, "first_token", 2.25),
        (1, "first_token", 3.25),
        (1, "finish", 5.5),
        (0, "finish", 6.75),
    ]
    assert res.requests["virtual_engine"].tolist() == [0, 1]
    assert sorted(res.rows["duration_s"].tolist()) == [2.25, 2.25, 2.25, 2.25, 2.75]  # B1 waits 0.5 s for stage 1
    assert res.metrics["passes"] == 5 and res.metrics["device_busy_s"] == 6.75
    assert bubble_percent(pipelines) == pytest.approx(100 * 1.75 / 6.75)
    drained = replay(two_requests(tmp_path), hw, MODEL, ReplayConfig(max_seqs=2), cost=cost)
    assert comm_shares(drained, cost)["pipeline_bubble_percent"] == pytest.approx(100 * 3 * 1.25 / 8.75)
    # the replica's pool is its engines' halves together; both hold A's and B's pages at once
    assert res.metrics["kv_capacity_bytes"] == pytest.approx(drained.metrics["kv_capacity_bytes"], rel=1e-6)
    assert res.metrics["peak_kv_bytes"] == drained.metrics["peak_kv_bytes"] > 0


def test_pp2_interleave_on_two_replicas(tmp_path, quarter_second_collectives):
    """2 replicas x 2 engines, 4 requests at 0: round robin picks the replica (0, 1, 0, 1), then the
    engine with the fewest unfinished requests (0, 0, 1, 1). Each replica is the one-replica
    pipeline of the test above with both its requests at 0 (stages 1 s, send/recv 0.25 s):
      replica 0: R0 (3 passes) s1 [0,1] s2 [1.25,2.25]; R2 (3) s1 [1,2] s2 [2.25,3.25];
                 R0 [2.25,3.25] [3.5,4.5]; R2 [3.25,4.25] [4.5,5.5]; R0 [4.5,5.5] [5.75,6.75];
                 R2 [5.5,6.5] [6.75,7.75]
      replica 1: R1 (2 passes) ends 2.25 and 4.5; R3 (2) ends 3.25 and 5.5
    Bubble: replica 0 busy 7.75 s, 6 passes a stage: idle 1.75; replica 1 busy 5.5, 4: idle 1.5."""
    hw = toy_part(interconnect_bytes_per_s=1e30)
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3), seq(4, 2)] * 2, [4] * 4, arrivals=[0.0] * 4))
    par = Parallelism(pp=2, schedule="interleave")
    res = simulate_with(one_second_stages(hw, par), w, hw, ClusterConfig(par, replicas=2))
    assert res.requests["replica"].tolist() == [0, 1, 0, 1] and res.requests["virtual_engine"].tolist() == [0, 0, 1, 1]
    ttft = (res.requests["arrival_s"] + res.requests["ttft_s"]).tolist()
    assert ttft == [2.25, 2.25, 3.25, 3.25] and res.requests["e2e_s"].tolist() == [6.75, 4.5, 7.75, 5.5]
    assert res.metrics["requests_per_replica"] == [2, 2] and res.metrics["gpus"] == 4
    assert res.metrics["device_busy_s"] == 7.75 + 5.5
    assert res.metrics["pipeline_bubble_percent"] == pytest.approx(100 * (1.75 + 1.5) / (7.75 + 5.5))


def test_interleave_steady_state_runs_a_pass_per_bottleneck_stage(tmp_path, monkeypatch):
    """4 requests of 10 passes at 0, PP 2, stages 1 s, free send/recv, no host work.
    drain: one batch of 4 streams in 2 micro-batches, 1 + 1 + (2 - 1) x 1 = 3 s a pass: 30 s, each
    stage idle 1 s of 3. interleave: 2 engines of 2 requests; engine 0's passes end at 2, 4, ..., 20,
    engine 1's (one stage behind) at 3, 5, ..., 21: a pass a second (1 / max_s t_s) once both are
    in flight, idle 1 s of 21 (the fill and the drain)."""
    ramp = Ramp(eff_max=1.0, ramp_bytes=1e-30, ramp_exponent=1.0, latency_s=0.0)
    monkeypatch.setattr(comm, "load_params", lambda: CommParams({p: {"ring": ramp, "p2p": ramp} for p in comm.PATHS}))
    hw = toy_part(interconnect_bytes_per_s=1e30, network_bytes_per_s=1e30)
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 10)] * 4, [4] * 4, arrivals=[0.0] * 4))
    out = {}
    for schedule in ("drain", "interleave"):
        par = Parallelism(pp=2, schedule=schedule)
        out[schedule] = simulate_with(one_second_stages(hw, par), w, hw, ClusterConfig(par), max_seqs=4).metrics
    assert out["drain"]["duration_s"] == pytest.approx(30.0) and out["interleave"]["duration_s"] == pytest.approx(21.0)
    assert out["drain"]["pipeline_bubble_percent"] == pytest.approx(100 / 3)
    assert out["interleave"]["pipeline_bubble_percent"] == pytest.approx(100 / 21)


def _same_timeline(a, b) -> None:
    """Equal timelines (times up to float summation order) and the same passes."""
    ta, tb = a.timeline(), b.timeline()
    assert [(r, e) for r, e, _ in ta] == [(r, e) for r, e, _ in tb]
    assert np.allclose([t for *_, t in ta], [t for *_, t in tb], rtol=1e-12, atol=0)
    assert a.metrics["passes"] == b.metrics["passes"]
    assert np.allclose(np.sort(a.rows["duration_s"]), np.sort(b.rows["duration_s"]), rtol=1e-12)


@pytest.mark.parametrize("case", ["one batch in flight", "one request", "pp 1"])
def test_schedules_agree_without_a_second_batch(tmp_path, quarter_second_collectives, case):
    """One batch in flight (--micro-batches 1), a lone request, or one stage: interleave = drain."""
    from simulator.cluster import pipeline as pipeline_mod

    hw = toy_part(interconnect_bytes_per_s=1e30)
    lone = case == "one request"
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 5)], [4])) if lone else two_requests(tmp_path)
    micro, pp = (1, 2) if case == "one batch in flight" else (None, 1 if case == "pp 1" else 2)
    out = {}
    for schedule in ("drain", "interleave"):
        par = Parallelism(pp=pp, micro_batches=micro, schedule=schedule)
        cost = one_second_stages(hw, par, overhead_s=0.5) if pp > 1 else ParallelCost(hw, MODEL, par)
        out[schedule] = simulate_with(cost, w, hw, ClusterConfig(par))
    _same_timeline(out["drain"], out["interleave"])
    for key in ("pipeline_bubble_percent", "send_recv_share_percent", "comm_share_percent", "peak_kv_bytes"):
        assert out["drain"].metrics[key] == pytest.approx(out["interleave"].metrics[key]), key
    assert out["interleave"].metrics["pp_schedule"] == (None if pp == 1 else "interleave")
    if pp > 1:  # 0.5 s host + 1 s + 0.25 s + 1 s a pass; idle (2.25 - 1) s of each 2.75 s pass
        assert out["drain"].metrics["pipeline_bubble_percent"] == pytest.approx(100 * 1.25 / 2.75)
    assert pipeline_mod.VirtualEngine.one_pass_at_a_time


def test_bad_pp_schedules(tmp_path, small_trace, capsys):
    from solm.cli import main

    with pytest.raises(ValueError, match="--pp-schedule must be one of drain, interleave"):
        Parallelism(pp=2, schedule="gpipe")
    # each batch in flight holds 1/M of the pool (vLLM V0): a request that fits the whole pool only
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 5)], [4]))  # peak 16 KV tokens: the 4-block pool
    cfg = ReplayConfig(block_size=4, kv_capacity_bytes=4 * 4 * MODEL.kv_bytes_per_token)
    hw = toy_part()
    assert simulate(w, hw, MODEL, cfg, ClusterConfig(Parallelism(pp=2))).metrics["completed"] == 1
    with pytest.raises(ValueError, match=r"no request can run .*\(its engine's 1/2 of the replica's pool"):
        simulate(w, hw, MODEL, cfg, ClusterConfig(Parallelism(pp=2, schedule="interleave")))
    args = ["simulate", str(small_trace), "--model", "llama-3-8b", "--hardware", "h100-sxm", "--pp", "2"]
    assert main([*args, "--pp-schedule", "zigzag"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pp-schedule must be one of drain, interleave, got 'zigzag'" in err[0]


def test_two_replicas_round_robin(tmp_path):
    hw = toy_part()
    w = load_workload(
        write_toy_trace(tmp_path / "t", [seq(4, 3), seq(4, 2), seq(4, 2)], [4, 4, 4], arrivals=[0.0, 0.5, 1.0])
    )
    res = simulate(
        w,
        hw,
        MODEL,
        ReplayConfig(max_seqs=2),
        ClusterConfig(replicas=2, router="round_robin"),
        params=one_second_cost(hw, MODEL).params,
    )
    assert res.timeline() == [
        (0, "arrive", 0.0),
        (0, "admit", 0.0),
        (1, "arrive", 0.5),
        (1, "admit", 0.5),
        (0, "first_token", 1.0),
        (2, "arrive", 1.0),
        (2, "admit", 1.0),
        (1, "first_token", 1.5),
        (2, "first_token", 2.0),
        (1, "finish", 2.5),
        (0, "finish", 3.0),
        (2, "finish", 3.0),
    ]
    assert res.requests["replica"].tolist() == [0, 1, 0]
    assert res.metrics["gpus"] == 2 and res.metrics["requests_per_replica"] == [2, 1]
    assert res.metrics["passes"] == 5 and res.metrics["device_busy_s"] == 5.0


def test_replicas_merge_their_memory_and_preemptions(tmp_path):
    """Round robin sends the two small requests to replica 0 and the two that outgrow a 3-block
    pool to replica 1: the cluster's peak KV is replica 1's (the largest), its preemption replica
    1's one, its pools the two replicas' together; as replica 1 alone on its own requests."""
    hw = toy_part()
    reqs, prompts = [seq(4, 1), seq(14, 6), seq(4, 1), seq(14, 6)], [4, 14, 4, 14]
    arrivals = [0.0, 0.0, 1.0, 1.0]  # the one-pass small ones one after the other
    cfg, params = ReplayConfig(kv_capacity_bytes=3 * BLOCK_BYTES), one_second_cost(hw, MODEL).params

    def run(idx, replicas):
        w = load_workload(
            write_toy_trace(
                tmp_path / f"t{idx}",
                [reqs[i] for i in idx],
                [prompts[i] for i in idx],
                arrivals=[arrivals[i] for i in idx],
            )
        )
        return simulate(w, hw, MODEL, cfg, ClusterConfig(replicas=replicas, router="round_robin"), params=params)

    both, small, big = run([0, 1, 2, 3], 2), run([0, 2], 1), run([1, 3], 1)
    assert both.requests["replica"].tolist() == [0, 1, 0, 1]
    assert small.metrics["preemptions"] == 0 and big.metrics["preemptions"] == both.metrics["preemptions"] > 0
    assert small.metrics["peak_kv_bytes"] < big.metrics["peak_kv_bytes"] == both.metrics["peak_kv_bytes"]
    assert both.kv_capacity_bytes == 2 * big.kv_capacity_bytes == 6 * BLOCK_BYTES
    assert both.metrics["device_busy_s"] == small.metrics["device_busy_s"] + big.metrics["device_busy_s"]


@pytest.mark.parametrize("arrival_c", [1.5, 2.0])
def test_a_replicas_stretch_is_cut_where_its_arrivals_land(tmp_path, monkeypatch, arrival_c):
    """Round robin over 2 replicas, one-second passes: at 0 s (A and B arrived) replica 0 plans A's
    passes up to the arrival after next (D at 5 s, for replica 1); C, routed to replica 0 within
    A's second pass or exactly at its end, cuts the stretch after that pass and is admitted at 2 s
    (a lone replay's timeline: the pass-by-pass one)."""
    import simulator.replay as replay_mod

    hw = toy_part()
    arrivals = [0.0, 0.0, arrival_c, 5.0]
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 8)] + [seq(4, 2)] * 3, [4] * 4, arrivals=arrivals))

    def run():
        cfg, deployment = ReplayConfig(max_seqs=8), ClusterConfig(replicas=2, router="round_robin")
        return simulate(w, hw, MODEL, cfg, deployment, params=one_second_cost(hw, MODEL).params)

    fast = run()
    monkeypatch.setattr(replay_mod, "MAX_STRETCH_PASSES", 1)
    assert fast.timeline() == run().timeline()
    assert fast.requests["replica"].tolist() == [0, 1, 0, 1]
    assert (2, "admit", 2.0) in fast.timeline() and fast.metrics["passes"] == 8 + 2 + 2  # C rides A's passes


@pytest.mark.parametrize("schedule", ["drain", "interleave"])  # drain: pp 1; interleave: pp 2, 2 engines
@pytest.mark.parametrize("router", ["least_outstanding", "kv_aware"])
def test_load_aware_routers_spread_a_burst(tmp_path, router, schedule):
    hw = toy_part()
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3)] * 4, [4] * 4, arrivals=[0.0] * 4))
    res = simulate(
        w,
        hw,
        MODEL,
        ReplayConfig(max_seqs=4),
        ClusterConfig(Parallelism(pp=1 if schedule == "drain" else 2, schedule=schedule), replicas=2, router=router),
        params=one_second_cost(hw, MODEL).params,
    )
    assert sorted(res.metrics["requests_per_replica"]) == [2, 2] and res.metrics["completed"] == 4


def test_memory_70b_tp1_error_tp4_fits():
    h100 = override("h100-sxm", name="made-up-80g", hbm_capacity_bytes=80 * GIB)
    model = get_model("llama-3-70b")
    with pytest.raises(ValueError, match="leave no room for KV"):
        memory_plan(h100, model, Parallelism(tp=1))
    plan = memory_plan(h100, model, Parallelism(tp=4))
    usable = int(80 * GIB * 0.9)
    assert plan.usable_bytes_per_gpu == usable
    assert plan.weight_bytes_per_gpu == pytest.approx(model.weight_bytes / 4, rel=0.01)
    per_token = model.kv_bytes_per_token // 4  # 8 KV heads over 4 ranks
    assert plan.kv_bytes_per_token_per_gpu == per_token
    assert plan.kv_capacity_tokens == (usable - plan.weight_bytes_per_gpu) // per_token
    assert 0 <= usable - plan.weight_bytes_per_gpu - plan.kv_pool_bytes_per_gpu < per_token  # KV = what is left
    assert plan.kv_capacity_bytes == plan.kv_capacity_tokens * model.kv_bytes_per_token
    # KV heads replicate past 8 ranks: TP 16 holds one head per rank, as TP 8 does
    assert memory_plan(h100, model, Parallelism(tp=16)).kv_bytes_per_token_per_gpu == per_token // 2


def test_bad_splits():
    model = get_model("llama-3-70b")
    with pytest.raises(ValueError, match="does not divide"):
        ParallelCost(toy_part(), model, Parallelism(tp=3))
    with pytest.raises(ValueError, match="exceeds"):
        ParallelCost(toy_part(), model, Parallelism(pp=81))
    with pytest.raises(ValueError):
        Parallelism(tp=0)
    with pytest.raises(KeyError, match="valid names"):
        ClusterConfig(replicas=2, router="random")


def test_tp1_single_replica_is_the_plain_replay(tmp_path):
    from simulator.replay import replay

    hw = toy_part()
    w = two_requests(tmp_path)
    params = one_second_cost(hw, MODEL).params
    plain = replay(w, hw, MODEL, ReplayConfig(max_seqs=2), cost=one_second_cost(hw, MODEL))
    cluster = simulate(w, hw, MODEL, ReplayConfig(max_seqs=2), ClusterConfig(), params=params)
    assert cluster.timeline() == plain.timeline()
    assert np.array_equal(cluster.rows["start_s"], plain.rows["start_s"])
    assert cluster.metrics["kv_capacity_bytes"] == plain.metrics["kv_capacity_bytes"]


def test_disaggregation_sends_each_kv_once_and_decode_waits_for_it(tmp_path, quarter_second_collectives):
    from tests.simulator.toy_traces import KV_BYTES_PER_TOKEN, pasta

    hw = toy_part(interconnect_bytes_per_s=1e30)
    # A: sequential, 4-token prompt; B: PASTA, 3 threads over a 6-token prompt (forks share the prompt's KV)
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3), pasta(6, 3, 2)], [4, 6], arrivals=[0.0, 0.5]))
    res = simulate(
        w,
        hw,
        MODEL,
        ReplayConfig(max_seqs=2),
        ClusterConfig(disaggregate=(1, 1)),
        params=one_second_cost(hw, MODEL).params,
    )
    transfers = res.extra["kv_transfers"]
    assert sorted(r for r, _, _ in transfers) == [0, 1]  # every request's KV, once
    admits = {}
    for r, event, t in res.timeline():
        admits.setdefault((r, event), []).append(t)
    for r, start, end in transfers:
        assert end - start == 0.25
        assert admits[(r, "admit")][1] == end  # the decode replica admits it when the transfer ends
    # A: prefill 0-1, transfer 1-1.25, decodes 1.25-3.25; B: prefill 1-2 (queued behind A), transfer 2-2.25
    assert [(r, s, e) for r, s, e in sorted(transfers)] == [(0, 1.0, 1.25), (1, 2.0, 2.25)]
    assert res.metrics["kv_transfer_bytes"] == (4 + 6) * KV_BYTES_PER_TOKEN  # B's prompt sent once, not per thread
    assert res.metrics["completed"] == 2 and res.metrics["gpus"] == 2
    assert res.requests["decode_replica"].tolist() == [0, 0]


def test_disaggregation_with_interleaved_pipelines(tmp_path, quarter_second_collectives):
    """1:1 of PP 2 replicas, 2 engines each (stages 1 s, send/recv and KV transfer 0.25 s each).
    Prefill replica: A's prefill s1 [0, 1] s2 [1.25, 2.25], its KV sent 2.25-2.5; B (at 0.5, the
    idle engine 1) s1 [1, 2] s2 [2.25, 3.25], sent 3.25-3.5 over the same replica's link. Decode
    replica: A (engine 0) s1 [2.5, 3.5] s2 [3.75, 4.75], then s1 [4.75, 5.75] s2 [6, 7]: done at 7;
    B (engine 1) enters stage 1 at 3.5, between A's passes."""
    from tests.simulator.toy_traces import pasta

    hw = toy_part(interconnect_bytes_per_s=1e30)
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3), pasta(6, 3, 2)], [4, 6], arrivals=[0.0, 0.5]))
    par = Parallelism(pp=2, schedule="interleave")
    res = simulate_with(one_second_stages(hw, par), w, hw, ClusterConfig(par, disaggregate=(1, 1)))
    assert sorted(res.extra["kv_transfers"]) == [(0, 2.25, 2.5), (1, 3.25, 3.5)]  # every request's KV, once
    admits = {}
    for r, event, t in res.timeline():
        admits.setdefault((r, event), []).append(t)
    assert admits[(0, "admit")] == [0.0, 2.5] and admits[(1, "admit")] == [0.5, 3.5]  # decode after the transfer
    assert res.requests["e2e_s"].iloc[0] == 7.0 and res.metrics["completed"] == 2 and res.metrics["gpus"] == 4
    assert res.requests["virtual_engine"].tolist() == [0, 1] == res.requests["decode_virtual_engine"].tolist()
    assert res.requests["replica"].tolist() == [0, 0] == res.requests["decode_replica"].tolist()
    assert 0 < res.metrics["pipeline_bubble_percent"] < 100


def test_goodput_gpu_hours_and_cost(tmp_path, quarter_second_collectives):
    hw = toy_part(interconnect_bytes_per_s=1e30, price_per_gpu_hour=3.0)
    res = simulate(
        two_requests(tmp_path),
        hw,
        MODEL,
        ReplayConfig(max_seqs=2),
        ClusterConfig(Parallelism(tp=2), slo_ttft_ms=3000, slo_tpot_ms=5000),
        params=one_second_cost(hw, MODEL).params,
    )
    m = res.metrics  # TTFT: A 2 s, B 3.5 s; run 6 s on 2 GPUs; 5 output tokens
    assert m["request_goodput"] == pytest.approx(1 / 6) and m["slo_attained_percent"] == 50.0
    assert m["gpu_hours"] == pytest.approx(2 * 6 / 3600) and m["cost_usd"] == pytest.approx(3.0 * 2 * 6 / 3600)
    assert m["cost_per_million_output_tokens"] == pytest.approx(m["cost_usd"] / 5 * 1e6)
    unpriced = simulate(
        two_requests(tmp_path),
        toy_part(),
        MODEL,
        ReplayConfig(max_seqs=2),
        ClusterConfig(),
        params=one_second_cost(hw, MODEL).params,
    ).metrics
    assert unpriced["cost_usd"] is None and unpriced["request_goodput"] is None


def test_deployment_sweep_trades_gpus_for_latency(tmp_path, small_trace):
    from simulator.sweep import sweep

    table = sweep(
        [str(small_trace)],
        ["h100-sxm"],
        ["llama-3-70b"],
        rates=[50.0],
        num_requests=40,
        workers=1,
        cluster={"tp": [1, 4, 8], "replicas": [1, 2], "price_per_gpu_hour": 2.0, "slo_ttft_ms": 500.0},
    )
    ok = table[table["status"] == "ok"]
    assert len(table) == 6 and len(ok) == 4  # TP 1: 70B does not fit an 80 GB part
    assert sorted(ok["gpus"].tolist()) == [4, 8, 8, 16]
    assert ok["cost_per_million_output_tokens"].notna().all() and ok["request_goodput"].notna().all()
    front = table[table["pareto"]]
    assert len(front) >= 1 and front["gpus"].min() == 4  # the cheapest deployment is never dominated on cost


def test_solm_simulate_tp4_explains_the_numbers(small_trace, capsys):
    from solm.cli import main

    assert main(["simulate", str(small_trace), "--model", "llama-3-70b", "--hardware", "h100-sxm"]) == 2
    assert "leave no room for KV" in capsys.readouterr().err
    assert main(["simulate", str(small_trace), "--model", "llama-3-70b", "--hardware", "h100-sxm", "--tp", "4"]) == 0
    out = capsys.readouterr().out
    assert "tp 4 x pp 1 = 4 GPUs" in out and "per GPU         weights 32.9 GiB" in out and "comm share" in out
    import json

    f = json.loads(out.strip().splitlines()[-1])
    assert f["gpus"] == 4 and 0 < f["comm_share_percent"] < 100 and f["kv_pool_bytes_per_gpu"] > 0


def test_solm_simulate_pp2_reports_schedule_and_bubble(small_trace, capsys):
    import json

    from solm.cli import main

    args = ["simulate", str(small_trace), "--model", "llama-3-8b", "--hardware", "h100-sxm", "--pp", "2"]
    shown = {}
    for schedule, line in (("drain", "(drained: 2 micro-batches a pass)"), ("interleave", "(interleaved: 2 batches")):
        assert main([*args, "--pp-schedule", schedule, "--rate", "inf"]) == 0
        out = capsys.readouterr().out
        assert f"tp 1 x pp 2 {line}" in out and "pipeline bubble" in out
        shown[schedule] = json.loads(out.strip().splitlines()[-1])
        assert shown[schedule]["pp_schedule"] == schedule and shown[schedule]["micro_batches"] == 2
        assert 0 < shown[schedule]["pipeline_bubble_percent"] < 100
    assert shown["drain"]["completed"] == shown["interleave"]["completed"] > 0


def test_sweep_takes_the_pp_schedule(tmp_path, small_trace):
    from simulator.sweep import config_key, grid, sweep

    with pytest.raises(ValueError, match="--pp-schedule must be one of"):  # refused before any work
        grid([str(small_trace)], ["h100-sxm"], ["llama-3-8b"], cluster={"pp": [2], "pp_schedule": "zigzag"})
    configs = grid([str(small_trace)], ["h100-sxm"], ["llama-3-8b"], cluster={"pp": [2], "pp_schedule": "interleave"})
    plain = grid([str(small_trace)], ["h100-sxm"], ["llama-3-8b"], cluster={"pp": [2]})
    assert config_key(configs[0]) != config_key(plain[0]) and plain[0]["pp_schedule"] == "drain"
    table = sweep(
        [str(small_trace)],
        ["h100-sxm"],
        ["llama-3-8b"],
        rates=[50.0],
        num_requests=10,
        workers=1,
        cluster={"pp": [2], "pp_schedule": "interleave"},
    )
    assert table["status"].tolist() == ["ok"] and table["pp_schedule"].tolist() == ["interleave"]


# ---- focused checks added by hand-made mutants (each fails on a mutant the tests above let through) ----
def test_tied_embedding_is_held_once_on_one_stage_and_twice_across_stages():
    import dataclasses

    from simulator.cluster.parallel import stage_weight_bytes

    model = get_model("llama-3-8b")
    tied, untied = (dataclasses.replace(model, tied_embeddings=flag) for flag in (True, False))
    embed = model.vocab_size * model.d_model * model.dtype_bytes
    assert stage_weight_bytes(untied, Parallelism())[0] - stage_weight_bytes(tied, Parallelism())[0] == embed
    assert stage_weight_bytes(untied, Parallelism(pp=2)) == stage_weight_bytes(tied, Parallelism(pp=2))


def test_kv_capacity_fits_every_pipeline_stage():
    from simulator.cluster.parallel import _kv_share, stage_weight_bytes

    hw, model = override("h100-sxm", name="made-up-80g", hbm_capacity_bytes=80 * GIB), get_model("llama-3-70b")
    par = Parallelism(tp=2, pp=3)  # 27, 27, 26 layers; the embedding on the first stage, lm_head on the last
    plan = memory_plan(hw, model, par)
    room = [
        (plan.usable_bytes_per_gpu - w) // (layers * model.kv_bytes_per_token_per_layer * _kv_share(model, 2))
        for w, layers in zip(stage_weight_bytes(model, par), stage_layers(model.n_layers, 3))
    ]
    assert len(set(room)) > 1 and plan.kv_capacity_tokens == min(room)


def test_stages_cross_nodes_only_past_one_node_and_tp_fills_whole_nodes():
    from simulator.comm import collective_time_s

    hw, model = get_hardware("h100-sxm"), get_model("llama-3-70b")  # 8 GPUs a node
    assert not ParallelCost(hw, model, Parallelism(tp=4, pp=2)).cross_node
    assert ParallelCost(hw, model, Parallelism(tp=8, pp=2)).cross_node
    cost = ParallelCost(hw, model, Parallelism(tp=4, pp=2))  # each rank sends its 1/tp of the activations
    expected = collective_time_s("send_recv", 64 * model.d_model * model.dtype_bytes / 4, 2, hw, across_nodes=False)
    assert cost._send_s(64) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="whole nodes"):
        ParallelCost(hw, get_model("internlm-20b"), Parallelism(tp=10))  # 40 heads over 1.25 nodes
    ParallelCost(hw, get_model("internlm-20b"), Parallelism(tp=8))  # one whole node


def test_pp_pipeline_waits_on_a_send_slower_than_a_stage(tmp_path, monkeypatch):
    ramp = Ramp(eff_max=1.0, ramp_bytes=1e-30, ramp_exponent=1.0, latency_s=2.0)
    monkeypatch.setattr(comm, "load_params", lambda: CommParams({p: {"ring": ramp, "p2p": ramp} for p in comm.PATHS}))
    cost = one_second_stages(toy_part(interconnect_bytes_per_s=1e30), Parallelism(pp=2, micro_batches=2))
    # 2 micro-batches: stage 1 s + send 2 s + stage 1 s, the second one a bottleneck (the 2 s send) later
    assert cost.breakdown(8, 20, 2)["total_s"][0] == 6.0


def test_the_lm_head_runs_on_the_last_stage(quarter_second_collectives):
    cost = one_second_stages(toy_part(interconnect_bytes_per_s=1e30), Parallelism(pp=2, schedule="interleave"))
    cost.layer = HeadedLayer()
    stages, send = cost.stage_times(4, 10, 1)
    assert stages.tolist() == [1.0, 1.5] and send == 0.25


def test_pp_comm_share_counts_the_stage_sends(tmp_path, quarter_second_collectives):
    hw = toy_part(interconnect_bytes_per_s=1e30)
    par = Parallelism(pp=2)
    m = simulate_with(one_second_stages(hw, par), two_requests(tmp_path), hw, ClusterConfig(par)).metrics
    assert m["all_reduce_share_percent"] == 0.0 and m["send_recv_share_percent"] > 0
    assert m["comm_share_percent"] == pytest.approx(m["send_recv_share_percent"])
    assert m["router"] is None  # one replica: no router to report


def test_disaggregation_sends_each_gpus_shard_and_prices_each_side(tmp_path, monkeypatch):
    from simulator.cluster import disaggregation
    from tests.simulator.toy_traces import KV_BYTES_PER_TOKEN

    sent = []

    def fake_send(kind, nbytes, workers, hardware, topology, across_nodes):
        sent.append((kind, np.asarray(nbytes).tolist(), across_nodes))
        return 0.25 + 0 * np.asarray(nbytes)

    monkeypatch.setattr(disaggregation, "collective_time_s", fake_send)
    hw = toy_part(interconnect_bytes_per_s=1e30, price_per_gpu_hour=3.0)  # 8 GPUs a node
    cheap = toy_part(interconnect_bytes_per_s=1e30, price_per_gpu_hour=1.0)
    res = simulate(
        two_requests(tmp_path),
        hw,
        MODEL,
        ReplayConfig(max_seqs=2),
        ClusterConfig(Parallelism(tp=2), disaggregate=(1, 3), decode_hardware=cheap),  # 8 GPUs: one node
        params=one_second_cost(hw, MODEL).params,
    )
    assert sent == [("send_recv", [4 * KV_BYTES_PER_TOKEN / 2] * 2, False)]  # each of the 2 ranks its half
    m = res.metrics
    assert m["mean_kv_transfer_ms"] == 250.0
    hours = m["duration_s"] / 3600
    assert m["cost_usd"] == pytest.approx(hours * 2 * (1 * 3.0 + 3 * 1.0))  # 2 GPUs a replica, each side its price
