"""SimPy replay: a trace's workload served by one device under continuous batching.

What: requests arrive (the trace's own times, Poisson at a rate, or a closed loop of C clients);
a scheduler (the shared `scheduling` package, FCFS by default; the replay implements its
`ServingState` protocol) forms each forward pass's batch under caps
on sequences and batched tokens; a paged KV pool of the device's memory minus the weights admits
requests, and preempts them (recompute) when full; the device runs one batched pass at a time,
costing `cost.step_time_s(sum query tokens, sum KV read, sum streams, sum logit rows)`.

How it stays fast (1,000 requests x 500 tokens in well under 2 s): the batch only changes at a
*boundary*: an arrival, a completion, a pass that would not fit the pool, or a waiting request
that would now fit. Between boundaries the passes of a fixed batch are planned at once with numpy
(a requests x passes gather of the workload's flat arrays) and the device serves the whole stretch
as one SimPy timeout. The timeline is the one a pass-by-pass loop would give: every stretch ends
at the first pass boundary where the scheduler could decide differently.

SimPy as its examples are written (carwash.py): `Device` owns the `Resource`; `arrivals`,
`closed_loop_client` and `Replay.engine` are generator processes.

    from simulator.replay import ReplayConfig, replay
    result = replay(workload, get_hardware("h100-sxm"), get_model("llama-3-8b"), ReplayConfig(rate=8))
    result.metrics["median_ttft_ms"]
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np
import simpy

from profiler.errors import UsageError
from scheduling import get_scheduler
from simulator.hardware import HardwareSpec
from simulator.models import ModelSpec
from simulator.workload import Workload

MAX_STRETCH_PASSES = 1024  # passes planned at once (bounds the requests x passes gather)
SCALAR_COST_BELOW = 48  # fewer passes than this: cost them one by one (cached scalar path)


@dataclass(frozen=True)
class ReplayConfig:
    """Batch settings and the arrival process (vLLM's defaults where it has one)."""

    max_seqs: int = 256  # vLLM max_num_seqs
    max_batch_tokens: int = 8192  # vLLM max_num_batched_tokens
    block_size: int = 16  # KV page, tokens (vLLM block_size)
    memory_utilization: float = 0.9  # vLLM gpu_memory_utilization: share of device memory used
    kv_capacity_bytes: int | None = None  # None: memory x utilization - weights
    rate: float | None = None  # Poisson requests/s (inf: all at t=0); None with concurrency None: trace
    concurrency: int | None = None  # closed loop: C clients, each sends its next when one finishes
    num_requests: int | None = None  # None: the workload's; more or fewer: cycle through it
    scheduler: str = "fcfs"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("max_seqs", "max_batch_tokens", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise UsageError(f"{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if not 0 < self.memory_utilization <= 1:
            raise UsageError(f"memory utilization must be in (0, 1], got {self.memory_utilization!r}")
        if self.kv_capacity_bytes is not None and not self.kv_capacity_bytes > 0:
            raise UsageError(f"KV capacity must be > 0 bytes, got {self.kv_capacity_bytes!r}")
        if self.rate is not None and not (self.rate > 0):  # also refuses NaN
            raise UsageError(f"rate must be > 0 requests/s (or inf), got {self.rate!r}")
        if self.concurrency is not None and (not isinstance(self.concurrency, (int, np.integer)) or self.concurrency < 1):
            raise UsageError(f"concurrency must be a positive integer, got {self.concurrency!r}")
        if self.rate is not None and self.concurrency is not None:
            raise UsageError("give a rate or a concurrency, not both")
        if self.num_requests is not None and self.num_requests < 1:
            raise UsageError(f"num-requests must be >= 1, got {self.num_requests!r}")
        get_scheduler(self.scheduler)  # KeyError listing the policies

    @property
    def arrival(self) -> str:
        return "closed" if self.concurrency is not None else "poisson" if self.rate is not None else "trace"

    def describe(self) -> dict:
        return {**asdict(self), "arrival": self.arrival, "rate": None if self.rate is None else float(self.rate)}


def kv_capacity_bytes(hardware: HardwareSpec, model: ModelSpec, config: ReplayConfig) -> int:
    """Bytes the KV pool may use: the device's memory share minus the weights (one copy)."""
    if config.kv_capacity_bytes is not None:
        return int(config.kv_capacity_bytes)
    usable = int(hardware.hbm_capacity_bytes * config.memory_utilization)
    free = usable - model.weight_bytes
    if free <= 0:
        raise UsageError(f"{model.name} weights ({model.weight_bytes / 2**30:.1f} GiB) leave no room for KV in "
                         f"{hardware.name}'s {usable / 2**30:.1f} GiB usable memory; pick a larger part or model "
                         f"a smaller one")
    return free


@dataclass(frozen=True)
class Stretch:
    """Passes a fixed batch ran back to back: one row per request, one column per pass."""

    requests: np.ndarray  # (R,) request positions in the batch
    first_pass: np.ndarray  # (R,) flat workload index of each request's first pass in the stretch
    rebuild: np.ndarray  # (R,) bool: this (single) pass re-prefills the request's KV (recompute)
    starts_s: np.ndarray  # (m,) start of each pass
    durations_s: np.ndarray  # (m,)
    first_batch: int  # global index of the stretch's first pass


class Device:
    """The accelerator: one batched forward pass (or stretch of passes) at a time."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.resource = simpy.Resource(env, capacity=1)
        self.busy_s = 0.0
        self.passes = 0

    def run(self, seconds: float, passes: int):
        with self.resource.request() as req:
            yield req
            yield self.env.timeout(seconds)
        self.busy_s += seconds
        self.passes += passes


class KVPool:
    """Paged KV memory in blocks of `block_size` tokens; knows its bytes and its peak."""

    def __init__(self, capacity_bytes: int, block_size: int, kv_bytes_per_token: int) -> None:
        self.block_size = block_size
        self.bytes_per_block = block_size * kv_bytes_per_token
        self.capacity_blocks = capacity_bytes // self.bytes_per_block
        if self.capacity_blocks < 1:
            raise UsageError(f"KV pool of {capacity_bytes} bytes holds no {block_size}-token block "
                             f"({self.bytes_per_block} bytes)")
        self.used_blocks = 0
        self.peak_blocks = 0

    def note(self, blocks_per_pass: np.ndarray | int) -> None:
        self.peak_blocks = max(self.peak_blocks, int(np.max(blocks_per_pass)))


def arrivals(env: simpy.Environment, sim: Replay):
    """Open loop: each request arrives at its precomputed time (trace or Poisson)."""
    for t in sim.arrival_sorted_s:
        if t > env.now:
            yield env.timeout(t - env.now)
        sim.pull_arrivals(upto=t)


def closed_loop_client(env: simpy.Environment, sim: Replay, queue: deque):
    """One of C clients: send a request, wait until it finishes, send the next."""
    while queue:
        r = queue.popleft()
        sim.arrive(r, env.now)
        yield sim.done[r]


class Replay:
    """One simulation: state arrays per request, the SimPy actors, the stretch planner."""

    def __init__(self, workload: Workload, cost, model: ModelSpec, hardware: HardwareSpec,
                 config: ReplayConfig) -> None:
        self.w, self.cost, self.model, self.hardware, self.config = workload, cost, model, hardware, config
        n = workload.n_requests
        self.env = simpy.Environment()
        self.device = Device(self.env)
        self.capacity_bytes = kv_capacity_bytes(hardware, model, config)
        self.pool = KVPool(self.capacity_bytes, config.block_size, model.kv_bytes_per_token)
        self.scheduler = get_scheduler(config.scheduler)(config.max_seqs, config.max_batch_tokens)
        bs = config.block_size
        self.blocks = -(-workload.alloc_kv_tokens // bs)  # (P,) blocks held after each pass
        self.off, self.npass = workload.offsets[:-1], workload.n_passes
        self.ptr = np.zeros(n, np.int64)  # passes done
        self.recompute = np.zeros(n, bool)  # preempted: KV must be rebuilt before the next pass
        self.arrival_s = np.full(n, np.nan)
        self.start_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.preemptions = np.zeros(n, np.int64)
        self.error: dict[int, str] = {}
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.events: list[tuple[int, str, float]] = []
        self.stretches: list[Stretch] = []
        self.n_done = 0
        self.n_pass = 0
        self._wakeup: simpy.Event | None = None
        self.done = [self.env.event() for _ in range(n)] if config.arrival == "closed" else []
        if config.arrival == "closed":
            self.arrival_sorted_s = np.zeros(0)
        else:
            if config.arrival == "trace":
                times = workload.arrival_s.astype(float)
            elif math.isinf(config.rate):
                times = np.zeros(n)
            else:  # vllm bench: the first request at once, then exponential gaps
                gaps = np.random.default_rng(config.seed).exponential(1.0 / config.rate, n)
                times = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
            self._arrival_order = np.argsort(times, kind="stable")
            self.arrival_sorted_s = times[self._arrival_order]
        self._next_arrival = 0

    # ---- scheduling.ServingState (running, waiting: attributes above) -------------------
    @property
    def pool_capacity_blocks(self) -> int:
        return self.pool.capacity_blocks

    def arrival_of(self, rs) -> np.ndarray:
        return self.arrival_s[np.asarray(rs, np.int64)]

    def prompt_tokens_of(self, rs) -> np.ndarray:
        return self.w.prompt_tokens[np.asarray(rs, np.int64)]

    def max_tokens_of(self, rs) -> np.ndarray:
        """The source's max_tokens knob where it has one, else each request's own output length."""
        rs = np.asarray(rs, np.int64)
        knob = (self.w.source.get("knobs") or {}).get("max_tokens")
        return np.full(len(rs), int(knob), np.int64) if knob else self.w.output_tokens[rs]

    def remaining_passes(self, rs) -> np.ndarray:
        rs = np.asarray(rs, np.int64)
        return self.npass[rs] - self.ptr[rs]

    # ---- demands -----------------------------------------------------------------------
    def next_demand(self, rs) -> tuple[np.ndarray, ...]:
        """(query, kv read, groups, logit rows, blocks after) of each request's next pass."""
        rs = np.asarray(rs, np.int64)
        w, idx = self.w, self.off[rs] + self.ptr[rs]
        rc = self.recompute[rs]
        if not rc.any():
            return w.query_tokens[idx], w.kv_tokens_read[idx], w.query_groups[idx], w.logit_tokens[idx], self.blocks[idx]
        q, kv, g, lg, b = (a[np.minimum(idx, len(a) - 1)].copy() for a in (w.query_tokens, w.kv_tokens_read,
                                                                            w.query_groups, w.logit_tokens, self.blocks))
        prev = idx[rc] - 1  # rebuild the live KV of the last pass done, as one causal prefill
        q[rc] = np.maximum(w.live_kv_tokens[prev], 1)
        # readmitted only when its next real pass fits too, so it does not thrash (rebuild, evict, rebuild)
        kv[rc], g[rc], lg[rc], b[rc] = q[rc] * (q[rc] + 1) // 2, 1, 1, np.maximum(self.blocks[prev], self.blocks[idx[rc]])
        return q, kv, g, lg, b

    def next_tokens_and_blocks(self, rs) -> tuple[np.ndarray, np.ndarray]:
        q, _, _, _, b = self.next_demand(rs)
        return q, b

    # ---- request lifecycle ------------------------------------------------------------
    def pull_arrivals(self, upto: float) -> None:
        while self._next_arrival < len(self.arrival_sorted_s) and self.arrival_sorted_s[self._next_arrival] <= upto:
            i = self._next_arrival
            self._next_arrival += 1
            self.arrive(int(self._arrival_order[i]), float(self.arrival_sorted_s[i]))

    def next_arrival_s(self) -> float:
        i = self._next_arrival
        return float(self.arrival_sorted_s[i]) if i < len(self.arrival_sorted_s) else math.inf

    def arrive(self, r: int, t: float) -> None:
        self.arrival_s[r] = t
        self.events.append((r, "arrive", t))
        problem = self._admissible(r)
        if problem:
            self.error[r] = problem
            self.events.append((r, "error", t))
            self._finish(r, t)
            return
        self.waiting.append(r)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _admissible(self, r: int) -> str:
        w, cfg = self.w, self.config
        if self.npass[r] == 0:
            return f"source request has no forward passes (status {w.status[r]!r} in the source trace)"
        lo, hi = self.off[r], self.off[r] + self.npass[r]
        peak = int(self.blocks[lo:hi].max())
        if peak > self.pool.capacity_blocks:
            b = self.pool.bytes_per_block
            return (f"needs {peak * b} KV bytes ({peak * cfg.block_size} tokens) at its peak, more than the whole "
                    f"pool: {self.pool.capacity_blocks * b} bytes on {self.hardware.name} with {self.model.name}")
        widest = int(w.query_tokens[lo:hi].max())
        if widest > cfg.max_batch_tokens:
            return f"a pass of {widest} query tokens exceeds max-batch-tokens {cfg.max_batch_tokens} (prefill is not chunked)"
        return ""

    def admit(self, r: int) -> None:
        self.waiting.remove(r)
        self.running.append(r)
        if np.isnan(self.start_s[r]):
            self.start_s[r] = self.env.now
        self.events.append((r, "admit", float(self.env.now)))

    def preempt(self, r: int) -> None:
        self.running.remove(r)
        self.waiting.appendleft(r)
        self.recompute[r] = self.ptr[r] > 0
        self.preemptions[r] += 1
        self.events.append((r, "preempt", float(self.env.now)))

    def _finish(self, r: int, t: float) -> None:
        self.finish_s[r] = t
        self.n_done += 1
        if self.done:
            self.done[r].succeed()

    # ---- the engine ------------------------------------------------------------------
    def engine(self):
        env = self.env
        while self.n_done < self.w.n_requests:
            self.pull_arrivals(upto=env.now)
            running = self.scheduler.schedule(self)
            if not running:
                self._wakeup = env.event()
                yield self._wakeup
                continue
            R, idx0, rc, durations = self.plan(np.asarray(running, np.int64))
            starts = env.now + np.concatenate([[0.0], np.cumsum(durations[:-1])])
            yield env.process(self.device.run(float(np.sum(durations)), len(durations)))
            self.commit(R, idx0, rc, starts, durations)
            yield env.timeout(0)  # closed-loop clients of finished requests send their next first

    def _pass_times(self, q, kv, g, lg) -> np.ndarray:
        step = self.cost.step_time_s
        if len(q) < SCALAR_COST_BELOW:
            return np.array([step(int(a), int(b), int(c), int(d)) if a > 0 else 0.0 for a, b, c, d in zip(q, kv, g, lg)])
        out = np.zeros(len(q))
        on = q > 0
        if on.any():
            out[on] = step(q[on].astype(float), kv[on].astype(float), g[on].astype(float), lg[on].astype(float))
        return out

    def plan(self, R: np.ndarray):
        """The longest stretch of passes the batch R runs before the scheduler could decide otherwise."""
        cap, cfg = self.pool_capacity_blocks, self.config
        if self.recompute[R].any():  # a rebuild pass: one pass, then back to the normal plan
            q, kv, g, lg, b = self.next_demand(R)
            self.pool.note(b.sum())
            return R, self.off[R] + self.ptr[R] - self.recompute[R], self.recompute[R].copy(), self._pass_times(
                [q.sum()], [kv.sum()], [g.sum()], [lg.sum()])
        w = self.w
        idx0 = self.off[R] + self.ptr[R]
        m = int(min(self.remaining_passes(R).min(), MAX_STRETCH_PASSES))
        idx = idx0[:, None] + np.arange(m)[None, :]  # (R, m)
        blocks = self.blocks[idx].sum(0)
        q = w.query_tokens[idx].sum(0)
        over = np.flatnonzero(blocks > cap)
        if len(over):  # stop before the pass that would overflow: the scheduler preempts there
            m = max(int(over[0]), 1)
        head = self.scheduler.head(self)
        if head is not None and len(R) < cfg.max_seqs and m > 1:
            hq, hb = self.next_tokens_and_blocks([head])
            fits = np.flatnonzero((q[1:m] + hq[0] <= cfg.max_batch_tokens) & (blocks[1:m] + hb[0] <= cap))
            if len(fits):  # the head fits after pass j: stop there and admit it
                m = int(fits[0]) + 1
        idx = idx[:, :m]
        t_next = self.next_arrival_s()
        if math.isfinite(t_next) and m > 1:  # passes that start before the next arrival, plus the one it lands in
            probe = min(m, SCALAR_COST_BELOW)
            while True:
                d = self._pass_times(q[:probe], w.kv_tokens_read[idx[:, :probe]].sum(0),
                                     w.query_groups[idx[:, :probe]].sum(0), w.logit_tokens[idx[:, :probe]].sum(0))
                ends = self.env.now + np.cumsum(d)
                hit = np.flatnonzero(ends >= t_next)
                if len(hit) or probe == m:
                    m = int(hit[0]) + 1 if len(hit) else m
                    break
                probe = min(m, probe * 4)
            durations = d[:m]
        else:
            durations = self._pass_times(q[:m], w.kv_tokens_read[idx].sum(0), w.query_groups[idx].sum(0),
                                         w.logit_tokens[idx].sum(0))
        self.pool.note(blocks[:m])
        return R, idx0, np.zeros(len(R), bool), durations

    def commit(self, R, idx0, rc, starts, durations) -> None:
        m = len(durations)
        self.stretches.append(Stretch(R, idx0, rc, starts, durations, self.n_pass))
        self.n_pass += m
        if rc.any():  # rebuild pass: requests being rebuilt keep their pointer
            self.ptr[R[~rc]] += 1
            self.recompute[R[rc]] = False
        else:
            self.ptr[R] += m
        now = self.env.now
        finished = R[self.ptr[R] >= self.npass[R]]
        for r in finished.tolist():
            self.running.remove(r)
            self.events.append((r, "finish", float(now)))
            self._finish(r, now)
        rs = np.asarray(self.running, np.int64)
        self.pool.used_blocks = int(self.blocks[self.off[rs] + self.ptr[rs] - 1].sum())

    def run(self) -> Replay:
        env = self.env
        if self.config.arrival == "closed":
            queue = deque(range(self.w.n_requests))
            for _ in range(min(self.config.concurrency, self.w.n_requests)):
                env.process(closed_loop_client(env, self, queue))
        else:
            env.process(arrivals(env, self))
        env.run(until=env.process(self.engine()))
        return self


def replay(workload: Workload, hardware: HardwareSpec, model: ModelSpec, config: ReplayConfig | None = None,
           cost=None):
    """Replay `workload` on `hardware` with `model`; return a `simulator.simtrace.ReplayResult`.

    `cost` is anything with `step_time_s(query_tokens, kv_tokens_read, query_groups, logit_tokens)`
    taking scalars and numpy arrays; default `CostModel(hardware, model)`.
    """
    from simulator.cost import CostModel
    from simulator.simtrace import collect

    config = config or ReplayConfig()
    if config.num_requests is not None and config.num_requests != workload.n_requests:
        n, r = config.num_requests, workload.n_requests
        workload = workload.take(np.arange(n) % r)
        if config.arrival == "trace" and n > r:  # the trace's arrival pattern, repeated one period later each time
            last = float(workload.arrival_s[:r].max())
            period = last + (last / (r - 1) if r > 1 else 0.0)
            workload = dataclasses.replace(workload, arrival_s=workload.arrival_s + (np.arange(n) // r) * period)
    cost = cost if cost is not None else CostModel(hardware, model)
    return collect(Replay(workload, cost, model, hardware, config).run())
