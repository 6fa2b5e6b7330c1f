"""TP x PP costs and memory (`simulator/cluster/parallel.py`) and the routers
(`simulator/cluster/routers/`): exact values worked out by hand on the toy model (2 layers,
d_model 64, 4 heads, 2 KV heads, d_ff 128, vocab 100, fp32) and on the made-up part, where the
tests beside this one left hand-made mutants of those modules alive. Each docstring says what
wrong code it fails on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from profiler.errors import UsageError
from simulator import comm
from simulator.cluster.parallel import (
    ParallelCost,
    Parallelism,
    layer_weight_bytes_per_gpu,
    memory_plan,
    stage_weight_bytes,
)
from simulator.cluster.run import ClusterConfig, simulate
from simulator.comm import CommParams, Ramp
from simulator.hardware import get_hardware
from simulator.models import get_model
from simulator.replay import ReplayConfig, replay
from simulator.workload import load_workload
from tests.simulator.cluster_helpers import MODEL, OneSecondLayer, by_request
from tests.simulator.toy_traces import one_second_cost, seq, toy_part, write_toy_trace

MODEL3 = dataclasses.replace(MODEL, n_layers=3)  # two stages of 2 and 1 layers
MODEL4 = dataclasses.replace(MODEL, n_layers=4)

# The toy model's weights, by hand (4-byte weights; q_dim 64, kv_dim 32):
#   a layer: q and o 2 x 64 x 64 = 8192, k and v 64 x 2 x 32 = 4096, gated MLP 3 x 64 x 128 = 24576,
#   2 norms x 64 = 128: 36992 weights, 147968 bytes
#   embedding (and the untied lm_head) 100 x 64 = 6400 weights, 25600 bytes; final norm 64, 256 bytes
LAYER_B, EMBED_B, NORM_B = 147968, 25600, 256


def stages_cost(hw, model, par: Parallelism, layer, overhead_s: float = 0.0) -> ParallelCost:
    """PP cost of `model` whose one-layer pass is `layer`'s (cluster_helpers.one_second_stages, any model)."""
    params = dataclasses.replace(one_second_cost(hw, model).params, step_overhead_s=overhead_s)
    cost = ParallelCost(hw, model, par, params)
    cost.layer = layer
    return cost


class ShapedLayer:
    """One layer of a one-layer pass: 0.125 s a query token, 0.0625 s a KV token read, 0.25 s a
    query group; the lm_head 0.25 s a logit row; the layer's all-reduces 0.5 s; no host work."""

    def step_time_s(self, q, kv, g, lg):
        return 0.125 * q + 0.0625 * kv + 0.25 * g + 0.25 * lg

    def pass_op_times_s(self, q, lg):
        return {"emb": 0 * q, "lm_head": 0.25 * lg, "step_overhead": 0 * q}

    def _all_reduce_s(self, q):
        return 0.5 + 0 * q


class AllReduceLayer(OneSecondLayer):
    """A layer of 1 s, all of it all-reduces."""

    def _all_reduce_s(self, q):
        return 1.0 + 0 * q


@pytest.fixture
def free_latency(monkeypatch):
    """Collectives at their link's bandwidth exactly, no latency."""
    ramp = Ramp(eff_max=1.0, ramp_bytes=1e-30, ramp_exponent=1.0, latency_s=0.0)
    monkeypatch.setattr(comm, "load_params", lambda: CommParams({p: {"ring": ramp, "p2p": ramp} for p in comm.PATHS}))


# ---- Parallelism ------------------------------------------------------------------------------------
def test_counts_must_be_positive_integers_not_flags():
    """tp/pp True (a bool is an int) and --micro-batches 0 are refused, each in one line. Fails
    if bools pass as counts or if 0 micro-batches pass (a pass cut into 0 pieces)."""
    with pytest.raises(UsageError, match=r"^--tp must be a positive integer, got True$"):
        Parallelism(tp=True)
    with pytest.raises(UsageError, match=r"^--pp must be a positive integer, got False$"):
        Parallelism(pp=False)
    with pytest.raises(UsageError, match=r"^--micro-batches must be a positive integer, got 0$"):
        Parallelism(pp=2, micro_batches=0)
    assert Parallelism(tp=np.int64(2), pp=2, micro_batches=1).gpus == 4


