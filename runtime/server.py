"""Batched serving: many requests of one engine, one forward pass per iteration, one shared KV pool.

What: continuous batching (Orca, OSDI '22; vLLM) for every system. Each request is its engine's
`RequestState` (`inputs()` -> its query rows, `after(logits)` -> its `Step`); at every pass
boundary the shared scheduler (`scheduling`, the same object the simulator's replay drives) picks
the batch through the `ServingState` protocol this class implements, and the rows of every request
in it (PASTA threads of many requests, Planned Diffusion spans, TIP steps) go through ONE forward
pass over one `PagedKVStore` of a fixed byte budget. A row sees only its own request's slots.

Attention (`attention=`): `"mask"` runs one attention over the whole pool with a visibility mask
(work grows with the pool); `"gather"` gathers each request's own slots and attends to those only
(work follows what each request can see: freed pages reduce it). `bench/runtime.py` measures both;
every pass records the keys its attention actually scored (`attention_kv_tokens`).

Preemption (vLLM's RECOMPUTE): the victim's pages are freed; when readmitted, its next pass first
re-prefills every token it held (`RequestState.readmit`), recorded as a recompute, not as new
demand. A request whose pass can never fit the whole pool gets an error row; the others finish.

    server = Server(engine, kv_budget_mib=2.0, scheduler=get_scheduler("fcfs")(max_seqs=8, max_batch_tokens=512))
    result = server.serve([(0.0, "prompt a"), (0.1, "prompt b")])   # (arrival_s, prompt) pairs
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from profiler.errors import UsageError
from profiler.schema import empty_graph
from runtime.engines.base import Completion, Engine, PassInputs, Request, RequestState, Step, pool_visibility
from runtime.kv import PagedKVStore, RequestKV
from runtime.model import Group

ATTENTION_MODES = ("mask", "gather")
MIB = 1 << 20


class WallClock:
    """Seconds since the server started (`time.perf_counter`)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def wait_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now()))

    def passed(self, rows: int) -> None:
        """A forward pass of `rows` query rows just ran (the wall clock moved by itself)."""


class FakeClock:
    """A clock that moves only when told: `pass_s` (+ `row_s` per query row) per forward pass.
    Tests time the runtime's passes with it, so a scripted arrival list gives the same batches as
    the simulator's replay under the same per-pass cost."""

    def __init__(self, pass_s: float = 0.01, row_s: float = 0.0) -> None:
        self.t, self.pass_s, self.row_s = 0.0, pass_s, row_s

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def passed(self, rows: int) -> None:
        self.t += self.pass_s + self.row_s * rows


@dataclass
class Entry:
    """One request's part of one pass."""

    request_id: int
    query_tokens: int  # rows of its own pass (replay and chunk rows excluded)
    kv_read: int
    recompute_tokens: int = 0  # re-prefill rows (a readmission's replay) in this pass
    chunk: bool = False  # a chunk of a prefill or re-prefill: computed, nothing sampled
    step: Step | None = None
    attention_kv_tokens: int = 0  # keys the attention scored for its rows
    host_s: float = 0.0  # building its rows; its `after` is added to the step's `host_s`


@dataclass
class PassRecord:
    index: int
    start_s: float
    end_s: float
    rows: int
    attention_kv_tokens: int  # keys the attention scored, summed over query rows (what actually ran)
    entries: list[Entry]
    preempted: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    forward_s: float = float("nan")  # the forward alone (on the server's clock): the rest of the pass is host work


@dataclass
class Tracked:
    """A request the server knows: its state and its times on the server's clock."""

    request: Request
    arrival_s: float
    state: RequestState | None
    start_s: float = math.nan  # first scheduled
    first_token_s: float = math.nan
    end_s: float = math.nan
    preemptions: int = 0
    completion: Completion | None = None

    @property
    def live(self) -> RequestState:
        """The state of a request the engine took (one refused at submission has none)."""
        assert self.state is not None, f"request {self.request.request_id} has no state"
        return self.state


