"""`pasta`: the PASTA-LANG interpreter (arXiv 2502.11517) on the one forward primitive.

The model writes promises in its main thread; each well-formed promise forks an async thread that
is conditioned on the prompt and the main thread up to and including the promise. **Every live
thread advances in the same forward pass** (one query row per stream, more when a stream feeds a
forced tag with its token) over one shared `PagedKVStore`; nothing is copied. Visibility:

    main     prompt + its own tokens (+ every chunk merged by a fed `<sync/>`, from then on)
    thread   prompt + main up to and including its promise + its own tokens (never a sibling)

Positions (PASTA's position offset): a promise closing at position p reserves N ids; the thread
writes `<async>` at p+1 and its content after it; the main thread goes on at p+1+N. A chunk that
overruns its reservation continues (recorded) up to `max_chunk_tokens`, then is cut (recorded).

`Layout` is that bookkeeping without a model (streams, positions, what each fed token sees); the
engine drives it with sampled tokens and training replays it over annotated answers
(`runtime.train.pasta`), so both see exactly the same positions and visibility.

Knobs (constructor kwargs, `solm capture --knob k=v`): `max_threads` (live threads; a promise over
the limit is decoded inline), `max_chunk_tokens`, `max_total_tokens` (global guard over all
streams, tags included; 0 = 2 x max_tokens; `GenerationConfig.max_tokens` bounds content tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from profiler.errors import is_count
from runtime.engines.base import (
    Completion,
    Engine,
    GenerationConfig,
    PassInputs,
    Request,
    RequestState,
    Step,
    TokenRecord,
)
from runtime.kv import RequestKV
from runtime.lang.pasta import ASYNC, ASYNC_END, SYNC, End, Finish, Fork, Inline, PastaParser, StreamSyntax, Sync
from runtime.model import TinyLM
from runtime.sampling import Sampler
from runtime.tokenizer import Tokenizer

MAIN = 0


class Indices:
    """A growing list of fed indices backed by a numpy buffer: `view()` is an O(1) snapshot of the
    current contents (appends never change it), so every fed token keeps what it saw without a copy."""

    __slots__ = ("buf", "n")

    def __init__(self, items=()) -> None:
        items = np.asarray(items, dtype=np.int64)
        self.buf = np.empty(max(16, 2 * len(items)), dtype=np.int64)
        self.buf[: len(items)] = items
        self.n = len(items)

    def _room(self, k: int) -> None:
        if self.n + k > len(self.buf):
            buf = np.empty(max(2 * len(self.buf), self.n + k), dtype=np.int64)
            buf[: self.n] = self.buf[: self.n]
            self.buf = buf

    def append(self, i: int) -> None:
        self._room(1)
        self.buf[self.n] = i
        self.n += 1

    def extend(self, items) -> None:
        self._room(len(items))
        self.buf[self.n : self.n + len(items)] = items
        self.n += len(items)

    def view(self) -> np.ndarray:
        return self.buf[: self.n]

    def copy(self) -> Indices:
        return Indices(self.view())

    def __len__(self) -> int:
        return self.n


@dataclass
class Fed:
    """One token written to the KV store: its stream, position id and the fed tokens it sees."""

    token_id: int
    stream: int  # -1: the prompt
    position: int
    sees: np.ndarray  # fed indices, itself included (int64; a snapshot later appends never change)


@dataclass
class Out:
    """One output token; the final text order is assembled from these."""

    token_id: int
    stream: int
    kind: str  # "tag" or "content"
    position: int
    visible_streams: tuple[int, ...]
    step: int = -1
    fed: int = -1  # fed index; -1 if never fed (`</async>`, `<eos>`)
    forced: bool = False  # put there by the interpreter, not sampled
    thread: int = -1  # a promise close that forked: the thread it forked
    is_sync: bool = False
    merged: tuple[int, ...] = ()  # a fed `<sync/>`: the threads it merged


@dataclass
class StreamState:
    sid: int
    syntax: StreamSyntax
    visible: Indices = field(default_factory=Indices)  # fed indices the stream's next row sees
    vis_streams: set[int] = field(default_factory=set)
    pos: int = 0  # next position id
    reserve_end: int = 1 << 30  # threads: first position of the main thread after the reservation
    pending: list[Out] = field(default_factory=list)  # fed at the next step
    fork: tuple[int, int] | None = None  # (thread, N): reserve once the pending promise close is fed
    waiting: bool = False  # a pending `<sync/>` is fed only when no thread is live
    done: bool = False
    started: bool = True
    last_row: int = -1  # fed index whose logits give the stream's next token
    own: list[int] = field(default_factory=list)  # fed indices of this stream's tokens
    outs: list[Out] = field(default_factory=list)
    overran: bool = False


class Layout:
    """Streams, positions and visibility of one PASTA-LANG answer, driven token by token."""

    def __init__(
        self,
        prompt_ids: list[int],
        tok: Tokenizer,
        max_threads: int = 8,
        max_chunk_tokens: int = 64,
        defer_threads: bool = False,
    ) -> None:
        self.tok, self.parser = tok, PastaParser(tok)
        self.defer_threads = defer_threads  # skeleton baseline: threads wait for release_threads()
        self.async_id, self.end_id, self.sync_id = tok.token_id(ASYNC), tok.token_id(ASYNC_END), tok.token_id(SYNC)
        self.max_threads, self.max_chunk_tokens = max_threads, max_chunk_tokens
        n = len(prompt_ids)
        seen = np.arange(n, dtype=np.int64)
        self.fed = [Fed(t, -1, i, seen[: i + 1]) for i, t in enumerate(prompt_ids)]
        main = StreamState(MAIN, self.parser.new_stream("main"), Indices(seen), {-1, MAIN}, pos=n, last_row=n - 1)
        self.streams: dict[int, StreamState] = {MAIN: main}
        self.live: set[int] = set()  # threads forked and not done
        self.unmerged: list[int] = []  # threads forked since the last fed `<sync/>`
        self.events: list[dict] = []
        # the action's handler: (stream, its output, the action) -> None
        self._handlers: dict[type, Callable[[StreamState, Out, Any], None]] = {
            Fork: self._fork,
            Inline: self._inline,
            Finish: self._finish,
            Sync: self._sync,
            End: self._end,
        }

    def live_threads(self) -> int:
        return len(self.live)

    def _close(self, s: StreamState) -> None:
        s.done, s.pending = True, []
        self.live.discard(s.sid)

    @property
    def finished(self) -> bool:
        return all(s.done for s in self.streams.values())

    def event(self, kind: str, stream: int, **detail) -> None:
        self.events.append(
            {"event": kind, "stream": stream, "stream_token": len(self.streams[stream].outs) - 1, **detail}
        )

    # ------------------------------------------------------------------ sampled tokens
    def advance(self, sid: int, token: int, step: int = -1) -> Out:
        """A token sampled for stream `sid`: parse it and schedule what is fed next."""
        s = self.streams[sid]
        p = self.parser.feed(s.syntax, token, can_fork=self.live_threads() < self.max_threads)
        out = Out(token, sid, p.kind, s.pos, tuple(sorted(s.vis_streams)), step)
        s.outs.append(out)
        s.pending = [out]
        if p.event:
            self.event(p.event, sid)
        handler = self._handlers.get(type(p.action))
        if handler:
            handler(s, out, p.action)
        if sid != MAIN and not s.done:
            self._guard_chunk(s, step)
        return out

    def _fork(self, s: StreamState, out: Out, a: Fork) -> None:
        tid = max(self.streams) + 1
        out.thread, s.fork = tid, (tid, a.tokens)
        t = StreamState(tid, self.parser.new_stream("thread"), started=False)
        t.pending = [Out(self.async_id, tid, "tag", -1, (), out.step, forced=True)]
        t.outs = list(t.pending)
        self.streams[tid] = t
        self.live.add(tid)
        self.unmerged.append(tid)

    def _inline(self, s: StreamState, out: Out, a: Inline) -> None:
        forced = Out(self.async_id, s.sid, "tag", -1, out.visible_streams, out.step, forced=True)
        s.outs.append(forced)
        s.pending.append(forced)
        self.parser.begin_inline(s.syntax)

    def _finish(self, s: StreamState, out: Out, a: Finish) -> None:
        self._close(s)

    def _sync(self, s: StreamState, out: Out, a: Sync) -> None:
        out.is_sync, s.waiting = True, True
        if not self.unmerged:
            self.event("sync_with_nothing_open", s.sid)

    def _end(self, s: StreamState, out: Out, a: End) -> None:
        self._close(s)
        if self.live_threads():
            self.event("end_before_sync", s.sid)

    def _guard_chunk(self, s: StreamState, step: int) -> None:
        if s.pos >= s.reserve_end and not s.overran:
            s.overran = True
            self.event("chunk_overrun", s.sid, reserved_end=s.reserve_end)
        if len(s.outs) >= self.max_chunk_tokens:
            self.event("chunk_cut", s.sid, max_chunk_tokens=self.max_chunk_tokens)
            s.outs.append(Out(self.end_id, s.sid, "tag", s.pos, tuple(sorted(s.vis_streams)), step, forced=True))
            self._close(s)

    # ------------------------------------------------------------------ feeding
    def feed_ready(self) -> list[int]:
        """Feed every ready stream's pending tokens: main first, then threads by id (a thread forked
        by a promise fed in this very call starts in it too: threads are made when their promise is
        sampled, before any feeding, and have higher ids). Returns the new fed indices."""
        new: list[int] = []
        for s in list(self.streams.values()):  # ids increase with insertion: dict order is id order
            if s.pending and s.started and not (s.waiting and self.live):
                new.extend(self._feed_one(s, out) for out in s.pending)
                s.pending, s.waiting, s.last_row = [], False, new[-1]
        return new

    def _feed_one(self, s: StreamState, out: Out) -> int:
        if out.forced and out.stream != MAIN and not s.own:
            out.visible_streams = tuple(sorted(s.vis_streams))
        if out.is_sync:  # every chunk forked so far is finished: from now on main sees them all
            out.merged = tuple(self.unmerged)
            for tid in self.unmerged:
                s.visible.extend(self.streams[tid].own)
                s.vis_streams.add(tid)
            self.unmerged = []
        idx = len(self.fed)
        out.position, out.fed = s.pos, idx
        s.visible.append(idx)
        s.own.append(idx)
        self.fed.append(Fed(out.token_id, s.sid, s.pos, s.visible.view()))
        s.pos += 1
        if s.fork and out.thread == s.fork[0]:  # the promise is in the KV: the thread sees up to here
            t, n = self.streams[s.fork[0]], s.fork[1]
            t.visible, t.vis_streams = s.visible.copy(), s.vis_streams | {t.sid}
            t.pos, t.reserve_end, t.started = s.pos, s.pos + n, not self.defer_threads
            s.pos, s.fork = s.pos + n, None
        return idx

    def unmerged_started(self) -> bool:
        return any(self.streams[t].started for t in self.unmerged)

    def release_threads(self) -> None:
        """Skeleton scheduling: let every reserved thread start."""
        for s in self.streams.values():
            if s.reserve_end < (1 << 30):
                s.started = True

    # ------------------------------------------------------------------ results
    def final_order(self) -> list[Out]:
        """Main's tokens with each forked chunk right after the promise that forked it."""
        order: list[Out] = []

        def walk(sid: int) -> None:
            for o in self.streams[sid].outs:
                order.append(o)
                if o.thread in self.streams:
                    walk(o.thread)

        walk(MAIN)
        return order

    def graph(self, prompt_tokens: int) -> dict:
        """Chunk DAG (networkx node-link): main segments split at each fork and each sync."""
        nodes: list[dict[str, Any]] = [{"id": "prompt", "kind": "prompt", "stream": -1, "tokens": prompt_tokens}]
        links: list[dict[str, Any]] = [{"source": "prompt", "target": "main:0"}]
        seg = 0
        cur: dict[str, Any] = {"id": "main:0", "kind": "main", "stream": MAIN, "tokens": 0}
        nodes.append(cur)

        def next_segment() -> dict:
            nonlocal seg
            seg += 1
            node = {"id": f"main:{seg}", "kind": "main", "stream": MAIN, "tokens": 0}
            nodes.append(node)
            links.append({"source": cur["id"], "target": node["id"]})
            return node

        for o in self.streams[MAIN].outs:
            if o.merged:
                cur = next_segment()
                links.extend({"source": f"thread:{t}", "target": cur["id"]} for t in o.merged)
            cur["tokens"] += 1
            if o.thread in self.streams:
                t = self.streams[o.thread]
                nodes.append({"id": f"thread:{o.thread}", "kind": "async", "stream": o.thread, "tokens": len(t.outs)})
                links.append({"source": cur["id"], "target": f"thread:{o.thread}"})
                cur = next_segment()
        return {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "links": links}