def test_one_stage_is_the_plain_replay_under_either_schedule(tmp_path):
    """--pp-schedule interleave with one stage (a sweep's pp 1 rows) schedules nothing: the plain
    replay, its whole pool (not cut into --micro-batches engines) and no virtual engines. Fails if
    one stage is run as batches in flight."""
    hw = toy_part()
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3), seq(4, 2)], [4, 4], arrivals=[0.0, 0.5]))
    params = one_second_cost(hw, MODEL).params
    plain = replay(w, hw, MODEL, ReplayConfig(max_seqs=2), cost=one_second_cost(hw, MODEL))
    par = Parallelism(pp=1, micro_batches=2, schedule="interleave")
    res = simulate(w, hw, MODEL, ReplayConfig(max_seqs=2), ClusterConfig(par), params=params)
    assert res.timeline() == plain.timeline()
    assert "virtual_engine" not in res.requests.columns
    assert res.metrics["kv_capacity_bytes"] == plain.metrics["kv_capacity_bytes"]


def test_tp_may_outnumber_the_kv_heads_but_must_split_the_heads():
    """TP 16 on a 64-head, 8-KV-head model is a split (each KV head on 2 GPUs); TP 3 is not. Fails
    if the check divides the KV heads instead of the attention heads."""
    hw, model = get_hardware("h100-sxm"), get_model("llama-3-70b")
    assert ParallelCost(hw, model, Parallelism(tp=16)).par.gpus == 16
    with pytest.raises(UsageError, match="--tp 3 does not divide llama-3-70b's 64 attention heads"):
        ParallelCost(hw, model, Parallelism(tp=3))


