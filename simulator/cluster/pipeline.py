"""Pipeline parallelism with batches in flight: `--pp-schedule interleave` (docs/cluster.md).

What: vLLM runs a PP replica as `pp` *virtual engines* (V0: `LLMEngine` keeps one scheduler per
virtual engine, each with `num_gpu_blocks // pipeline_parallel_size` KV blocks, and a new
request goes to the scheduler with the fewest unfinished requests; V1 keeps `pp` batches in its
batch queue). Each virtual engine's batch is one micro-batch through the stages, its requests
disjoint from the others'; while batch A is in stage 2, batch B runs in stage 1.

How: `replay_interleaved` runs `micro_batches` (default `pp`) `VirtualEngine`s, each the
single-device replay's scheduler, planner and KV pool (1/M of the replica's) on one SimPy
environment, fed by `replicas.Cluster` with the `least_outstanding` router (vLLM's rule). They
share one `Pipeline`: a pass enters stage 1 when the stage is free and its engine's previous pass
has left the last stage (the engine schedules again only then); it enters each later stage when
its activations have arrived (one send/recv) and the stage is free, in the order the passes
entered stage 1 (a permutation flow shop: the stage workers take their inputs in order). The host
work of a pass (step overhead, per-request term) runs on stage 1's driver before its layers.

A pass's time depends on the other engines' passes in the stages, so each engine plans one pass
at a time (`Replay.one_pass_at_a_time`): an interleaved replay costs one SimPy event per pass.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import simpy

from simulator.cluster.disaggregation import DecodeCluster
from simulator.cluster.parallel import ParallelCost
from simulator.cluster.replicas import Cluster, ReplicaReplay, merge
from simulator.cluster.routers import get_router
from simulator.hardware import HardwareSpec
from simulator.models import ModelSpec
from simulator.replay import PASS_COST_CACHE, Device, ReplayConfig, check_runnable, kv_capacity_bytes, resize
from simulator.workload import Workload


class Pipeline:
    """The stages of one replica: when each is free next, and what they did (the bubble)."""

    def __init__(self, pp: int) -> None:
        self.free = [0.0] * pp
        self.span_s = 0.0  # time with at least one pass in the pipeline (its host work included)
        self.gpu_span_s = 0.0  # the same, from each pass's first layer (host work excluded)
        self.work_s = 0.0  # stage-seconds of layers run
        self._last_end = 0.0

    def run_pass(self, ready: float, stages: np.ndarray, sends: np.ndarray, host: float) -> float:
        """Time the pass leaves the last stage, having entered stage 1 at `ready` or when free
        (`sends`: each stage boundary's send/recv seconds)."""
        start = max(ready, self.free[0])
        first_layer = start + host
        t = self.free[0] = first_layer + float(stages[0])
        for s in range(1, len(self.free)):
            t = self.free[s] = max(t + float(sends[s - 1]), self.free[s]) + float(stages[s])
        # passes enter stage 1 in order and leave the last stage in order: the union of their
        # intervals grows by the part of each past the previous end
        self.span_s += t - max(start, self._last_end)
        self.gpu_span_s += t - max(first_layer, self._last_end)
        self._last_end = t
        self.work_s += float(np.sum(stages))
        return t

    @property
    def idle_s(self) -> float:
        """The stages' mean idle time while a pass is on the GPUs (host work excluded): over the
        busy time, the bubble (with passes one after the other, the drain schedule's)."""
        return max(self.gpu_span_s - self.work_s / len(self.free), 0.0)

    def bubble_percent(self) -> float:
        return bubble_percent([self])


class ReplicaKV:
    """The KV blocks one replica's engines hold together: each engine's latest pass's, summed."""

    def __init__(self, engines: int) -> None:
        self.held = [0] * engines
        self.peak_blocks = 0

    def hold(self, engine: int, blocks: int) -> None:
        self.held[engine] = blocks
        self.peak_blocks = max(self.peak_blocks, sum(self.held))


class PipelineDevice(Device):
    """A virtual engine's view of the shared pipeline: its pass runs when the stages let it."""

    def __init__(self, env: simpy.Environment, engine: VirtualEngine, pipeline: Pipeline) -> None:
        super().__init__(env)
        self.engine, self.pipeline = engine, pipeline

    def run(self, seconds: float, passes: int):
        ve, now = self.engine, self.env.now
        end = now if ve.pending is None else self.pipeline.run_pass(now, *ve.pending)
        ve.pass_s = end - now
        yield self.env.timeout(ve.pass_s)
        self.busy_s += ve.pass_s
        self.passes += passes


class VirtualEngine(ReplicaReplay):
    """One of the replica's batches in flight: a scheduler and 1/M of the KV pool, one pass at a time."""

    one_pass_at_a_time = True
    cost: ParallelCost

    def __init__(self, workload, cost, model, hardware, config, cluster: Cluster, index: int) -> None:
        super().__init__(workload, cost, model, hardware, config, cluster, index)
        self.kv: ReplicaKV | None = None  # its replica's pages, set by PipelinedCluster
        self.pending: tuple[np.ndarray, np.ndarray, float] | None = None  # the planned pass: stages, sends, host
        self.pass_s = 0.0  # how long it took, stage waits included
        first = cluster.replicas[0] if cluster.replicas else self
        self.stage_costs: dict[tuple, tuple[np.ndarray, np.ndarray]] = getattr(first, "stage_costs", {})

    def _admissible(self, r: int) -> str:
        problem = super()._admissible(r)
        if problem and self.peak_blocks[r] > self.pool.capacity_blocks:
            n = getattr(self.cluster, "engines_per_replica", 1)
            problem += f" (its engine's 1/{n} of the replica's pool: {n} batches in flight, as vLLM V0 splits it)"
        return problem

    def _pass_times(self, q, kv, g, lg, n_requests: int, until: float = math.inf) -> np.ndarray:
        """The planned pass's time alone in the pipeline (its stages are kept for the device; one
        pass, so `until` leaves nothing out)."""
        assert len(q) == 1, "a virtual engine plans one pass at a time"
        key = tuple(float(np.asarray(x).ravel()[0]) for x in (q, kv, g, lg))
        if key[0] <= 0:
            self.pending = None
            return np.zeros(1)
        if key not in self.stage_costs:
            if len(self.stage_costs) >= PASS_COST_CACHE:
                self.stage_costs.clear()
            self.stage_costs[key] = self.cost.stage_times(*key)
        stages, sends = self.stage_costs[key]
        host = self.cost.params.step_overhead_s + getattr(self.cost, "per_request_s", 0.0) * n_requests
        self.pending = (stages, sends, host)
        return np.array([host + float(stages.sum()) + float(sends.sum())])

    def plan(self, batch: dict[int, int]):
        out = super().plan(batch)
        if self.kv is not None:  # the pass's pages, held until the engine's next pass
            rows = out.demand.blocks if out.demand is not None else self.blocks[out.first_pass]
            self.kv.hold(self.index % len(self.kv.held), int(np.sum(rows)))
        return out

    def commit(self, *args) -> None:
        """The pass as it ran: its duration includes its waits for busy stages."""
        super().commit(dataclasses.replace(args[0], durations_s=np.array([self.pass_s])))
        if self.kv is not None and not self.running:
            self.kv.hold(self.index % len(self.kv.held), 0)


class EngineGroup:
    """One replica's engines as one replica for the replica router (`routers.base`): its waiting and
    running requests, its pool (the engines' shares together), each request's next pass."""

    def __init__(self, engines: list[VirtualEngine], owner: np.ndarray, first: int) -> None:
        self.engines, self.owner, self.first = engines, owner, first
        self.pool = SimpleNamespace(capacity_blocks=sum(e.pool.capacity_blocks for e in engines))

    @property
    def waiting(self) -> list[int]:
        return [r for e in self.engines for r in e.waiting]

    @property
    def running(self) -> list[int]:
        return [r for e in self.engines for r in e.running]

    def next_tokens_and_blocks(self, rs) -> tuple[np.ndarray, np.ndarray]:
        rs = np.asarray(rs, np.int64)
        q, b = np.zeros(len(rs), np.int64), np.zeros(len(rs), np.int64)
        for i, e in enumerate(self.engines):
            mine = self.owner[rs] == self.first + i
            if mine.any():
                q[mine], b[mine] = e.next_tokens_and_blocks(rs[mine])
        return q, b


class PipelinedCluster(Cluster):
    """K replicas of M virtual engines: the replica router picks the replica (its engines seen as
    one, `EngineGroup`), then the replica's engine with the fewest unfinished requests (vLLM)."""

    def __init__(
        self,
        workload,
        cost: ParallelCost,
        model,
        hardware,
        config,
        pool_bytes: int,
        k: int,
        router: str,
        env: simpy.Environment | None = None,
    ) -> None:
        m = cost.par.micro
        pools = [pool_bytes // m] * (k * m)
        super().__init__(
            workload, [cost] * (k * m), model, hardware, config, pools, "least_outstanding", env, VirtualEngine
        )
        self.engines_per_replica = m
        self.replica_router = get_router(router)()
        self.groups = [EngineGroup(self.engines(j), self.owner, j * m) for j in range(k)]
        self.pipelines = [Pipeline(cost.par.pp) for _ in range(k)]
        self.kv = [ReplicaKV(m) for _ in range(k)]
        for i, ve in enumerate(self.engines()):
            ve.device = PipelineDevice(self.env, ve, self.pipelines[i // m])
            ve.kv = self.kv[i // m]

    def engines(self, replica: int | None = None) -> list[VirtualEngine]:
        """The virtual engines, all or one replica's."""
        m = self.engines_per_replica
        out = self.replicas if replica is None else self.replicas[replica * m : (replica + 1) * m]
        return [ve for ve in out if isinstance(ve, VirtualEngine)]

    def route(self, r: int) -> int:
        j = int(self.replica_router.choose(r, self.groups)) if len(self.groups) > 1 else 0
        return j * self.engines_per_replica + int(self.router.choose(r, self.groups[j].engines))

    def replica_of(self, owner: np.ndarray) -> np.ndarray:
        """Replica index of each engine index (-1 stays -1)."""
        return np.where(owner >= 0, owner // self.engines_per_replica, -1)

    def replica_view(self, merged) -> None:
        """`merge(...)`'s view made per replica: its pool is its engines' together, its peak the most
        pages they held at once, its busy time the pipeline's (not the engines' summed waits)."""
        merged.pool.capacity_blocks = sum(ve.pool.capacity_blocks for ve in self.engines(0))
        merged.pool.peak_blocks = max(kv.peak_blocks for kv in self.kv)
        merged.device.busy_s = sum(p.span_s for p in self.pipelines)


def bubble_percent(pipelines: list[Pipeline]) -> float:
    """The replicas' pipeline bubble together: idle stage time over busy time, summed."""
    span = sum(p.span_s for p in pipelines)
    return float(100 * sum(p.idle_s for p in pipelines) / span) if span else 0.0


def replay_interleaved(
    workload: Workload,
    hardware: HardwareSpec,
    model: ModelSpec,
    config: ReplayConfig,
    cost: ParallelCost,
    replicas: int = 1,
    router: str = "round_robin",
):
    """PP replicas under the interleaved schedule: (`ReplayResult`, the `Pipeline` of each replica).
    `requests` gains `replica` and `virtual_engine` (which of its replica's batches it rode in)."""
    from simulator.simtrace import collect

    pool = kv_capacity_bytes(hardware, model, config)
    cluster = PipelinedCluster(resize(workload, config), cost, model, hardware, config, pool, replicas, router)
    cluster.run()
    merged = merge(cluster.replicas, cluster.owner)
    cluster.replica_view(merged)
    res = check_runnable(collect(merged), hardware)
    res.requests["replica"] = cluster.replica_of(cluster.owner)
    res.requests["virtual_engine"] = np.where(cluster.owner >= 0, cluster.owner % cluster.engines_per_replica, -1)
    if replicas > 1:
        owner = res.requests["replica"].to_numpy()
        res.metrics["requests_per_replica"] = np.bincount(owner[owner >= 0], minlength=replicas).tolist()
    return res, cluster.pipelines


class PipelinedDecodeCluster(PipelinedCluster, DecodeCluster):
    """Disaggregation's decode replicas, each M engines: requests arrive when their KV transfer ends."""
