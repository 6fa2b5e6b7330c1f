"""Many replicas behind a router: one global arrival stream, each replica its own scheduler,
KV pool and device, all in one SimPy environment.

What: `ReplicaReplay` is the single-device `simulator.replay.Replay` (same scheduler, planner,
KV pool and engine process) placed on a shared environment and fed by a `Cluster`: the cluster
owns the arrival stream (the trace's times, Poisson, or closed-loop clients, computed once by
replica 0 exactly as a lone replay computes them) and, at each arrival, asks its router
(`simulator.cluster.routers`) which replica serves the request. A replica counts the requests
routed elsewhere as done for it, so its engine ends when the whole stream is served.

Ties at one instant resolve as in a lone replay: a replica's engine pulls every arrival due by
now (through the cluster) before it schedules. A replica's stretch of passes is not stopped by
arrivals routed elsewhere; one routed to it cuts the stretch after the pass it lands in, where a
lone replay would have planned it to stop (`CuttableDevice`), so 8 replicas do not all replan at
every arrival and the timeline stays the pass-by-pass one (tests compare exact timelines). A
router asking mid-stretch sees each of its requests at the pass it is in, as pass by pass
(`ReplicaReplay.next_tokens_and_blocks`; the pass pointer itself moves when the stretch commits).

`merge` flattens the replicas into one object `simulator.simtrace.collect` reads, so a cluster
run gives one `ReplayResult` and one simulated trace (batch indices numbered replica by replica).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import numpy as np
import simpy

from simulator.cluster.routers import get_router
from simulator.replay import ArrivalStream, Device, Replay, ReplayConfig, Stretch, run_env, start_arrivals
from simulator.workload import Workload


class CuttableDevice(Device):
    """The replica's device: a stretch of passes runs to its end, or to the end of the pass in
    which a request routed to this replica arrives (`ReplicaReplay.arrive` cuts it)."""

    def __init__(self, env: simpy.Environment, replica: ReplicaReplay) -> None:
        super().__init__(env)
        self.replica = replica

    def run(self, seconds: float, passes: int):
        rep = self.replica
        yield self.env.timeout(seconds) | rep._cut
        if rep._cut_m is not None:
            assert rep._ends is not None, "a stretch is cut only while it runs"
            end = float(rep._ends[rep._cut_m - 1])
            if end > self.env.now:
                yield self.env.timeout(end - self.env.now)
            seconds, passes = float(np.sum(rep._durations[: rep._cut_m])), rep._cut_m
        self.busy_s += seconds
        self.passes += passes


class ReplicaReplay(Replay):
    """One replica: a `Replay` on the cluster's environment, its arrivals handed in by the cluster.

    Its stretches do not stop for arrivals that may go elsewhere; an arrival routed here cuts the
    running stretch after the pass it lands in (where a lone replay would have planned it to stop),
    and `commit` keeps only the passes that ran."""

    def __init__(
        self, workload: Workload, cost, model, hardware, config: ReplayConfig, cluster: Cluster, index: int
    ) -> None:
        self.cluster, self.index = cluster, index
        super().__init__(workload, cost, model, hardware, config)
        if cluster.replicas and cost is cluster.replicas[0].cost:  # one cache of pass costs
            self.pass_costs = cluster.replicas[0].pass_costs
        self.env = cluster.env
        self.device = CuttableDevice(self.env, self)
        self.done = cluster.done
        self._ends: np.ndarray | None = None  # end of each planned pass, while a stretch runs
        self._stretch_requests = np.zeros(0, np.int64)  # the running stretch's batch
        self._durations = np.zeros(0)
        self._cut = self.env.event()
        self._cut_m: int | None = None
        self.on_finish: Callable[[int, float], None] | None = None  # disaggregation sends the KV on

    def _page_counts(self, workload: Workload, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Replica 0's arrays (one workload, one block size): one (passes,) copy for all replicas."""
        if self.cluster.replicas:
            return self.cluster.replicas[0].blocks, self.cluster.replicas[0].peak_blocks
        return super()._page_counts(workload, block_size)

    def pull_arrivals(self, upto: float) -> None:
        self.cluster.pull_arrivals(upto)

    def next_arrival_s(self) -> float:
        """Planning horizon: as many arrivals ahead as there are replicas (a stretch an arrival
        will soon cut is not costed a thousand passes ahead)."""
        return self.cluster.horizon_s()

    def plan(self, batch: dict[int, int]) -> Stretch:
        out = super().plan(batch)
        self._durations = out.durations_s
        self._ends = self.planned_ends_s
        self._stretch_requests = out.requests
        self._cut, self._cut_m = self.env.event(), None
        return out

    def arrive(self, r: int, t: float) -> None:
        super().arrive(r, t)
        if self._ends is not None and self._cut_m is None:
            m = int(self._ends.searchsorted(t, side="left")) + 1  # the pass it lands in ends the stretch
            if m < len(self._ends):
                self._cut_m = m
                self._cut.succeed()

    def next_tokens_and_blocks(self, rs, limit=None) -> tuple[np.ndarray, np.ndarray]:
        """The replay's, as of now: while a stretch runs (a router asking at an arrival) its
        requests are at the pass they are in, not at the stretch's first (the pass pointer moves
        when the stretch commits), so the router sees what it sees in the pass-by-pass replay."""
        ran = self._passes_ended()
        if not ran:
            return super().next_tokens_and_blocks(rs, limit)
        self.ptr[self._stretch_requests] += ran
        try:
            return super().next_tokens_and_blocks(rs, limit)
        finally:
            self.ptr[self._stretch_requests] -= ran

    def _passes_ended(self) -> int:
        """Passes of the running stretch ended before now, short of its last (whose end commits it).
        One ending just now has not committed yet (an arrival at that instant is routed first)."""
        if self._ends is None:
            return 0
        last = len(self._ends) if self._cut_m is None else self._cut_m
        return min(int(self._ends.searchsorted(self.env.now, side="left")), last - 1)

    def commit(self, s: Stretch) -> None:
        m, self._ends, self._cut_m = self._cut_m, None, None
        super().commit(s if m is None else s.cut(m))

    def _finish(self, r: int, t: float) -> None:
        super()._finish(r, t)
        if self.on_finish is not None:
            self.on_finish(r, t)

    def not_mine(self) -> None:
        """A request routed to another replica: done, as far as this one is concerned."""
        self.n_done += 1
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()


