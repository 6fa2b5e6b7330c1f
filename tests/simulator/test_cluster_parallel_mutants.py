"""simulator/cluster/parallel.py: what the cluster tests left unpinned (a mutation round: 39
mutants, 33 killed by tests/simulator/test_cluster*.py, test_disaggregation_mutants.py,
test_cost.py and tests/test_counts.py, 4 equivalent, 2 killed here).

Equivalent:
- `boundary_links` deciding a boundary's link by TP rank 0's pair alone: `Parallelism.check`
  keeps each stage inside one node (or whole nodes), so every rank's pair crosses nodes when rank
  0's does, and on bridged pairs any TP of 2 or more sends outside the pair from every rank.
- `memory_plan` reporting the heaviest stage (argmax of the weights) as the tight one: the first
  stages take the extra layers and the embedding sits on both ends, so the stage with the most
  weight is the one with the least room a KV token (checked over every shipped model, tied and
  not, TP 1-8, every PP, 50 memory sizes each).
- `lg / m` without `max(..., 1)` in `breakdown`, and `stage_times` without `max(g, 1)`: every
  caller passes logit rows >= streams >= 1 on the passes it costs (a workload's logit rows are its
  streams, or every row of a denoise pass; the interleaved pipeline skips empty passes), and a
  pass is cut into at most its streams."""

from __future__ import annotations

import numpy as np
import pytest

from profiler.errors import UsageError
from simulator import comm
from simulator.cluster.parallel import Parallelism, memory_plan, stage_layers
from simulator.cluster.pipeline import replay_interleaved
from simulator.cluster.run import comm_shares, pass_totals
from simulator.comm import CommParams, Ramp
from simulator.hardware import get_hardware
from simulator.models import get_model
from simulator.replay import ReplayConfig
from simulator.workload import load_workload
from tests.simulator.cluster_helpers import MODEL, one_second_stages
from tests.simulator.test_cluster_parallel_routers import MODEL3, ShapedLayer, stages_cost
from tests.simulator.toy_traces import seq, toy_part, write_toy_trace


def test_a_stage_as_slow_as_the_send_keeps_its_all_reduces_on_the_critical_path(monkeypatch):
    """TP 2 x PP 2 of the 3-layer toy model (stages of 2.5 and 1.5 s, each layer 0.5 s of
    all-reduces), 2 micro-batches, a send of 2.5 s: as slow as stage 0. The later micro-batch's
    step through stage 0 is as long as its send, so stage 0's 2 layers' all-reduces are on a
    critical path: (3 + 2) x 0.5 = 2.5 s (a tie read as the send's bottleneck: 1.5 s)."""
    ramp = Ramp(eff_max=1.0, ramp_bytes=1e-30, ramp_exponent=1.0, latency_s=2.5)
    monkeypatch.setattr(comm, "load_params", lambda: CommParams({p: {"ring": ramp, "p2p": ramp} for p in comm.PATHS}))
    cost = stages_cost(toy_part(interconnect_bytes_per_s=1e30), MODEL3, Parallelism(tp=2, pp=2), ShapedLayer())
    parts = {k: v.tolist() for k, v in cost.breakdown(8, 16, 2, 2).items()}
    assert parts == {"total_s": [9.0], "all_reduce_s": [2.5], "send_recv_s": [2.5], "bubble_s": [5.0]}


def test_interleaved_passes_are_one_micro_batch_each(tmp_path, quarter_second_collectives):
    """PP 2 interleaved (2 virtual engines), four requests at once: each engine's pass carries two
    streams and runs as one micro-batch (stage 1 s + send 0.25 s + stage 1 s = 2.25 s), so the
    sends are 0.25 of each 2.25 s pass. Kills `breakdown` ignoring `micro=1` (each pass cut into
    the schedule's 2 micro-batches: 3.25 s, a send share of 0.25 / 3.25)."""
    hw = toy_part(interconnect_bytes_per_s=1e30)
    cost = one_second_stages(hw, Parallelism(pp=2, schedule="interleave"))
    assert cost.breakdown(8, 20, 2, micro=1)["total_s"].tolist() == [2.25]
    assert cost.breakdown(8, 20, 2)["total_s"].tolist() == [3.25]  # drained: the pass cut in two
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 2)] * 4, [4] * 4, arrivals=[0.0] * 4))
    res, pipelines = replay_interleaved(w, hw, MODEL, ReplayConfig(max_seqs=4), cost)
    assert 2 in pass_totals(res)["query_groups"].tolist()  # two streams in a pass
    shares = comm_shares(res, cost, pipelines)
    assert shares["send_recv_share_percent"] == pytest.approx(100 * 0.25 / 2.25)
    assert shares["all_reduce_share_percent"] == 0.0 and np.isfinite(shares["pipeline_bubble_percent"])


def test_memory_plan_refuses_a_stage_of_no_layer():
    """Was: memory_plan(h100, llama-3-8b, pp=40) divided by a stage's zero KV bytes per token
    (ZeroDivisionError) where Parallelism.check had not run first."""
    with pytest.raises(UsageError, match="--pp 40 exceeds the model's 32 layers"):
        memory_plan(get_hardware("h100-sxm"), get_model("llama-3-8b"), Parallelism(pp=40))
    assert stage_layers(32, 32) == [1] * 32