class PastaEngine(Engine):
    name = "pasta"
    default_model = "pasta-sft"
    default_task = "word_facts"

    def __init__(
        self,
        model: TinyLM,
        tokenizer: Tokenizer,
        config: GenerationConfig = GenerationConfig(),
        max_threads: int = 8,
        max_chunk_tokens: int = 64,
        max_total_tokens: int = 0,
    ) -> None:
        super().__init__(model, tokenizer, config)
        for name, v in (("max_threads", max_threads), ("max_chunk_tokens", max_chunk_tokens)):
            if not is_count(v):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not is_count(max_total_tokens, 0):
            raise ValueError(f"max_total_tokens must be an integer >= 0, got {max_total_tokens!r}")
        self.max_threads, self.max_chunk_tokens = max_threads, max_chunk_tokens
        self.max_total_tokens = max_total_tokens or 2 * config.max_tokens

    def start(self, request: Request, kv: RequestKV) -> PastaState:
        return PastaState(self, request, kv)

    # ------------------------------------------------------------------ hooks (the skeleton baseline overrides them)
    def new_layout(self, prompt: list[int]) -> Layout:
        return Layout(prompt, self.tok, self.max_threads, self.max_chunk_tokens)

    def schedule(self, lay: Layout) -> None:
        """Called before each pass is assembled; PASTA starts threads as soon as their promise is fed."""

    def phase(self, lay: Layout, batch: list[int]) -> str:
        return (
            "sync" if any(lay.fed[i].token_id == lay.sync_id and lay.fed[i].stream == MAIN for i in batch) else "decode"
        )

    def choose(self, lay: Layout, sids: list[int], logits: torch.Tensor, sample: Sampler) -> list[int]:
        """Next token of each stream in `sids` from its logits row (tests override this to script a stream)."""
        return sample(logits).tolist()

    def _completion(
        self,
        request: Request,
        lay: Layout,
        slots: list[int],
        n: int,
        steps: int,
        peak_tokens: int,
        peak_bytes: int,
        stop_reason: str,
    ) -> Completion:
        order = lay.final_order()
        tokens = [
            TokenRecord(
                o.token_id,
                o.stream,
                max(0, o.step),
                o.position,
                o.kind,
                slots[o.fed] if 0 <= o.fed < len(slots) else -1,
                o.visible_streams,
            )
            for o in order
        ]
        graph = lay.graph(n)
        graph["graph"] = {"critical_path_tokens": steps, "events": len(lay.events)}
        return Completion(
            request_id=request.request_id,
            prompt_tokens=n,
            output_ids=[o.token_id for o in order],
            text=self.tok.decode([o.token_id for o in order if o.kind == "content"], skip_control=True),
            tokens=tokens,
            graph=graph,
            # every pass advances every stream that can advance, so the number of passes is the
            # longest dependent chain of sampled tokens (prompt -> promise -> chunk -> sync -> ...)
            critical_path_tokens=steps,
            steps=steps,
            peak_live_kv_tokens=peak_tokens,
            peak_kv_bytes=peak_bytes,
            status="ok" if stop_reason == "stop_token" else "truncated",
            stop_reason=stop_reason,
            events=list(lay.events),
        )