class Cluster(ArrivalStream):
    """K replicas, a router and the global arrival stream."""

    def __init__(
        self,
        workload: Workload,
        costs: list,
        model,
        hardware,
        config: ReplayConfig,
        kv_capacity_bytes: list[int],
        router: str = "round_robin",
        env: simpy.Environment | None = None,
        replica_type: type[ReplicaReplay] = ReplicaReplay,
    ) -> None:
        self.env = env or simpy.Environment()
        self.w, self.config = workload, config
        n = workload.n_requests
        self.done = [self.env.event() for _ in range(n)] if config.arrival == "closed" else []
        self.replicas: list[ReplicaReplay] = []
        for k, (cost, kv) in enumerate(zip(costs, kv_capacity_bytes)):
            self.replicas.append(
                replica_type(
                    workload, cost, model, hardware, dataclasses.replace(config, kv_capacity_bytes=kv), self, k
                )
            )
        first = self.replicas[0]
        self.arrival_sorted_s, self._arrival_order = first.arrival_sorted_s, first._arrival_order
        self._next_arrival = 0
        self.router = get_router(router)()
        self.owner = np.full(n, -1, np.int64)

    # ---- the arrival stream (`ArrivalStream`, driven by `simulator.replay.start_arrivals`) -------
    def horizon_s(self) -> float:
        i = self._next_arrival + len(self.replicas) - 1
        return float(self.arrival_sorted_s[i]) if i < len(self.arrival_sorted_s) else math.inf

    def route(self, r: int) -> int:
        """The replica that serves request `r` (the router's choice)."""
        return int(self.router.choose(r, self.replicas))

    def arrive(self, r: int, t: float) -> None:
        k = self.route(r)
        self.owner[r] = k
        for j, replica in enumerate(self.replicas):
            if j != k:
                replica.not_mine()
        self.replicas[k].arrive(r, t)

    def replica_of(self, owner: np.ndarray) -> np.ndarray:
        """Replica index of each entry of `owner` (engine indices: one engine a replica here)."""
        return owner

    def start(self) -> list:
        """Start the arrival stream and the replicas' engines; return the engine processes."""
        start_arrivals(self.env, self)
        return [self.env.process(replica.engine()) for replica in self.replicas]

    def run(self) -> Cluster:
        run_env(self.env, self.env.all_of(self.start()))
        return self


def merge(replicas: Sequence[Replay], owner: np.ndarray) -> SimpleNamespace:
    """One replay-shaped view of several replicas (what `simulator.simtrace.collect` reads)."""
    first = replicas[0]
    n = first.w.n_requests
    rows, cols = np.maximum(owner, 0), np.arange(n)

    def pick(name):
        return np.stack([getattr(r, name) for r in replicas])[rows, cols]

    stretches, offset = [], 0
    for r in replicas:
        stretches += [st.renumbered(st.first_batch + offset) for st in r.stretches]
        offset += r.n_pass
    events = sorted((e for r in replicas for e in r.events), key=lambda e: e[2])
    error = {k: v for r in replicas for k, v in r.error.items()}
    pool = SimpleNamespace(
        bytes_per_block=first.pool.bytes_per_block,
        peak_blocks=max(r.pool.peak_blocks for r in replicas),
        capacity_blocks=first.pool.capacity_blocks,
    )
    return SimpleNamespace(
        w=first.w,
        stretches=stretches,
        arrival_s=pick("arrival_s"),
        start_s=pick("start_s"),
        finish_s=pick("finish_s"),
        preemptions=sum(r.preemptions for r in replicas),
        error=error,
        config=first.config,
        pool=pool,
        n_pass=offset,
        events=events,
        device=SimpleNamespace(busy_s=sum(r.device.busy_s for r in replicas)),
        capacity_bytes=sum(r.capacity_bytes for r in replicas),
        hardware=first.hardware,
        model=first.model,
        cost=first.cost,
        n_requests=n,
        blocks=first.blocks,
    )