def device_memory_bytes(model) -> int:
    """Total memory of the device `model`'s weights live on: the GPU's, or the host's RAM."""
    param = next(model.parameters(), None)
    if param is not None and param.device.type == "cuda":
        return int(torch.cuda.get_device_properties(param.device).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Server:
    """Continuous batching of one engine's requests over one KV pool of `kv_budget_mib` (or
    `max_pages`). Implements `scheduling.ServingState`; `scheduler` is a `scheduling.Scheduler`."""

    def __init__(
        self,
        engine: Engine,
        kv_budget_mib: float | None = None,
        *,
        max_pages: int | None = None,
        scheduler=None,
        clock=None,
        attention: str = "mask",
        on_pass: Callable[[PassRecord], None] | None = None,
    ) -> None:
        if attention not in ATTENTION_MODES:
            raise UsageError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got {attention!r}")
        if attention == "gather" and not getattr(engine.model, "supports_groups", False):
            raise UsageError("attention='gather' needs a model with per-request gathers (TinyLM)")
        P = engine.config.page_size
        page_bytes = engine.model.kv_bytes_per_token * P
        memory = device_memory_bytes(engine.model)
        if max_pages is None:
            if kv_budget_mib is None or not kv_budget_mib > 0:
                raise UsageError(f"kv_budget_mib must be > 0, got {kv_budget_mib}")
            budget = kv_budget_mib * MIB
            if budget > memory:  # 1e308 MiB is inf bytes: was ValueError from int(inf // page_bytes)
                raise UsageError(
                    f"a KV budget of {kv_budget_mib:g} MiB does not fit in the {memory / MIB:.0f} MiB "
                    "of memory of the model's device (lower the KV budget)"
                )
            max_pages = int(budget // page_bytes)
            if max_pages < 1:
                raise UsageError(
                    f"a KV budget of {kv_budget_mib} MiB is smaller than one page "
                    f"({page_bytes} bytes: {P} tokens of {engine.model.kv_bytes_per_token} bytes)"
                )
        if max_pages < 1:
            raise UsageError(f"max_pages must be >= 1, got {max_pages}")
        if max_pages * page_bytes > memory:  # was: torch's allocation error, a traceback
            raise UsageError(
                f"a KV pool of {max_pages * page_bytes / MIB:.0f} MiB does not fit in the "
                f"{memory / MIB:.0f} MiB of memory of the model's device (lower the KV budget)"
            )
        self.engine, self.scheduler, self.attention = engine, scheduler, attention
        if scheduler is None:
            from scheduling import get_scheduler

            self.scheduler = get_scheduler("fcfs")(max_seqs=256, max_batch_tokens=8192)
        self.store = engine.model.new_kv_store(page_size=P, max_pages=max_pages)
        self.pool_blocks = int(max_pages)
        self.clock = clock or WallClock()
        self.on_pass = on_pass
        self.tracked: dict[int, Tracked] = {}
        self.running: list[int] = []
        self.waiting: list[int] = []
        self.preempted_ids: dict[
            int, list
        ] = {}  # waiting after a preemption -> store owner of each token it re-prefills
        self.passes = 0
        self.preemptions = self.recomputes = self.recompute_tokens = 0
        self._admitted: list[int] = []
        self._preempted: list[int] = []
        self.finished: list[int] = []  # request ids in the order they finished (or failed)

    # ------------------------------------------------------------------ ServingState protocol
    @property
    def pool_capacity_blocks(self) -> int:
        return self.pool_blocks

    def _state(self, rid: int) -> RequestState:
        return self.tracked[rid].live

    def _next(self, rid: int, limit: int | None) -> tuple[int, int]:
        st = self._state(rid)
        owed = self.preempted_ids.get(rid)  # a preempted request: the replay its readmission owes
        replay = len(owed) if owed is not None else st.replay_rows()
        full = replay + st.next_rows()
        chunkable = replay if replay else st.prompt_left()
        if limit is not None and limit < full and chunkable:
            k = min(int(limit), chunkable)
            if owed is not None:  # a readmission takes every replay page at once
                return k, st.kv.pages_for_owners(owed)
            return k, st.kv.pages_held + (0 if replay else st.kv.pages_for(k, st.prompt_owner))
        new = st.next_new_slots()
        if owed is not None:
            owners = list(owed)
            for o, n in new.items():
                owners += [o] * n
            return full, st.kv.pages_for_owners(owners)
        return full, st.kv.pages_held + sum(st.kv.pages_for(n, o) for o, n in new.items())

    def next_tokens_and_blocks(
        self, ids: Sequence[int], limit: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        out = [self._next(r, None if limit is None else limit[i]) for i, r in enumerate(ids)]
        return (
            np.array([o[0] for o in out], dtype=np.int64).reshape(-1),
            np.array([o[1] for o in out], dtype=np.int64).reshape(-1),
        )

    def peak_blocks_of(self, ids: Sequence[int]) -> np.ndarray:
        P = self.store.page_size
        return np.array([math.ceil(self._state(r).max_kv_tokens() / P) for r in ids], dtype=np.int64)

    def admit(self, rid: int) -> None:
        self.waiting.remove(rid)
        self.running.append(rid)
        t = self.tracked[rid]
        if math.isnan(t.start_s):
            t.start_s = self.clock.now()
        if rid in self.preempted_ids:
            del self.preempted_ids[rid]
            self.recompute_tokens += t.live.readmit()
            self.recomputes += 1
        self._admitted.append(rid)

    def preempt(self, rid: int) -> None:
        self.running.remove(rid)
        self.waiting.insert(0, rid)
        st = self._state(rid)
        st.release()
        st.preempted()
        if st.passes_done:  # what it computed is gone: readmission re-prefills it
            self.preempted_ids[rid] = st.replay_owners()
        self.tracked[rid].preemptions += 1
        self.preemptions += 1
        self._preempted.append(rid)

    def arrival_of(self, ids: Sequence[int]) -> np.ndarray:
        return np.array([self.tracked[r].arrival_s for r in ids], dtype=np.float64)

    def prompt_tokens_of(self, ids: Sequence[int]) -> np.ndarray:
        return np.array([self._state(r).prompt_tokens() for r in ids], dtype=np.int64)

    def max_tokens_of(self, ids: Sequence[int]) -> np.ndarray:
        return np.full(len(ids), self.engine.config.max_tokens, dtype=np.int64)

    def remaining_passes(self, ids: Sequence[int]) -> np.ndarray:
        raise NotImplementedError(
            "a real server cannot know how many passes a request has left (oracle scheduling is a simulator what-if)"
        )

    # ------------------------------------------------------------------ requests
    def submit(self, request: Request, arrival_s: float) -> None:
        """A request arrives: it waits, or gets an error row at once if it can never fit the pool."""
        st = None
        try:
            st = self.engine.start(request, RequestKV(self.store, request.request_id))
        except ValueError as e:  # a prompt the model cannot take
            self.tracked[request.request_id] = Tracked(request, arrival_s, None)
            return self._fail(request.request_id, str(e))
        self.tracked[request.request_id] = Tracked(request, arrival_s, st)
        (_,), (blocks,) = self.next_tokens_and_blocks([request.request_id])
        if blocks > self.pool_capacity_blocks:
            return self._fail(
                request.request_id,
                f"its first pass needs {blocks} KV pages, the whole pool holds {self.pool_capacity_blocks}",
            )
        self.waiting.append(request.request_id)

    def _fail(self, rid: int, why: str) -> None:
        t = self.tracked[rid]
        n = t.state.prompt_tokens() if t.state else 0
        if t.state:
            t.state.release()
        t.end_s = self.clock.now()
        t.completion = Completion(
            request_id=rid,
            prompt_tokens=n,
            output_ids=[],
            text="",
            tokens=[],
            graph=empty_graph(),  # node-link with no chunks: the trace stays valid
            critical_path_tokens=0,
            steps=0,
            peak_live_kv_tokens=0,
            peak_kv_bytes=0,
            status="error",
            stop_reason="kv_pool",
            error=f"request {rid}: {why}",
        )
        self.finished.append(rid)

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ one iteration
    def step(self) -> PassRecord | None:
        """Schedule and run one forward pass; None when nothing could run."""
        self._admitted, self._preempted = [], []
        batch = self.scheduler.schedule(self)
        if isinstance(batch, list):  # a scheduler that returns the running list: whole passes
            batch = {r: self._next(r, None)[0] for r in batch}
        if not batch:
            self._unblock()
            return None
        start = self.clock.now()
        entries, inputs = self._pass_inputs(batch)
        forward_start = self.clock.now()
        logits, attn, scored = self.forward(inputs)
        for e, k in zip(entries, scored):
            e.attention_kv_tokens = k
        if logits.device.type == "cuda":
            torch.cuda.synchronize()  # the pass ends when the device is done, not when it was queued
        self.clock.passed(sum(inp.rows for inp in inputs))
        end = self.clock.now()
        forward_s = end - forward_start
        rows = self._after_pass(entries, inputs, logits, attn, end, forward_s)
        rec = PassRecord(
            self.passes,
            start,
            end,
            rows,
            sum(scored),
            entries,
            self._preempted,
            self._admitted,
            forward_s,
        )
        self.passes += 1
        if self.on_pass:
            self.on_pass(rec)
        return rec

    def _pass_inputs(self, batch: dict[int, int]) -> tuple[list[Entry], list[PassInputs]]:
        """Each scheduled request's rows for this pass (a chunk of `q` rows when `q` is short of its
        whole next pass) and its entry in the pass record."""
        entries, inputs = [], []
        for rid, q in batch.items():
            st = self._state(rid)
            replay = st.replay_rows()
            full = replay + st.next_rows()
            chunk = q < full
            t0 = time.perf_counter()
            inp = st.chunk_inputs(q) if chunk else st.inputs()
            built = time.perf_counter() - t0
            inputs.append(inp)
            entries.append(
                Entry(
                    rid,
                    0 if chunk else inp.rows - inp.skip,
                    0 if chunk else inp.kv_read,
                    recompute_tokens=min(q, replay) if replay else 0,
                    chunk=chunk,
                    host_s=built,
                )
            )
        return entries, inputs

    def _after_pass(
        self,
        entries: list[Entry],
        inputs: list[PassInputs],
        logits: torch.Tensor,
        attn: torch.Tensor | None,
        end: float,
        forward_s: float,
    ) -> int:
        """Hand each non-chunk request its logits rows (its `Step`, first-token and finish times);
        returns the pass's rows."""
        r = 0
        for e, inp in zip(entries, inputs):
            t = self.tracked[e.request_id]
            if e.chunk and not e.recompute_tokens:  # a prompt chunk (a replay's rows were scored before)
                t.live.after_chunk(attn)
            if not e.chunk:
                t0 = time.perf_counter()
                e.step = t.live.after(logits[r : r + inp.rows], attn)
                e.step.host_s = e.host_s + time.perf_counter() - t0
                e.step.forward_s = forward_s
                t.live.passes_done += 1
                if e.step.emitted and math.isnan(t.first_token_s):
                    t.first_token_s = end
                if t.live.done:
                    self._finish(e.request_id, end)
            r += inp.rows
        return r

    def _unblock(self) -> None:
        """Nothing runs and the head of the queue does not fit the empty pool: it never will."""
        if self.running or not self.waiting or self.store.pages_held:
            return
        head = self.scheduler.head(self) if hasattr(self.scheduler, "head") else self.waiting[0]
        (_,), (blocks,) = self.next_tokens_and_blocks([head])
        self.waiting.remove(head)
        self.preempted_ids.pop(head, None)
        self._fail(head, f"its next pass needs {blocks} KV pages, the whole pool holds {self.pool_capacity_blocks}")

    def _finish(self, rid: int, end: float) -> None:
        t = self.tracked[rid]
        t.live.release()
        t.end_s = end
        t.completion = t.live.completion()
        self.running.remove(rid)
        self.finished.append(rid)

    # ------------------------------------------------------------------ the forward pass
    def forward(self, inputs: list[PassInputs]) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
        return forward_batch(self.engine.model, self.store, inputs, self.attention)

    # ------------------------------------------------------------------ a whole load
    def serve(
        self,
        arrivals: Sequence[tuple[float, str]],
        next_arrival: Callable[[int, float], tuple[float, str] | None] | None = None,
    ) -> dict:
        """Serve `arrivals` ((arrival_s, prompt), request ids in order); `next_arrival(rid, t)`, if
        given, is called when request `rid` finishes at `t` and may return one more arrival (a closed
        loop of clients). Returns the completions, each request's times and every pass."""
        pending = sorted(((a, i, p) for i, (a, p) in enumerate(arrivals)), key=lambda x: (x[0], x[1]))
        next_id, passes, seen = len(arrivals), [], 0
        while True:
            now = self.clock.now()
            while pending and pending[0][0] <= now:
                a, rid, prompt = pending.pop(0)
                self.submit(Request(rid, prompt), a)
            if self.busy:
                rec = self.step()
                if rec is not None:
                    passes.append(rec)
            elif pending:
                self.clock.wait_until(pending[0][0])
            if next_arrival is not None and seen < len(self.finished):
                for rid in self.finished[seen:]:
                    more = next_arrival(rid, self.tracked[rid].end_s)
                    if more is not None:
                        pending.append((more[0], next_id, more[1]))
                        next_id += 1
                seen = len(self.finished)
                pending.sort(key=lambda x: (x[0], x[1]))
            if not pending and not self.busy:
                break
        return {
            "requests": [self.tracked[r] for r in sorted(self.tracked)],
            "passes": passes,
            "preemptions": self.preemptions,
            "recomputes": self.recomputes,
            "recompute_tokens": self.recompute_tokens,
            "pool_pages": self.pool_capacity_blocks,
            "pool_bytes": self.pool_capacity_blocks * self.store.page_bytes,
        }


def forward_batch(
    model, store: PagedKVStore, inputs: list[PassInputs], attention: str = "mask"
) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """One pass over every request's rows: logits (R, V), per-slot attention or None, and per
    request the keys the attention scored (mask: its rows times the whole pool; gather: its rows
    times its own slots)."""
    dev = model.embed.weight.device
    ids = np.array(
        [
            [i for inp in inputs for i in inp.ids],
            [p for inp in inputs for p in inp.positions],
            [s for inp in inputs for s in inp.slots],
        ],
        dtype=np.int64,
    )
    t = torch.from_numpy(ids).to(dev)
    want = any(inp.attention for inp in inputs)
    kw = {}
    if want and any(inp.replayed for inp in inputs):  # a replay's rows were scored when they first ran
        rows = np.concatenate([np.arange(inp.rows) >= inp.replayed for inp in inputs])
        kw["attention_rows"] = torch.from_numpy(rows).to(dev)
    if attention == "mask":
        vis = pool_visibility(inputs, store.num_slots, dev)
        out = model(t[0], t[1], t[2], vis, store, return_attention=want, **kw)
        scored = [inp.rows * store.num_slots for inp in inputs]
    else:
        groups, r, scored = [], 0, []
        for inp in inputs:
            groups.append(
                Group(
                    r,
                    r + inp.rows,
                    torch.from_numpy(inp.cols).to(dev),
                    torch.from_numpy(inp.vis).to(dev)[None, None],
                    inp.attention,
                )
            )
            r += inp.rows
            scored.append(inp.rows * len(inp.cols))
        out = model(t[0], t[1], t[2], None, store, return_attention=want, groups=groups, **kw)
    logits, attn = out if want else (out, None)
    return logits, attn, scored


def serve(engine: Engine, prompts: list[str], pool_bytes: int, scheduler=None, attention: str = "mask") -> dict:
    """Serve `prompts` (all arriving at once) over a pool of `pool_bytes` (whole pages): concurrency
    and throughput figures, completions in `completions` (request order). `bench/tip.py`'s serving
    figure and the TIP tests use it."""
    page_bytes = engine.model.kv_bytes_per_token * engine.config.page_size
    server = Server(engine, max_pages=max(1, pool_bytes // page_bytes), scheduler=scheduler, attention=attention)
    t0 = time.perf_counter()
    out = server.serve([(0.0, p) for p in prompts])
    wall = time.perf_counter() - t0
    done = [t.completion for t in out["requests"]]
    out_tokens = sum(len(c.output_ids) for c in done)
    sizes = [sum(not e.chunk for e in p.entries) for p in out["passes"]]
    return {
        "requests": sum(c.status != "error" for c in done),
        "pool_bytes": int(out["pool_bytes"]),
        "pool_pages": out["pool_pages"],
        "wall_s": wall,
        "output_tokens": out_tokens,
        "tokens_per_s": out_tokens / wall if wall > 0 else float("nan"),
        "mean_concurrency": sum(sizes) / max(1, len(sizes)),
        "max_concurrency": max(sizes, default=0),
        "passes": len(sizes),
        "preemptions": out["preemptions"],
        "recomputes": out["recomputes"],
        "completions": done,
    }