class PastaState(RequestState):
    """One request: its layout, the slot of every fed token, and the fed rows of its next pass
    (every stream that can advance; the prompt's rows first)."""

    eng: PastaEngine

    def __init__(self, eng: PastaEngine, request: Request, kv: RequestKV) -> None:
        self.eng, self.req, self.kv = eng, request, kv
        self.sample = Sampler(eng.config.sampling, request.request_id)
        prompt = eng.prompt_ids(request)
        self.n, self.max_pos = len(prompt), eng.model.cfg.max_positions  # it fits: checked by prompt_ids
        self.lay = eng.new_layout(prompt)
        self.slots = Indices()  # fed index -> KV slot
        self.batch = list(range(self.n))  # fed indices of the next pass
        self.step, self.phase, self.stop_reason = 0, "prefill", "stop_token"
        self.peak_tokens = self.peak_bytes = self.total = self.content = 0

    def next_rows(self) -> int:
        return len(self.batch)

    def next_new_slots(self) -> dict:
        return {None: len(self.batch)}

    def max_kv_tokens(self) -> int:
        # fed: the prompt, the tokens sampled before the last pass (fewer than max_total_tokens; the
        # last pass's are never fed) and a forced <async> per promise, which takes two of them
        m = self.eng.max_total_tokens
        return self.n + m + m // 2

    def prompt_left(self) -> int:
        return len(self.batch) if self.phase == "prefill" else 0

    def prompt_chunk(self, k: int) -> PassInputs:
        rows, self.batch = self.batch[:k], self.batch[k:]
        return self._pass(rows, "prefill")

    def restart_prefill(self) -> None:
        self.slots, self.batch = Indices(), list(range(self.n))

    def next_inputs(self) -> PassInputs:
        self.inp = self._pass(self.batch, self.phase)
        return self.inp

    def _pass(self, batch: list[int], phase: str) -> PassInputs:
        new_slots = self.kv.allocate(len(batch))
        self.slots.extend(new_slots)
        fed = [self.lay.fed[i] for i in batch]
        cols = self.slots.view()
        vis = np.zeros((len(fed), len(cols)), dtype=bool)
        for r, f in enumerate(fed):
            vis[r, f.sees] = True
        return PassInputs([f.token_id for f in fed], [f.position for f in fed], new_slots, cols, vis, phase)

    def after(self, logits: torch.Tensor, attention: torch.Tensor | None) -> Step:
        lay, eng, batch = self.lay, self.eng, self.batch
        logits = logits[self.inp.skip :]
        # one sampled token per stream whose last row is in this pass
        at = {i: r for r, i in enumerate(batch)}
        sids = [sid for sid, s in lay.streams.items() if not s.done and s.last_row in at and not s.pending]
        rows = [at[lay.streams[sid].last_row] for sid in sids]
        toks = (
            eng.choose(lay, sids, logits if rows == list(range(len(batch))) else logits[rows], self.sample)
            if sids
            else []
        )
        for sid, t in zip(sids, toks):
            out = lay.advance(sid, int(t), self.step)
            self.total += 1
            self.content += out.kind == "content" and not eng.is_stop(out.token_id)
        live, held = self.kv.live_tokens, self.kv.bytes_allocated
        self.peak_tokens, self.peak_bytes = max(self.peak_tokens, live), max(self.peak_bytes, held)
        streams = tuple(sorted({max(MAIN, lay.fed[i].stream) for i in batch}))
        step = Step(
            self.req.request_id,
            self.step,
            self.phase,
            streams,
            len(batch),
            self.inp.kv_read,
            live,
            held,
            emitted=tuple(int(t) for t in toks),
        )
        self._next_batch()
        return step

    def _next_batch(self) -> None:
        """Decide what the next pass feeds, or that the request is done."""
        lay, eng = self.lay, self.eng
        if lay.finished:
            self.done = True
            return
        if self.content >= eng.config.max_tokens or self.total >= eng.max_total_tokens:
            self.done, self.stop_reason = True, "max_tokens"
            return
        eng.schedule(lay)
        self.batch = lay.feed_ready()
        if not self.batch:  # nothing can run (cannot happen with a well-formed layout; never hang)
            self.done, self.stop_reason = True, "stalled"
        elif max(lay.fed[i].position for i in self.batch) >= self.max_pos:
            self.done, self.stop_reason = True, "max_positions"
        else:
            self.step += 1
            self.phase = eng.phase(lay, self.batch)

    # ------------------------------------------------------------------ preemption
    def held(self) -> list[tuple[int, int, np.ndarray]]:
        return [(f.token_id, f.position, f.sees) for f in self.lay.fed[: len(self.slots)]]

    def remap(self, new_slots: list[int]) -> None:
        self.slots = Indices(new_slots)

    def completion(self) -> Completion:
        return self.eng._completion(
            self.req,
            self.lay,
            self.slots.view().tolist(),
            self.n,
            self.step + 1,
            self.peak_tokens,
            self.peak_bytes,
            self.stop_reason,
        )