def test_tp_must_split_the_kv_heads_evenly(tmp_path, capsys):
    """Qwen2.5-7B: 28 attention heads, 4 KV heads. TP 7 divides the heads (4 a GPU) but not the
    KV heads: GPU 1's query heads 4-7 read KV heads 0 and 1, so it holds two KV heads, not the one
    the memory plan gave it (its pool overstated twice); vLLM refuses it. TP 2 and 4 split the
    KV heads, TP 4 of the toy model's 2 KV heads replicates each on 2 GPUs. Fails on the old
    check, which let TP 7 through (exit 0)."""
    from solm.cli import main

    hw, model = get_hardware("h100-sxm"), get_model("qwen2.5-7b")
    for tp in (2, 4):
        ParallelCost(hw, model, Parallelism(tp=tp))
    ParallelCost(toy_part(), MODEL, Parallelism(tp=4))
    said = "--tp 7 splits qwen2.5-7b's 4 KV heads unevenly: give a divisor or a multiple of 4"
    with pytest.raises(UsageError, match=f"^{said}$"):
        ParallelCost(hw, model, Parallelism(tp=7))
    trace = write_toy_trace(tmp_path / "t", [seq(4, 2)], [4])
    assert main(["simulate", str(trace), "--model", "qwen2.5-7b", "--hardware", "h100-sxm", "--tp", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]


# ---- weights and KV memory ------------------------------------------------------------------------
def test_weights_per_gpu_by_hand():
    """The toy model's weights (the constants above): a whole layer; at TP 4 the GEMMs and heads in
    quarters but the 2 KV heads replicated (each GPU holds one: half of k and v) and the norms
    whole; on one stage the whole model; over 2 stages of a 3-layer model the embedding on the
    first and the final norm and lm_head on the last. Fails if k and v split past their heads, if
    a layer's norms or the final norm are left out, or if the embedding sits on the last stage."""
    assert layer_weight_bytes_per_gpu(MODEL, 1) == LAYER_B
    # q, o 8192 / 4 + k, v 4096 / 2 + MLP 24576 / 4 + norms 128 = 10368 weights
    assert layer_weight_bytes_per_gpu(MODEL, 4) == 10368 * 4
    assert stage_weight_bytes(MODEL, Parallelism()) == [2 * LAYER_B + 2 * EMBED_B + NORM_B] == [MODEL.weight_bytes]
    assert stage_weight_bytes(MODEL3, Parallelism(pp=2)) == [2 * LAYER_B + EMBED_B, LAYER_B + NORM_B + EMBED_B]


def test_memory_plan_by_hand():
    """Toy model over 2 stages, all of the part's memory usable: stage 0 holds a layer and the
    embedding (173568 bytes), stage 1 a layer, the final norm and lm_head (173824); a token's KV
    is 256 bytes a stage. With 173824 + 1000 x 256 bytes a GPU, stage 1 has room for 1000 tokens
    and stage 0 for 1001: the replica holds 1000 tokens (512 bytes each, whole model), and the
    GPU it reports is stage 1's. Fails if the reported GPU is the roomiest stage's."""
    hw = toy_part(capacity_bytes=LAYER_B + EMBED_B + NORM_B + 1000 * 256)
    plan = memory_plan(hw, MODEL, Parallelism(pp=2), memory_utilization=1.0)
    assert (plan.gpus, plan.usable_bytes_per_gpu, plan.weight_bytes_per_gpu) == (2, 429824, 173824)
    assert (plan.kv_bytes_per_token_per_gpu, plan.kv_capacity_tokens, plan.kv_pool_bytes_per_gpu) == (256, 1000, 256000)
    assert plan.kv_capacity_bytes == 1000 * 512


@pytest.mark.parametrize(
    ("model", "pp", "capacity"),
    [
        (MODEL, 1, 2 * LAYER_B + 2 * EMBED_B + NORM_B),  # the weights exactly: no byte left for KV
        (MODEL3, 2, 200_000),  # stage 1 (173824 bytes) fits, stage 0 (321536) does not
    ],
)
def test_no_room_for_kv_on_some_gpu_is_refused(model, pp, capacity):
    """Fails if weights that fill a GPU exactly pass (a pool of 0 tokens), or if only the
    lightest stage is checked (a negative pool)."""
    with pytest.raises(UsageError, match="leave no room for KV"):
        memory_plan(toy_part(capacity_bytes=capacity), model, Parallelism(pp=pp), memory_utilization=1.0)


def test_a_stage_may_not_straddle_two_nodes():
    """InternLM-20B (40 heads, 40 KV heads) on 8-GPU nodes: --tp 5 alone fits in a node, but with
    --pp 2 the second stage would run on GPUs 5-9, its all-reduces crossing nodes while timed as
    inside one. Fails if the straddle is let through, or if --pp 1, or stages that tile the nodes
    (tp 4 x pp 4, tp 8 x pp 2), are refused."""
    hw, model = toy_part(gpus_per_node=8), get_model("internlm-20b")
    with pytest.raises(UsageError, match=r"stage 2's GPUs 5-9 straddle two nodes of 8; give a --tp that divides 8"):
        Parallelism(tp=5, pp=2).check(model, hw)
    for tp, pp in ((5, 1), (4, 4), (8, 2), (2, 3)):
        Parallelism(tp=tp, pp=pp).check(model, hw)


# ---- pass costs -------------------------------------------------------------------------------------
def test_stage_sends_are_one_pair_of_gpus(free_latency):
    """On a mesh node (8 GPUs, each with 7 point-to-point links of 1e9 B/s one way) a stage
    boundary is one GPU sending to one GPU: one link, whatever the stage count. 1000 tokens x 64
    x 4 bytes = 256000 bytes in 256 us. Fails if the send is timed as a ring of the stages (PP 4:
    3 links at once, 85 us)."""
    hw = toy_part(topology="mesh", interconnect_bytes_per_s=2 * 7e9)
    cost = ParallelCost(hw, MODEL4, Parallelism(pp=4))
    assert not cost.cross_node
    assert cost._send_s(1000) == pytest.approx(256e-6, rel=1e-12)


@pytest.mark.parametrize(
    ("topology", "tp", "pp", "links"),
    [
        ("nvswitch", 1, 4, ["node"] * 3),
        ("nvswitch", 4, 2, ["node"]),
        ("nvswitch", 8, 2, ["network"]),
        # GPUs 0-3 | 4-7 on node 0, 8-11 | 12-15 on node 1: only the middle boundary leaves a node
        ("nvswitch", 4, 4, ["node", "network", "node"]),
        # bridged pairs (0, 1), (2, 3), ...: stage 0 -> 1 is GPU 0 -> 1, 1 -> 2 is GPU 1 -> 2
        ("nvlink_pairs", 1, 4, ["node", "pcie", "node"]),
        ("nvlink_pairs", 2, 2, ["pcie"]),  # GPUs 0, 1 -> 2, 3: each rank's peer in another pair
        ("nvlink_pairs", 4, 4, ["pcie", "network", "pcie"]),
        ("mesh", 2, 4, ["node"] * 3),
    ],
)
def test_each_stage_boundary_sends_over_its_own_link(topology, tp, pp, links):
    """Stage s's TP rank r on GPU s x tp + r, 8 GPUs a node. Fails if every boundary takes one
    link (the old rule: all over the NICs once tp x pp passes a node, all over a pair's bridge
    on an NVLink-pairs node)."""
    from simulator.cluster.parallel import boundary_links

    hw = toy_part(topology=topology, gpus_per_node=8)
    assert boundary_links(hw, Parallelism(tp=tp, pp=pp)) == links


def test_pp_on_bridged_pairs_sends_over_pcie_between_pairs(free_latency):
    """A PP-4 replica on an NVLink-pairs node (bridge 1e9 B/s one way, PCIe 1e8): 1000 tokens x 64
    x 4 bytes = 256000 bytes take 256 us over a bridge and 2.56 ms over PCIe, so the boundaries
    take [0.256, 2.56, 0.256] ms and one micro-batch's pass sends for 3.072 ms, all of its time.
    Fails if the middle boundary is timed over the bridge (0.768 ms in all), every one over PCIe,
    or the slowest send stands for every boundary (7.68 ms)."""
    hw = toy_part(topology="nvlink_pairs", gpus_per_node=8, interconnect_bytes_per_s=2e9, pcie_bytes_per_s=2e8)
    cost = ParallelCost(hw, MODEL4, Parallelism(pp=4, micro_batches=1))
    assert cost._send_s(1000)[:, 0] == pytest.approx([256e-6, 2.56e-3, 256e-6], rel=1e-12)
    assert not cost.cross_node
    parts = cost.breakdown(1000, 0, 1)  # the stages take ~0 s on the made-up part, no host work
    assert parts["send_recv_s"][0] == pytest.approx(3.072e-3, rel=1e-12)
    assert parts["total_s"][0] == pytest.approx(3.072e-3, rel=1e-9)
    assert cost.stage_times(1000, 0, 1)[1] == pytest.approx([256e-6, 2.56e-3, 256e-6], rel=1e-12)


def test_interleaved_passes_wait_on_each_boundarys_send():
    """Four 1 s stages, sends of 0.25, 0.5 and 0.25 s. Pass 1 leaves at 1 + .25 + 1 + .5 + 1 + .25
    + 1 = 5 s; pass 2, ready at 0, enters stage 1 at 1 s and leaves stage 2 at max(2 + .25, 2.25)
    + 1 = 3.25, stage 3 at max(3.25 + .5, 3.75) + 1 = 4.75 and the last at max(5, 5) + 1 = 6 s.
    Fails if one send (the first boundary's) stands for all (4.75 s and 5.75 s)."""
    from simulator.cluster.pipeline import Pipeline

    pipe = Pipeline(4)
    stages, sends = np.ones(4), np.array([0.25, 0.5, 0.25])
    assert pipe.run_pass(0.0, stages, sends, 0.0) == 5.0
    assert pipe.run_pass(0.0, stages, sends, 0.0) == 6.0


def test_real_stage_times_hold_no_host_work(quarter_second_collectives):
    """The made-up part's real cost model (every roofline ~0, 1 s of host work a pass): the
    stages are ~0 s each, so a PP 2 pass (one micro-batch) is the host work, ~0 + 0.25 s + ~0.
    Fails if the host work is taken off the layers twice (stage 1 at -1 s)."""
    hw = toy_part(interconnect_bytes_per_s=1e30)
    cost = ParallelCost(hw, MODEL, Parallelism(pp=2), one_second_cost(hw, MODEL).params)
    stages, send = cost.stage_times(4, 10, 1, 1)
    assert stages.tolist() == pytest.approx([0.0, 0.0], abs=1e-9) and send.tolist() == [0.25]
    assert cost.step_time_s(4, 10, 1, 1) == pytest.approx(1.25, abs=1e-9)


@pytest.mark.parametrize("pp", [2, 3])
def test_stages_sum_to_the_whole_pass(pp):
    """On a real part and model the stages of a pass are the model's layers and head once: their
    sum is the one-GPU pass less its host work. Fails if a stage is timed on the wrong number of
    layers, or the layers on two layers each."""
    hw, model = get_hardware("h100-sxm"), get_model("llama-3-8b")
    cost = ParallelCost(hw, model, Parallelism(pp=pp))
    for q, kv, g, lg in ((512, 131328, 1, 1), (32, 32 * 900, 32, 32)):
        stages, _ = cost.stage_times(q, kv, g, lg)
        whole = float(cost.full.step_time_s(q, kv, g, lg)) - cost.params.step_overhead_s
        assert float(stages.sum()) == pytest.approx(whole, rel=1e-9)
        assert len(stages) == pp and stages[0] > 0


def test_the_first_stages_take_the_extra_layers():
    """3 one-second layers over 2 stages: 2 s and 1 s. Fails if the stages are reversed."""
    cost = stages_cost(toy_part(), MODEL3, Parallelism(pp=2, schedule="interleave"), OneSecondLayer())
    assert cost.stage_times(4, 10, 1)[0].tolist() == [2.0, 1.0]


def test_micro_batches_are_the_pass_cut_in_pieces(quarter_second_collectives):
    """ShapedLayer, PP 2, 2 micro-batches: a pass of 8 query tokens reading 16 KV tokens in 2
    groups with 2 logit rows is cut into 2 micro-batches of 4 tokens, 8 KV tokens, 1 group and 1
    logit row: a layer 0.5 + 0.5 + 0.25 = 1.25 s, the head 0.25 s; stages 1.25 s and 1.5 s, a
    send 0.25 s. The pass: 1.25 + 0.25 + 1.5 + one more bottleneck step of 1.5 s = 4.5 s; each
    stage works 2 x 2.75 / 2 = 2.75 s of it: a bubble of 1.75 s. Fails if any of the four
    shapes is not cut (6, 6, 5.25, 5 s), or if the bottleneck is the faster stage (4.25 s)."""
    cost = stages_cost(toy_part(interconnect_bytes_per_s=1e30), MODEL, Parallelism(pp=2), ShapedLayer())
    parts = cost.breakdown(8, 16, 2, 2)
    assert {k: v.tolist() for k, v in parts.items()} == {
        "total_s": [4.5],
        "all_reduce_s": [0.0],
        "send_recv_s": [0.25],
        "bubble_s": [1.75],
    }
    assert cost.step_time_s(8, 16, 2, 2) == 4.5


class HeavyHeadLayer(ShapedLayer):
    """ShapedLayer with an lm_head of 1.5 s a logit row."""

    def step_time_s(self, q, kv, g, lg):
        return 0.125 * q + 0.0625 * kv + 0.25 * g + 1.5 * lg

    def pass_op_times_s(self, q, lg):
        return {"emb": 0 * q, "lm_head": 1.5 * lg, "step_overhead": 0 * q}


@pytest.mark.parametrize(
    ("layer", "send_s", "parts"),
    [
        # stages 2.5 and 1.5 s: the first micro-batch's 3 layers (1.5 s of all-reduces) and the
        # second's step on stage 0, 2 layers (1 s): 2.5 s (was 3: stage 0's layers on every stage)
        (ShapedLayer(), 0.25, {"total_s": 6.75, "all_reduce_s": 2.5, "send_recv_s": 0.25, "bubble_s": 2.75}),
        # stages 2.5 and 2.75 s: the bottleneck is stage 1, one layer: 1.5 + 0.5 s
        (HeavyHeadLayer(), 0.25, {"total_s": 8.25, "all_reduce_s": 2.0, "send_recv_s": 0.25, "bubble_s": 3.0}),
        # a 3 s send is the bottleneck: the second micro-batch adds no all-reduce, 1.5 s
        (ShapedLayer(), 3.0, {"total_s": 10.0, "all_reduce_s": 1.5, "send_recv_s": 3.0, "bubble_s": 6.0}),
    ],
)
def test_all_reduces_on_the_critical_path(monkeypatch, layer, send_s, parts):
    """TP 2 x PP 2 of the 3-layer toy model (stages of 2 and 1 layers), 2 micro-batches of the
    micro-batch test's pass (a layer 1.25 s, 0.5 s of it all-reduces). The pass is the first
    micro-batch through both stages and the send, then one bottleneck step: its all-reduces are
    every layer's once and the bottleneck stage's layers once more (none if the send is the
    bottleneck). Fails on the old count, the heaviest stage's layers on every stage of every
    micro-batch (3 s each)."""
    ramp = Ramp(eff_max=1.0, ramp_bytes=1e-30, ramp_exponent=1.0, latency_s=send_s)
    monkeypatch.setattr(comm, "load_params", lambda: CommParams({p: {"ring": ramp, "p2p": ramp} for p in comm.PATHS}))
    cost = stages_cost(toy_part(interconnect_bytes_per_s=1e30), MODEL3, Parallelism(tp=2, pp=2), layer)
    assert {k: v.tolist() for k, v in cost.breakdown(8, 16, 2, 2).items()} == {k: [v] for k, v in parts.items()}


def test_comm_never_exceeds_the_pass(quarter_second_collectives):
    """Layers that are all all-reduce (1 s each), stages of 2 and 1 layers, one micro-batch:
    2 + 0.25 + 1 = 3.25 s, of which 3 s all-reduces and 0.25 s the send. Fails on the old
    count (4 s, clamped to the whole pass: 3.25 + 0.25 s of communication in a 3.25 s pass)."""
    cost = stages_cost(toy_part(interconnect_bytes_per_s=1e30), MODEL3, Parallelism(tp=2, pp=2), AllReduceLayer())
    parts = {k: v.tolist() for k, v in cost.breakdown(4, 10, 1).items()}
    assert parts == {"total_s": [3.25], "all_reduce_s": [3.0], "send_recv_s": [0.25], "bubble_s": [1.75]}


def test_a_decode_step_all_reduces_once_a_layer():
    """Llama-3-70B, TP 2 x PP 3 (27, 27, 26 layers), a decode step of one stream (one
    micro-batch): its all-reduces are the 80 layers', not 3 x 27 = 81."""
    hw, model = get_hardware("h100-sxm"), get_model("llama-3-70b")
    cost = ParallelCost(hw, model, Parallelism(tp=2, pp=3))
    per_layer = float(cost.layer._all_reduce_s(1))
    assert float(cost.breakdown(1, 1000, 1)["all_reduce_s"][0]) == pytest.approx(80 * per_layer, rel=1e-12)


# ---- routers ----------------------------------------------------------------------------------------
def routed(tmp_path, router, requests, arrivals, max_seqs=2) -> list[int]:
    """Each request's replica, 2 replicas behind `router`, one-second passes."""
    hw = toy_part()
    prompts = [p[0].q for p in requests]
    w = load_workload(write_toy_trace(tmp_path / "t", requests, prompts, arrivals=arrivals))
    res = simulate(
        w,
        hw,
        MODEL,
        ReplayConfig(max_seqs=max_seqs),
        ClusterConfig(replicas=2, router=router),
        params=one_second_cost(hw, MODEL).params,
    )
    assert res.metrics["completed"] == len(requests)
    return res.requests["replica"].tolist()


def test_least_outstanding_counts_running_requests_and_ties_go_low(tmp_path):
    """A (6 passes) at 0: both replicas empty, the tie to replica 0, which runs A from 0 to 6. B
    (1 pass) at 0.5: replica 0 has A running, 1 nothing: replica 1, done at 1.5. C at 2: A still
    running on 0, replica 1 empty again: replica 1 (round robin: 0). Fails if the running
    requests are not counted (0, 0, 0), or if ties go to the highest index (1, 0, 0)."""
    requests = [seq(4, 6), seq(4, 1), seq(4, 2)]
    assert routed(tmp_path, "least_outstanding", requests, [0.0, 0.5, 2.0]) == [0, 1, 1]


def test_kv_aware_weighs_the_running_requests_pages(tmp_path):
    """A (40-token prompt, 10 passes) at 0 and B (4 tokens, 10 passes) at 0.5, on replicas 0 and
    1 (A's prefill of 3 blocks of 16 is committed on 0 when B arrives). At 2.5 C arrives: both
    replicas run one decode (1 query token each), A's next pass holding 3 blocks, B's 1: C goes
    to replica 1 (least outstanding and round robin: 0). Fails if the running requests' pages
    are left out or counted in tokens (1 each), if ties go to the highest index, or if kv_aware is
    least_outstanding."""
    requests = [seq(40, 10), seq(4, 10), seq(4, 2)]
    assert routed(tmp_path, "kv_aware", requests, [0.0, 0.5, 2.5]) == [0, 1, 1]
    assert routed(tmp_path, "least_outstanding", requests, [0.0, 0.5, 2.5]) == [0, 1, 0]


@pytest.mark.parametrize("stretch", [1024, 1])
def test_kv_aware_sees_the_pass_a_replica_is_in(tmp_path, monkeypatch, stretch):
    """A (15-token prompt, 10 passes) at 0 on replica 0, B (4 tokens) at 0.5 on replica 1. At 2.7
    A is in its third pass (2-3: 17 tokens, 2 blocks of 16), B in its third (2.5-3.5: 6 tokens,
    1 block): C goes to replica 1, is admitted when B's pass ends (3.5) and is done at 5.5 (e2e
    2.8 s), whether the replicas plan their passes in stretches or one at a time (stretch limit
    1). Fails on the old view, the pass the replica's stretch began with (A's prefill, 1 block:
    a tie, replica 0, e2e 2.3 s), which the pass-by-pass replay does not see."""
    import simulator.replay as replay_mod

    monkeypatch.setattr(replay_mod, "MAX_STRETCH_PASSES", stretch)
    hw = toy_part()
    w = load_workload(
        write_toy_trace(tmp_path / "t", [seq(15, 10), seq(4, 10), seq(4, 2)], [15, 4, 4], arrivals=[0.0, 0.5, 2.7])
    )
    deployment = ClusterConfig(replicas=2, router="kv_aware")
    res = simulate(w, hw, MODEL, ReplayConfig(max_seqs=2), deployment, params=one_second_cost(hw, MODEL).params)
    assert res.requests["replica"].tolist() == [0, 1, 1]
    assert res.requests["e2e_s"].tolist() == [10.0, 10.0, pytest.approx(2.8)]


@pytest.mark.parametrize("stretch", [1024, 1])
def test_a_pass_ending_as_a_request_arrives_has_not_moved_on(tmp_path, monkeypatch, stretch):
    """A (15-token prompt, 10 passes) and B (4 tokens) at 0, on replicas 0 and 1 (A's 1 block
    waiting on 0); with stretches each replica plans up to D's arrival (6 s). C arrives at 2.0,
    the instant A's second pass (16 tokens, 1 block) ends and its third (17 tokens, 2 blocks)
    would begin. The arrival is routed before that pass commits (pass by pass, as with
    stretches): A at 1 block, B at 1, the tie to replica 0, where C joins A's passes 2-3 and 3-4
    (done at 4). Fails if a pass ending just now counts as done (A at 2 blocks: replica 1)."""
    import simulator.replay as replay_mod

    monkeypatch.setattr(replay_mod, "MAX_STRETCH_PASSES", stretch)
    hw = toy_part()
    requests, prompts = [seq(15, 10), seq(4, 10), seq(4, 2), seq(4, 2)], [15, 4, 4, 4]
    w = load_workload(write_toy_trace(tmp_path / "t", requests, prompts, arrivals=[0.0, 0.0, 2.0, 6.0]))
    deployment = ClusterConfig(replicas=2, router="kv_aware")
    res = simulate(w, hw, MODEL, ReplayConfig(max_seqs=2), deployment, params=one_second_cost(hw, MODEL).params)
    assert res.requests["replica"].tolist()[:3] == [0, 1, 0]
    assert res.requests["e2e_s"].tolist()[2] == 2.0


def test_kv_aware_weighs_the_queued_requests_pages(tmp_path):
    """One request at a time a replica (--max-seqs 1). A (4 tokens, 20 passes) at 0 to replica
    0, B (the same) at 0.1 to replica 1 (A's 1 block on 0). C (32-token prompt: 2 blocks) at 0.5:
    1 block each, the tie to 0, where C waits. D (17 tokens: 2 blocks) at 0.6: 0 commits 1 + 2,
    1 commits 1: replica 1, where D waits. E at 0.7: 3 blocks each, the tie to 0. Fails if the
    queued requests' pages are counted in tokens (E: 1 + 32 on 0, 1 + 17 on 1: replica 1)."""
    requests = [seq(4, 20), seq(4, 20), seq(32, 2), seq(17, 2), seq(4, 2)]
    arrivals = [0.0, 0.1, 0.5, 0.6, 0.7]
    assert routed(tmp_path, "kv_aware", requests, arrivals, max_seqs=1) == [0, 1, 0, 1, 0]


def test_kv_aware_weighs_pages_not_requests(tmp_path):
    """--max-seqs 1 again: A and B (1 block each) run on replicas 0 and 1; C (40-token prompt: 3
    blocks) at 0.5 ties and waits on 0; D and E (1 block each) at 0.6 and 0.7 go to 1 (0 commits
    1 + 3 blocks, 1 commits 1 then 2). F at 0.8: one request waits on 0 and two on 1, but 0
    commits 4 blocks and 1 only 3: replica 1. Fails if the queue's length outweighs its pages."""
    requests = [seq(4, 20), seq(4, 20), seq(40, 2), seq(4, 2), seq(4, 2), seq(4, 2)]
    arrivals = [0.0, 0.1, 0.5, 0.6, 0.7, 0.8]
    assert routed(tmp_path, "kv_aware", requests, arrivals, max_seqs=1) == [0, 1, 0, 1, 1, 1]


# ---- passes: the prefill / decode split of a disaggregated run ---------------------------------------
def disaggregated(tmp_path, requests, arrivals, **config):
    hw = toy_part(interconnect_bytes_per_s=1e30)
    prompts = [p[0].q for p in requests]
    w = load_workload(write_toy_trace(tmp_path / "t", requests, prompts, arrivals=arrivals))
    return simulate(
        w,
        hw,
        MODEL,
        ReplayConfig(max_seqs=2, **config),
        ClusterConfig(disaggregate=(1, 1)),
        params=one_second_cost(hw, MODEL).params,
    )


def test_only_the_prefill_is_the_prefill_sides(tmp_path, quarter_second_collectives):
    """A planned-diffusion request (a 4-token prefill, one plan pass, three denoise passes): the
    prefill replica runs its prefill (0-1), its KV is sent (1-1.25), the decode replica runs the
    plan and the denoise passes (1.25-5.25). Fails if every pass that is not a decode counts as
    prefill (all five on the prefill side, nothing sent, done at 5)."""
    from tests.simulator.toy_traces import planned_diffusion

    res = disaggregated(tmp_path, [planned_diffusion(4, 2, [2, 3])], [0.0])
    assert res.extra["kv_transfers"] == [(0, 1.0, 1.25)]
    assert res.requests["decode_replica"].tolist() == [0] and res.requests["e2e_s"].tolist() == [5.25]
    assert by_request(res, "start_s") == {0: [0.0, 1.25, 2.25, 3.25, 4.25]}


def test_a_cycled_workload_splits_each_requests_own_passes(tmp_path, quarter_second_collectives):
    """Two requests cycled to four (--num-requests 4: the copies share their passes): each side's
    slice of the shared passes is its own compact workload, so every request runs its own passes
    (live KV 4, 5, 6 and 20, 21, twice). Fails if a slice keeps the shared passes' starts (a
    request reading another's passes, or past the end)."""
    res = disaggregated(tmp_path, [seq(4, 3), seq(20, 2)], [0.0, 0.5], num_requests=4)
    assert res.metrics["completed"] == 4 and res.metrics["kv_transfers"] == 4
    assert by_request(res, "live") == {0: [4, 5, 6], 1: [20, 21], 2: [4, 5, 6], 3: [20, 21]}
