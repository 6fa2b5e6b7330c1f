"""Round-number costs for the cluster tests (test_cluster.py, test_cluster_disagg_pipeline.py):
layers of exactly 1 s a micro-batch, and `simulate` with such a
cost as every replica's pass cost, so that a pipeline's or a disaggregated run's timeline can be
worked out by hand (the 0.25 s collectives: tests/simulator/conftest.py)."""

from __future__ import annotations

import pytest

from simulator.cluster.parallel import ParallelCost, Parallelism
from simulator.cluster.run import ClusterConfig, simulate
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig
from tests.simulator.toy_traces import MODEL_META, one_second_cost

MODEL = ModelSpec.from_trace_meta(MODEL_META)  # 2 layers, 512 KV bytes a token


class OneSecondLayer:
    """Per micro-batch: every layer 1 s, nothing else (the pipeline arithmetic in round numbers).
    A one-layer model's step time: the layer plus the host overhead (which the stages take off)."""

    def __init__(self, overhead_s: float = 0.0) -> None:
        self.overhead_s = overhead_s

    def step_time_s(self, q, kv, g, lg):
        return 1.0 + self.overhead_s + 0 * q

    def pass_op_times_s(self, q, lg):
        return {"emb": 0 * q, "lm_head": 0 * q, "step_overhead": 0 * q}

    def _all_reduce_s(self, q):
        return 0 * q


class HeadedLayer(OneSecondLayer):
    """A layer of 1 s and an lm_head of 0.5 s (the last stage's): stages of 1 s and 1.5 s."""

    def step_time_s(self, q, kv, g, lg):
        return 1.5 + 0 * q

    def pass_op_times_s(self, q, lg):
        return {"emb": 0 * q, "lm_head": 0.5 + 0 * q, "step_overhead": 0 * q}


def one_second_stages(hw, par: Parallelism, overhead_s: float = 0.0, layer=None) -> ParallelCost:
    """PP cost on the made-up part: every layer 1 s a micro-batch (or `layer`'s times),
    `overhead_s` of host work a pass."""
    params = one_second_cost(hw, MODEL).params
    cost = ParallelCost(hw, MODEL, par, params)
    cost.layer = layer or OneSecondLayer(overhead_s)
    cost.params = type(params)(families=cost.params.families, step_overhead_s=overhead_s)  # defaults otherwise
    return cost


def simulate_with(cost: ParallelCost, w, hw, deployment: ClusterConfig, max_seqs: int = 2, **config):
    """`simulate` with `cost` as the replica's pass cost (the round-number stages)."""
    from simulator.cluster import run as run_mod

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run_mod, "ParallelCost", lambda *a: cost)
        return simulate(w, hw, MODEL, ReplayConfig(max_seqs=max_seqs, **config), deployment)


def by_request(res, column: str) -> dict[int, list]:
    """`res.rows[column]` per request, in pass order."""
    out: dict[int, list] = {}
    for r, v in zip(res.rows["request"].tolist(), res.rows[column].tolist()):
        out.setdefault(r, []).append(v)
    return out
