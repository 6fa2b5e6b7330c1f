"""simulator/cluster/pipeline.py: what the cluster tests left unpinned (a mutation round: 30
mutants, 22 killed by tests/simulator/test_cluster*.py, 6 equivalent, 2 killed here).

Equivalent: a floor of 1e-9 s on a pass that has stages (they always take time); a pass of no
query rows timed through the stages (none reaches them: a valid trace's passes each have a query
row, and the replay plans no empty batch); the stage-cost
cache never cleared (memory only, below PASS_COST_CACHE shapes); the host work's per-request term
(a `ParallelCost` has no `per_request_s`: only the host CPU's cost does, and it has no stages); the
planned pass's time without its sends (a virtual engine plans one pass, which the pipeline times
again: the plan's time cuts nothing); each replica's pool for the KV-aware router taken as one
engine's instead of the engines' sum (every replica has the same engines: the same ranking)."""

from __future__ import annotations

from simulator.cluster.parallel import Parallelism
from simulator.cluster.pipeline import Pipeline, bubble_percent
from simulator.cluster.run import ClusterConfig, simulate
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig
from simulator.workload import load_workload
from tests.simulator.toy_traces import BLOCK_BYTES, MODEL_META, one_second_cost, seq, toy_part, write_toy_trace

MODEL = ModelSpec.from_trace_meta(MODEL_META)  # 2 layers


def test_the_runs_kv_peak_is_the_fullest_replicas(tmp_path):
    """Two PP-2 replicas under interleave, round robin: a small request (1 block) on replica 0, a
    big one (3 blocks) on replica 1: the run's peak is replica 1's 3 blocks, not replica 0's."""
    hw = toy_part()
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 2), seq(4, 40)], [4, 4], arrivals=[0.0, 0.0]))
    deployment = ClusterConfig(Parallelism(pp=2, schedule="interleave"), replicas=2)
    res = simulate(w, hw, MODEL, ReplayConfig(max_seqs=2), deployment, params=one_second_cost(hw, MODEL).params)
    assert res.requests["replica"].tolist() == [0, 1]
    assert res.metrics["peak_kv_bytes"] == 3 * BLOCK_BYTES


def test_no_pass_no_bubble():
    """A pipeline that ran nothing has no bubble: 0%, not 0/0."""
    assert bubble_percent([Pipeline(2), Pipeline(4)]) == 0.0 == Pipeline(2).bubble_percent()
    assert bubble_percent([]) == 0.0
