"""simulator/cluster/replicas.py: what the cluster tests left unpinned (a mutation round: 27
mutants, 19 killed by tests/simulator/test_cluster*.py, 4 equivalent, 4 killed here).

Equivalent (same results by construction): a cut at the stretch's last pass (`m <= len(ends)`:
it ends there anyway), waiting out a zero-length remainder (`end >= now`), `_passes_ended`
capped at `last` instead of `last - 1` (a running stretch's now never passes its last end), and
the device's pass counter (read by nothing on a replica)."""

from __future__ import annotations

import pytest

import simulator.replay as replay_mod
from simulator.cluster import replicas as replicas_mod
from simulator.cluster import routers
from simulator.cluster.routers.base import Router
from simulator.cluster.run import ClusterConfig, simulate
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig
from simulator.workload import load_workload
from tests.simulator.toy_traces import MODEL_META, one_second_cost, seq, toy_part, write_toy_trace

MODEL = ModelSpec.from_trace_meta(MODEL_META)  # 2 layers


def _run(tmp_path, arrivals, lengths, replicas, router):
    hw = toy_part()
    w = load_workload(
        write_toy_trace(tmp_path / "t", [seq(4, n) for n in lengths], [4] * len(lengths), arrivals=arrivals)
    )
    cfg, deployment = ReplayConfig(max_seqs=8), ClusterConfig(replicas=replicas, router=router)
    return simulate(w, hw, MODEL, cfg, deployment, params=one_second_cost(hw, MODEL).params)


class Pinned(Router):
    """Request i to replica PLAN[i] (a test's own routing)."""

    name = "pinned"
    PLAN = (0, 1, 0, 0, 1)

    def choose(self, request: int, replicas) -> int:
        return self.PLAN[request]


def test_two_arrivals_in_one_pass_of_a_running_stretch(tmp_path, monkeypatch):
    """Three replicas (so replica 0 plans its stretch to the 5 s arrival, two arrivals past the
    next); C at 1.5 s cuts it after its second pass, and D, also routed to replica 0, lands in that
    same pass: it leaves the cut as it is (cutting again triggered a spent event, a RuntimeError),
    and both are admitted when the pass ends, as in the pass-by-pass replay."""
    monkeypatch.setitem(routers.ROUTERS, "pinned", Pinned)
    args = (tmp_path, [0.0, 0.0, 1.5, 1.6, 5.0], [8, 2, 2, 2, 2], 3, "pinned")
    fast = _run(*args)
    assert fast.requests["replica"].tolist() == list(Pinned.PLAN)
    assert (2, "admit", 2.0) in fast.timeline() and (3, "admit", 2.0) in fast.timeline()
    monkeypatch.setattr(replay_mod, "MAX_STRETCH_PASSES", 1)
    assert fast.timeline() == _run(*args).timeline()


def test_merged_events_are_in_time_order(tmp_path):
    """The merged replicas' events are one list by time (ReplayResult.events: simulated order),
    not replica by replica or request by request."""
    res = _run(tmp_path, [0.0, 0.0, 1.5, 5.0], [8, 2, 2, 2], 2, "round_robin")
    times = [t for _, _, t in res.events]
    assert times == sorted(times) and {r for r, _, _ in res.events} == {0, 1, 2, 3}
    assert [r for r, _, _ in res.events] != sorted(r for r, _, _ in res.events)  # interleaved across requests


def test_replicas_plan_to_the_arrival_k_minus_1_past_the_next_and_share_page_arrays(tmp_path, monkeypatch):
    """Replica 0's first stretch (A's passes at 0 s, 2 replicas) is planned up to the arrival one
    past the next (D at 5 s), not to the next (C at 1.5 s, which cuts it after its second pass);
    every replica plans from replica 0's arrays of page counts, one copy."""
    plans, arrays = [], set()
    plan = replicas_mod.ReplicaReplay.plan

    def spy(self, batch):
        out = plan(self, batch)
        plans.append((self.index, float(self._ends[-1])))
        arrays.add((id(self.blocks), id(self.peak_blocks)))
        return out

    monkeypatch.setattr(replicas_mod.ReplicaReplay, "plan", spy)
    _run(tmp_path, [0.0, 0.0, 1.5, 5.0], [8, 2, 2, 2], 2, "round_robin")
    assert plans[0] == (0, pytest.approx(5.0))  # passes ending at 1, 2, ... 5: the one D arrives in
    assert {index for index, _ in plans} == {0, 1} and len(arrays) == 1
