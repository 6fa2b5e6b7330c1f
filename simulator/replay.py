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

SimPy as its examples are written (carwash.py): `arrivals`, `closed_loop_client` and
`Replay.engine` are generator processes; the engine runs each stretch on its `Device`.

    from simulator.replay import ReplayConfig, replay
    result = replay(workload, get_hardware("h100-sxm"), get_model("llama-3-8b"), ReplayConfig(rate=8))
    result.metrics["median_ttft_ms"]
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
import simpy

from profiler.errors import UsageError, is_count
from profiler.schema import MIN_RATE
from scheduling import get_scheduler
from scheduling.base import RESERVE_MODES
from simulator.cost import GEMM_TABLE_TOKENS
from simulator.demand import PREFILL, Demand, next_demand
from simulator.hardware import HardwareSpec
from simulator.models import ModelSpec
from simulator.slo import check_slo
from simulator.workload import Workload

MAX_STRETCH_PASSES = 1024  # passes planned at once (bounds the requests x passes gather)
MAX_REQUESTS = 1_000_000  # replayed requests: their pass arrays stay within a few GiB
SCALAR_COST_BELOW = 48  # passes the planner costs first when an arrival may end the stretch early
VECTOR_COST_FROM = 128  # this many passes or more: one vectorised cost call (fewer: one by one, cached)
# the cyclic collector's first-generation threshold while a simulation runs: its default (700
# allocations) ran a collection every few stretches, a tenth of a 10k-request cluster replay's CPU
GC_THRESHOLD = 100_000
# pass shapes whose cost is remembered: a stretch cut short is planned again from the same batch,
# so the same (query, KV read, streams, logits) sums come back; exact keys, cleared when full
PASS_COST_CACHE = 1 << 17
ATTENTION_COSTS = ("visible", "pool")  # ReplayConfig.attention


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
    chunked_prefill: bool = True  # vLLM's default: prompt prefills split to fit max_batch_tokens
    reserve: str = "current"  # admit by the next pass's pages (vLLM); "peak": reserve each request's peak
    sjf_oracle: bool = False  # SJF ranks by the passes each request has left (the future) instead of max_tokens
    # what a pass's attention scores: "visible", each row the KV it can see (the workload's
    # kv_tokens_read; a paged kernel); "pool", every row every slot of the pool's high-water mark
    # (the runtime's mask attention: one attention over all slots ever used, a mask hiding others')
    attention: str = "visible"
    seed: int = 0
    slo_ttft_ms: float | None = None  # goodput objectives (simulator/slo.py); None: not computed
    slo_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_seqs", "max_batch_tokens", "block_size"):
            v = getattr(self, name)
            if not is_count(v):
                raise UsageError(f"{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if not 0 < self.memory_utilization <= 1:
            raise UsageError(f"memory utilization must be in (0, 1], got {self.memory_utilization!r}")
        if self.kv_capacity_bytes is not None and not self.kv_capacity_bytes > 0:
            raise UsageError(f"KV capacity must be > 0 bytes, got {self.kv_capacity_bytes!r}")
        if self.rate is not None and not (self.rate >= MIN_RATE):  # also refuses NaN
            raise UsageError(f"rate must be > 0 requests/s, at least {MIN_RATE:g} (or inf), got {self.rate!r}")
        if self.concurrency is not None and not is_count(self.concurrency):
            raise UsageError(f"concurrency must be a positive integer, got {self.concurrency!r}")
        if self.rate is not None and self.concurrency is not None:
            raise UsageError("give a rate or a concurrency, not both")
        if not is_count(self.seed, 0):
            raise UsageError(f"seed must be an integer >= 0, got {self.seed!r}")  # numpy's generators take no negatives
        if self.num_requests is not None and not 1 <= self.num_requests <= MAX_REQUESTS:
            raise UsageError(f"num-requests must be in 1..{MAX_REQUESTS}, got {self.num_requests!r}")
        if self.reserve not in RESERVE_MODES:
            raise UsageError(f"reserve must be one of {', '.join(RESERVE_MODES)}, got {self.reserve!r}")
        if self.attention not in ATTENTION_COSTS:
            raise UsageError(f"attention must be one of {', '.join(ATTENTION_COSTS)}, got {self.attention!r}")
        check_slo(self.slo_ttft_ms, self.slo_tpot_ms)
        get_scheduler(self.scheduler)  # KeyError listing the policies
        if self.sjf_oracle and self.scheduler != "sjf":  # was: accepted, and only SJF reads it
            raise UsageError(f"--sjf-oracle ranks SJF's queue: give --scheduler sjf (got {self.scheduler})")

    @property
    def arrival(self) -> str:
        return "closed" if self.concurrency is not None else "poisson" if self.rate is not None else "trace"

    def describe(self) -> dict:
        return {**asdict(self), "arrival": self.arrival, "rate": None if self.rate is None else float(self.rate)}

    def make_scheduler(self):
        return get_scheduler(self.scheduler)(
            self.max_seqs,
            self.max_batch_tokens,
            chunked_prefill=self.chunked_prefill,
            reserve=self.reserve,
            oracle=self.sjf_oracle,
        )


def kv_capacity_bytes(hardware: HardwareSpec, model: ModelSpec, config: ReplayConfig) -> int:
    """Bytes the KV pool may use: the device's memory share minus the weights (one copy)."""
    if config.kv_capacity_bytes is not None:
        return int(config.kv_capacity_bytes)
    usable = int(hardware.hbm_capacity_bytes * config.memory_utilization)
    free = usable - model.weight_bytes
    if free <= 0:
        raise UsageError(
            f"{model.name} weights ({model.weight_bytes / 2**30:.1f} GiB) leave no room for KV in "
            f"{hardware.name}'s {usable / 2**30:.1f} GiB usable memory; pick a larger part or model "
            f"a smaller one"
        )
    return free


@dataclass(frozen=True)
class Stretch:
    """Passes a fixed batch ran back to back: one row per request, one column per pass."""

    requests: np.ndarray  # (R,) request positions in the batch
    first_pass: np.ndarray  # (R,) flat workload index of each request's first pass in the stretch
    starts_s: np.ndarray  # (m,) start of each pass
    durations_s: np.ndarray  # (m,)
    first_batch: int  # global index of the stretch's first pass
    demand: Demand | None = None  # a single pass whose rows are not the workload's (a chunk, a recompute)

    # (not dataclasses.replace: it inspects the fields on every call, and these run once a stretch)
    def cut(self, m: int) -> Stretch:
        """Its first m passes (a stretch an arrival cut short)."""
        return Stretch(
            self.requests, self.first_pass, self.starts_s[:m], self.durations_s[:m], self.first_batch, self.demand
        )

    def renumbered(self, first_batch: int) -> Stretch:
        """The same passes numbered from `first_batch` (several devices' passes in one numbering)."""
        return Stretch(self.requests, self.first_pass, self.starts_s, self.durations_s, first_batch, self.demand)


class Device:
    """The accelerator: one batched forward pass (or stretch of passes) at a time. Its one user is
    the engine, which waits for each stretch (`yield from device.run(...)`), so no SimPy Resource
    queues it (a request and a release per stretch were a tenth of a cluster replay's events)."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.busy_s = 0.0
        self.passes = 0

    def run(self, seconds: float, passes: int):
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
            raise UsageError(
                f"KV pool of {capacity_bytes} bytes holds no {block_size}-token block ({self.bytes_per_block} bytes)"
            )
        self.peak_blocks = 0

    def note(self, blocks_per_pass: np.ndarray | int) -> None:
        self.peak_blocks = max(self.peak_blocks, int(np.asarray(blocks_per_pass).max()))


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


class ArrivalStream:
    """An open-loop arrival stream over precomputed times (`arrival_sorted_s`, `_arrival_order`,
    a cursor `_next_arrival`), handing each arrival to `arrive`: a Replay's own, or a cluster's."""

    arrival_sorted_s: np.ndarray
    _arrival_order: np.ndarray
    _next_arrival: int

    def arrive(self, r: int, t: float) -> None:
        raise NotImplementedError

    def pull_arrivals(self, upto: float) -> None:
        while self._next_arrival < len(self.arrival_sorted_s) and self.arrival_sorted_s[self._next_arrival] <= upto:
            i = self._next_arrival
            self._next_arrival += 1
            self.arrive(int(self._arrival_order[i]), float(self.arrival_sorted_s[i]))

    def next_arrival_s(self) -> float:
        i = self._next_arrival
        return float(self.arrival_sorted_s[i]) if i < len(self.arrival_sorted_s) else math.inf


class Replay(ArrivalStream):
    """One simulation: state arrays per request, the SimPy actors, the stretch planner.

    Implements `scheduling.ServingState`, so the shared scheduler forms every batch."""

    # plan one pass per stretch (a pass whose timing depends on other batches sharing the device:
    # simulator.cluster.pipeline's interleaved stages)
    one_pass_at_a_time = False

    def __init__(
        self, workload: Workload, cost, model: ModelSpec, hardware: HardwareSpec, config: ReplayConfig
    ) -> None:
        self.w, self.cost, self.model, self.hardware, self.config = workload, cost, model, hardware, config
        n = workload.n_requests
        self.env = simpy.Environment()
        self.device = Device(self.env)
        self.capacity_bytes = kv_capacity_bytes(hardware, model, config)
        self.pool = KVPool(self.capacity_bytes, config.block_size, model.kv_bytes_per_token)
        self.scheduler = config.make_scheduler()
        self.blocks, self.peak_blocks = self._page_counts(workload, config.block_size)
        self.off, self.npass = workload.pass_starts, workload.n_passes
        self.ptr = np.zeros(n, np.int64)  # passes done
        self.chunk_done = np.zeros(n, np.int64)  # tokens of the current pass computed by earlier chunks
        self.recompute = np.zeros(n, bool)  # preempted: the next pass re-prefills the KV it lost
        self.redo = np.zeros(n, np.int64)  # tokens at the start of the current pass computed before and lost
        self.unusual: set[int] = (
            set()
        )  # requests with any of the three above set (their next pass is not the workload's)
        self.arrival_s = np.full(n, np.nan)
        self.start_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.preemptions = np.zeros(n, np.int64)
        self.error: dict[int, str] = {}
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.events: list[tuple[int, str, float]] = []
        self.stretches: list[Stretch] = []
        self.planned_ends_s = np.zeros(0)  # end of each pass of the stretch planned last (`_stretch`)
        self.pass_costs: dict[tuple[int, int, int, int], float] = {}  # exact pass shape -> seconds
        self._scalar_exact = getattr(getattr(cost, "par", None), "pp", 1) == 1
        self.n_done = 0
        self.n_arrived = 0  # arrivals so far (the engine pays each one's admission work, `HostCost.admission_s`)
        self.n_pass = 0
        self.first_pass_factor = 1.0  # how much slower the next planned pass runs (the cost's `after_idle`)
        self._wakeup: simpy.Event | None = None
        self.done = [self.env.event() for _ in range(n)] if config.arrival == "closed" else []
        if config.arrival == "closed":
            self.arrival_sorted_s, self._arrival_order = np.zeros(0), np.zeros(0, np.int64)
        else:
            if config.rate is None:  # arrival "trace" (the closed loop is handled above)
                times = workload.arrival_s.astype(float)
            elif math.isinf(config.rate):
                times = np.zeros(n)
            else:  # vllm bench: the first request at once, then exponential gaps
                gaps = np.random.default_rng(config.seed).exponential(1.0 / config.rate, n)
                times = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
            self._arrival_order = np.argsort(times, kind="stable")
            self.arrival_sorted_s = times[self._arrival_order]
        self._next_arrival = 0

    def _page_counts(self, workload: Workload, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(P,) KV blocks held after each pass, (R,) each request's peak blocks."""
        return -(-workload.alloc_kv_tokens // block_size), -(-workload.peak_alloc_tokens() // block_size)

    # ---- scheduling.ServingState (running, waiting: attributes above) -------------------
    @property
    def pool_capacity_blocks(self) -> int:
        return self.pool.capacity_blocks

    def next_tokens_and_blocks(self, rs, limit=None) -> tuple[np.ndarray, np.ndarray]:
        rs = np.asarray(rs, np.int64)
        if self.all_usual(rs):  # whole workload passes: `next_demand`'s first case, two columns of it
            idx = self.off[rs] + self.ptr[rs]
            q = self.w.query_tokens[idx]
            if limit is None or (np.asarray(limit) >= q).all():
                return q, self.blocks[idx]
        d = next_demand(self, rs, limit)
        return d.query, d.blocks

    def peak_blocks_of(self, rs) -> np.ndarray:
        """The trace's own peak pages of each request: the simulator's future knowledge (reserve="peak")."""
        return self.peak_blocks[np.asarray(rs, np.int64)]

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

    # ---- request lifecycle ------------------------------------------------------------
    def arrive(self, r: int, t: float) -> None:
        self.arrival_s[r] = t
        self.n_arrived += 1
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
        peak = int(self.peak_blocks[r])
        if peak > self.pool.capacity_blocks:
            b = self.pool.bytes_per_block
            return (
                f"needs {peak * b} KV bytes ({peak * cfg.block_size} tokens) at its peak, more than the whole "
                f"pool: {self.pool.capacity_blocks * b} bytes on {self.hardware.name} with {self.model.name}"
            )
        q = w.query_tokens[lo:hi]
        if cfg.chunked_prefill:  # prefills are split to fit; other passes are not
            q = q[w.phase[lo:hi] != PREFILL]
        widest = int(q.max()) if len(q) else 0
        if widest > cfg.max_batch_tokens:
            what = "prefill is not chunked" if not cfg.chunked_prefill else "only prefills are chunked"
            return f"a pass of {widest} query tokens exceeds max-batch-tokens {cfg.max_batch_tokens} ({what})"
        return ""

    def admit(self, r: int) -> None:
        self.waiting.remove(r)
        self.running.append(r)
        if math.isnan(self.start_s[r]):
            self.start_s[r] = self.env.now
        self.events.append((r, "admit", float(self.env.now)))

    def preempt(self, r: int) -> None:
        self.running.remove(r)
        self.waiting.appendleft(r)
        live = self.w.live_kv_tokens[self.off[r] + self.ptr[r] - 1] if self.ptr[r] > 0 else 0
        # the KV it loses, all computed again: a pass carrying a re-prefill counts that in its chunks
        # done; a pass of its own (a later prefill in chunks: SoT's expansion) adds them to the KV
        # held before it (was: the larger of the two, the held KV left out of recomputed_tokens)
        done = int(self.chunk_done[r])
        lost = max(live, done) if self.recompute[r] else live + done
        self.recompute[r] = self.ptr[r] > 0
        self.redo[r] = max(self.redo[r], lost)
        self.chunk_done[r] = 0  # a half-done prefill is lost with its pages
        self.preemptions[r] += 1
        self._note_unusual([r])
        self.events.append((r, "preempt", float(self.env.now)))

    def _note_unusual(self, rs: list[int]) -> None:
        for r in rs:
            if self.recompute[r] or self.chunk_done[r] or self.redo[r]:
                self.unusual.add(r)
            else:
                self.unusual.discard(r)

    def all_usual(self, rs: np.ndarray) -> bool:
        """No request of `rs` is mid-prefill, to recompute, or redoing lost tokens (a set lookup, not numpy)."""
        return not self.unusual or self.unusual.isdisjoint(rs.tolist())

    def _finish(self, r: int, t: float) -> None:
        self.finish_s[r] = t
        self.n_done += 1
        if self.done:
            self.done[r].succeed()
        if self._wakeup is not None and not self._wakeup.triggered:  # an idle engine sees the last one end
            self._wakeup.succeed()

    # ---- the engine ------------------------------------------------------------------
    def engine(self):
        env = self.env
        admission_s = getattr(self.cost, "admission_s", 0.0)  # a server's work to take in an arrival
        after_idle = getattr(self.cost, "after_idle", None)  # the first pass after idling runs slower
        taken_in = 0  # arrivals whose admission work is paid (open loop or closed)
        idle_s = 0.0  # how long the engine idled before the pass it plans next
        while self.n_done < self.w.n_requests:
            self.pull_arrivals(upto=env.now)
            if admission_s and self.n_arrived > taken_in:  # at the top of the loop, as the runtime's
                new, taken_in = self.n_arrived - taken_in, self.n_arrived
                yield env.timeout(admission_s * new)
            batch = self.scheduler.schedule(self)
            if not batch:
                if self.running:
                    raise RuntimeError(f"scheduler returned an empty batch with {len(self.running)} running (a bug)")
                self._wakeup = env.event()
                slept = env.now
                yield self._wakeup
                idle_s += env.now - slept
                continue
            # the first pass after idling runs slower: planned so, as the arrival that lands in it ends the stretch
            self.first_pass_factor = after_idle(idle_s) if after_idle is not None and idle_s > 0 else 1.0
            stretch = self.plan(batch)
            self.first_pass_factor, idle_s = 1.0, 0.0
            yield from self.device.run(float(np.add.reduce(stretch.durations_s)), len(stretch.durations_s))
            self.commit(stretch)
            if self.done:  # closed loop: clients of finished requests send their next first
                yield env.timeout(0)

    def _pass_times(self, q, kv, g, lg, n_requests: int, until: float = math.inf) -> np.ndarray:
        """Seconds of each pass of `n_requests` requests from its summed shape: the cost's time plus
        its host work per request, if any (0 for a pass without query rows). Costed one by one, the
        passes after the first to end at or after `until` (simulated time) may be left out."""
        step, per_request = self.cost.step_time_s, getattr(self.cost, "per_request_s", 0.0) * n_requests
        # one by one, each exact shape costed once: the same floats as one array call up to the GEMM
        # tables' 8192 tokens (tests/simulator/test_cost.py); wider passes, and pipeline stages (their
        # micro-batches have fractional rows, timed off the tables), keep the split at 48
        if len(q) < SCALAR_COST_BELOW or (
            len(q) < VECTOR_COST_FROM and self._scalar_exact and max(q) <= GEMM_TABLE_TOKENS
        ):
            return self._scalar_pass_times(zip(*(np.asarray(x).tolist() for x in (q, kv, g, lg))), per_request, until)
        out = np.zeros(len(q))
        on = q > 0
        if on.any():
            out[on] = step(q[on].astype(float), kv[on].astype(float), g[on].astype(float), lg[on].astype(float))
            out[on] += per_request
        return out

    def _scalar_pass_times(self, keys, per_request: float, until: float) -> np.ndarray:
        """`_pass_times` one pass shape at a time, each exact shape costed once (`pass_costs`), up to
        the first pass that ends at or after `until`: `plan` cuts the stretch there (the same sums
        as its cumulative ends, so the same cut)."""
        cache, times, step, now, elapsed = self.pass_costs, [], self.cost.step_time_s, self.env.now, 0.0
        horizon = until < math.inf
        for key in keys:
            t = cache.get(key)
            if t is None:
                t = step(*key) if key[0] > 0 else 0.0
                if len(cache) >= PASS_COST_CACHE:
                    cache.clear()
                cache[key] = t
            t = t + per_request if key[0] > 0 else 0.0
            times.append(t)
            elapsed += t
            if horizon and now + elapsed >= until:
                break
        return np.array(times, float)

    def _scored_kv(self, q: np.ndarray, kv: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """KV tokens each pass's attention scores (`ReplayConfig.attention`): the rows' visible KV
        `kv`, or every row `q` times the pool's slots so far (the high-water mark of its pages, the
        pass's own included: the runtime's mask attention spans every slot ever allocated)."""
        if self.config.attention == "visible":
            return kv
        slots = np.maximum.accumulate(np.maximum(blocks, self.pool.peak_blocks)) * self.config.block_size
        return np.asarray(q, np.int64) * slots

    def _stretch(self, R, idx0, durations, demand=None, ends=None) -> Stretch:
        """The planned Stretch; its passes' ends (now + the durations' running sum, `ends` where the
        caller has them) are kept in `planned_ends_s`, each pass's start the previous one's end."""
        durations = np.asarray(durations, float)
        now = self.env.now
        self.planned_ends_s = now + np.add.accumulate(durations) if ends is None else ends
        starts = np.empty(len(durations))
        starts[:1] = now
        starts[1:] = self.planned_ends_s[:-1]
        return Stretch(R, idx0, starts, durations, self.n_pass, demand)

    def plan(self, batch: dict[int, int]) -> Stretch:
        """The longest stretch of passes the batch runs before the scheduler could decide otherwise."""
        R = np.fromiter(batch, np.int64, len(batch))
        limits = np.fromiter(batch.values(), np.int64, len(batch))
        idx0 = self.off[R] + self.ptr[R]  # each request's next workload pass
        if not self._whole_passes(R, limits, idx0):  # a chunk, a recompute or a request sitting out: one pass
            d = next_demand(self, R, limits)
            blocks = np.array([d.blocks.sum()])
            q = np.array([d.query.sum()])
            kv = self._scored_kv(q, np.array([d.kv_read.sum()]), blocks)
            self.pool.note(blocks)
            return self._stretch(
                R, d.flat, self._woken(self._pass_times(q, kv, [d.groups.sum()], [d.logits.sum()], len(R))), d
            )
        m, q, blocks, idx = self._stretch_length(R, idx0)
        idx = idx[:, :m]
        t_next = self.next_arrival_s()
        if math.isfinite(t_next) and m > 1:  # passes that start before the next arrival, plus the one it lands in
            probe = min(m, SCALAR_COST_BELOW)
            while True:
                dur = self._woken(self._cost_passes(len(R), q, blocks, idx, probe, until=t_next))
                ends = self.env.now + np.add.accumulate(dur)
                hit = (ends >= t_next).nonzero()[0]
                if len(hit) or probe == m:
                    m = int(hit[0]) + 1 if len(hit) else m
                    break
                probe = min(m, probe * 4)
            durations, ends = dur[:m], ends[:m]
        else:
            durations, ends = self._woken(self._cost_passes(len(R), q, blocks, idx, m)), None
        self.pool.note(blocks[:m])
        return self._stretch(R, idx[:, 0].copy(), durations, ends=ends)  # a copy: a view would keep all of idx alive

    def _woken(self, durations: np.ndarray) -> np.ndarray:
        """`durations` (a fresh array) with its first pass `first_pass_factor` times as long: the
        engine idled before it. Applied before the stretch is cut at the next arrival (the slower
        pass may be the one it lands in), not after (was: an arrival landing in the slowed pass
        waited for the pass after it, one pass later than a pass-by-pass loop lets it in)."""
        if self.first_pass_factor != 1.0 and len(durations):
            durations[0] *= self.first_pass_factor
        return durations

    def _cost_passes(self, n_requests: int, q, blocks, idx: np.ndarray, n: int, until: float = math.inf) -> np.ndarray:
        """`_pass_times` of the first n passes of the (requests, passes) workload indices `idx`
        (`q`, `blocks`: their sums per pass)."""
        w, cols, q = self.w, idx[:, :n], q[:n]
        kv = self._scored_kv(q, w.kv_tokens_read[cols].sum(0), blocks[:n])
        return self._pass_times(q, kv, w.query_groups[cols].sum(0), w.logit_tokens[cols].sum(0), n_requests, until)

    def _whole_passes(self, R: np.ndarray, limits: np.ndarray, idx0: np.ndarray) -> bool:
        """Every running request runs its whole next workload pass (no chunk, recompute or request
        sitting out): `next_demand`'s test, without building the demand when it holds."""
        if len(R) < len(self.running) or not self.all_usual(R):
            return False
        if (limits >= self.w.query_tokens[idx0]).all():
            return True
        return bool(next_demand(self, R, limits).final.all())

    def _stretch_length(self, R: np.ndarray, idx0: np.ndarray):
        """Passes the whole batch R runs unchanged: stop before a pass that overflows the pool, that the
        token budget would chunk, or after which the waiting head would be admitted."""
        cap, cfg, w = self.pool_capacity_blocks, self.config, self.w
        m = int(min(self.remaining_passes(R).min(), 1 if self.one_pass_at_a_time else MAX_STRETCH_PASSES))
        idx = idx0[:, None] + np.arange(m)[None, :]  # (R, m)
        blocks = self.blocks[idx].sum(0)
        q = w.query_tokens[idx].sum(0)
        if m == 1:  # nothing to stop before
            return m, q, blocks, idx
        stop = blocks > cap  # the scheduler preempts there
        wide = q > cfg.max_batch_tokens
        if cfg.chunked_prefill and wide.any():  # the scheduler would cut a prefill of that pass to the budget
            stop |= wide & (w.phase[idx] == PREFILL).any(0)
        over = stop[1:].nonzero()[0]
        if len(over):
            m = int(over[0]) + 1
        head = self.scheduler.head(self) if len(R) < cfg.max_seqs and m > 1 else None
        if head is not None:
            m = self._head_waits(head, R, q, blocks, m)
        return m, q, blocks, idx

    def _head_waits(self, head: int, R: np.ndarray, q: np.ndarray, blocks: np.ndarray, m: int) -> int:
        """Passes before the waiting head would be admitted (at most m)."""
        cap, cfg = self.pool_capacity_blocks, self.config
        heads = np.full(m - 1, head)
        limit = cfg.max_batch_tokens - q[1:m] if cfg.chunked_prefill else None
        hq, hb = self.next_tokens_and_blocks(heads, limit)
        if cfg.reserve == "peak":
            room = np.full(m - 1, self.peak_blocks[R].sum() + self.peak_blocks[head] <= cap)
        else:
            room = blocks[1:m] + hb <= cap
        fits = ((hq > 0) & (q[1:m] + hq <= cfg.max_batch_tokens) & room).nonzero()[0]
        return int(fits[0]) + 1 if len(fits) else m

    def commit(self, s: Stretch) -> None:
        m, R = len(s.durations_s), s.requests
        self.stretches.append(s)
        self.n_pass += m
        if s.demand is not None:  # one pass: a chunk advances its request's progress, not its pass pointer
            fin = s.demand.final
            self.ptr[R[fin]] += 1
            self.recompute[R[fin]] = False
            self.chunk_done[R[fin]] = 0
            self.redo[R[fin]] = 0
            self.chunk_done[R[~fin]] += s.demand.query[~fin]
            self._note_unusual(R.tolist())
        else:
            self.ptr[R] += m
        now = self.env.now
        finished = R[self.ptr[R] >= self.npass[R]]
        for r in finished.tolist():
            self.running.remove(r)
            self.events.append((r, "finish", float(now)))
            self._finish(r, now)

    def run(self) -> Replay:
        start_arrivals(self.env, self)
        run_env(self.env, self.env.process(self.engine()))
        return self


@contextmanager
def fewer_collections():
    """Run the cyclic garbage collector less often (`GC_THRESHOLD`) inside the block; restored after."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], GC_THRESHOLD), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def run_env(env: simpy.Environment, until) -> None:
    """`env.run(until)`, with the collector run less often (a simulation allocates small objects by the million)."""
    with fewer_collections():
        env.run(until=until)


def start_arrivals(env: simpy.Environment, sim) -> None:
    """Start `sim`'s arrival stream: C closed-loop clients, or the open loop of precomputed times.
    `sim` is a Replay or anything with its arrival members (simulator.cluster's replicas)."""
    if sim.config.arrival == "closed":
        queue = deque(range(sim.w.n_requests))
        for _ in range(min(sim.config.concurrency, sim.w.n_requests)):
            env.process(closed_loop_client(env, sim, queue))
    else:
        env.process(arrivals(env, sim))


def replay(workload: Workload, hardware: HardwareSpec, model: ModelSpec, config: ReplayConfig | None = None, cost=None):
    """Replay `workload` on `hardware` with `model`; return a `simulator.simtrace.ReplayResult`.

    `cost` is anything with `step_time_s(query_tokens, kv_tokens_read, query_groups, logit_tokens)`
    taking scalars and numpy arrays; default `CostModel(hardware, model)`.
    """
    from simulator.cost import CostModel
    from simulator.simtrace import collect

    config = config or ReplayConfig()
    workload = resize(workload, config)
    cost = cost if cost is not None else CostModel(hardware, model)
    return check_runnable(collect(Replay(workload, cost, model, hardware, config).run()), hardware)


def check_runnable(result, hardware: HardwareSpec):
    """`result`, or a UsageError when every request failed (a setting nothing can run under)."""
    if result.metrics["completed"] == 0 and result.metrics["failed"] > 0:
        first = result.requests.loc[result.requests["status"] == "error", "error"].iloc[0]
        raise UsageError(f"no request can run on {hardware.name} with these settings: {first}")
    return result


def resize(workload: Workload, config: ReplayConfig) -> Workload:
    """`config.num_requests` requests, cycling through the workload's (trace arrivals: one period later each time)."""
    if config.num_requests is not None and config.num_requests != workload.n_requests:
        n, r = config.num_requests, workload.n_requests
        workload = workload.cycle(np.arange(n) % r)  # the passes shared, not copied
        if config.arrival == "trace" and n > r:  # the trace's arrival pattern, repeated one period later each time
            last = float(workload.arrival_s[:r].max())
            period = last + (last / (r - 1) if r > 1 else 0.0)
            workload = dataclasses.replace(workload, arrival_s=workload.arrival_s + (np.arange(n) // r) * period)
    return workload
