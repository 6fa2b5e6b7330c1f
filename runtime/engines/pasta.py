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

from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np
import torch

from runtime.engines.base import Completion, Engine, GenerationConfig, Request, Step, TokenRecord, visibility_rows
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
        self.buf[self.n: self.n + len(items)] = items
        self.n += len(items)

    def view(self) -> np.ndarray:
        return self.buf[: self.n]

    def copy(self) -> "Indices":
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

    def __init__(self, prompt_ids: list[int], tok: Tokenizer, max_threads: int = 8, max_chunk_tokens: int = 64,
                 defer_threads: bool = False) -> None:
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
        self._handlers = {Fork: self._fork, Inline: self._inline, Finish: self._finish, Sync: self._sync, End: self._end}

    def live_threads(self) -> int:
        return len(self.live)

    def _close(self, s: StreamState) -> None:
        s.done, s.pending = True, []
        self.live.discard(s.sid)

    @property
    def finished(self) -> bool:
        return all(s.done for s in self.streams.values())

    def event(self, kind: str, stream: int, **detail) -> None:
        self.events.append({"event": kind, "stream": stream, "stream_token": len(self.streams[stream].outs) - 1, **detail})

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
        by a promise fed in this very call starts in it too). Returns the new fed indices."""
        new: list[int] = []
        order, k = list(self.streams), 0  # ids increase with insertion: dict order is id order
        while k < len(order):
            s = self.streams[order[k]]
            if s.pending and s.started and not (s.waiting and self.live):
                new.extend(self._feed_one(s, out) for out in s.pending)
                s.pending, s.waiting, s.last_row = [], False, new[-1]
            k += 1
            if k == len(order) and len(self.streams) > k:
                order = list(self.streams)
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
        nodes = [{"id": "prompt", "kind": "prompt", "stream": -1, "tokens": prompt_tokens}]
        links = [{"source": "prompt", "target": "main:0"}]
        seg, cur = 0, {"id": "main:0", "kind": "main", "stream": MAIN, "tokens": 0}
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

    def __init__(self, model: TinyLM, tokenizer: Tokenizer, config: GenerationConfig = GenerationConfig(),
                 max_threads: int = 8, max_chunk_tokens: int = 64, max_total_tokens: int = 0) -> None:
        super().__init__(model, tokenizer, config)
        for name, v in (("max_threads", max_threads), ("max_chunk_tokens", max_chunk_tokens)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(max_total_tokens, int) or max_total_tokens < 0:
            raise ValueError(f"max_total_tokens must be an integer >= 0, got {max_total_tokens!r}")
        self.max_threads, self.max_chunk_tokens = max_threads, max_chunk_tokens
        self.max_total_tokens = max_total_tokens or 2 * config.max_tokens

    def run(self, request: Request) -> Generator[Step, None, Completion]:
        kv = self.new_store()
        sample = Sampler(self.config.sampling, request.request_id)
        prompt = self.prompt_ids(request)
        n, max_pos = len(prompt), self.model.cfg.max_positions
        if n >= max_pos:
            raise ValueError(f"prompt of {n} tokens exceeds the model's {max_pos} positions")
        lay = self.new_layout(prompt)
        slots = Indices()  # fed index -> KV slot
        batch = list(range(n))
        step, phase, stop_reason = 0, "prefill", "stop_token"
        peak_tokens = peak_bytes = total = content = 0
        while True:
            new_slots = kv.allocate(len(batch))
            slots.extend(new_slots)
            fed = [lay.fed[i] for i in batch]
            slot_of = slots.view()
            vis = visibility_rows([slot_of[f.sees] for f in fed], kv.num_slots, self.device)
            kv_read = sum(len(f.sees) for f in fed)
            ids = torch.from_numpy(np.array([[f.token_id for f in fed], [f.position for f in fed], new_slots],
                                            dtype=np.int64)).to(self.device)
            logits = self.model(ids[0], ids[1], ids[2], vis, kv)
            # one sampled token per stream whose last row is in this pass
            at = {i: r for r, i in enumerate(batch)}
            sids = [sid for sid, s in lay.streams.items() if not s.done and s.last_row in at and not s.pending]
            rows = [at[lay.streams[sid].last_row] for sid in sids]
            toks = self.choose(lay, sids, logits if rows == list(range(len(batch))) else logits[rows], sample) if sids else []
            for sid, t in zip(sids, toks):
                out = lay.advance(sid, int(t), step)
                total += 1
                content += out.kind == "content" and not self.is_stop(out.token_id)
            live, held = kv.live_tokens, kv.bytes_allocated
            peak_tokens, peak_bytes = max(peak_tokens, live), max(peak_bytes, held)
            streams = tuple(sorted({max(MAIN, f.stream) for f in fed}))
            yield Step(request.request_id, step, phase, streams, len(batch), kv_read, live, held, emitted=tuple(int(t) for t in toks))
            if lay.finished:
                break
            if content >= self.config.max_tokens or total >= self.max_total_tokens:
                stop_reason = "max_tokens"
                break
            self.schedule(lay)
            batch = lay.feed_ready()
            if not batch:  # nothing can run (cannot happen with a well-formed layout; never hang)
                stop_reason = "stalled"
                break
            if max(lay.fed[i].position for i in batch) >= max_pos:
                stop_reason = "max_positions"
                break
            step += 1
            phase = self.phase(lay, batch)
        return self._completion(request, lay, slots.view().tolist(), n, step + 1, peak_tokens, peak_bytes, stop_reason)

    # ------------------------------------------------------------------ hooks (the skeleton baseline overrides them)
    def new_layout(self, prompt: list[int]) -> Layout:
        return Layout(prompt, self.tok, self.max_threads, self.max_chunk_tokens)

    def schedule(self, lay: Layout) -> None:
        """Called before each pass is assembled; PASTA starts threads as soon as their promise is fed."""

    def phase(self, lay: Layout, batch: list[int]) -> str:
        return "sync" if any(lay.fed[i].token_id == lay.sync_id and lay.fed[i].stream == MAIN for i in batch) else "decode"

    def choose(self, lay: Layout, sids: list[int], logits: torch.Tensor, sample: Sampler) -> list[int]:
        """Next token of each stream in `sids` from its logits row (tests override this to script a stream)."""
        return sample(logits).tolist()

    def _completion(self, request: Request, lay: Layout, slots: list[int], n: int, steps: int,
                    peak_tokens: int, peak_bytes: int, stop_reason: str) -> Completion:
        order = lay.final_order()
        tokens = [TokenRecord(o.token_id, o.stream, max(0, o.step), o.position, o.kind,
                              slots[o.fed] if 0 <= o.fed < len(slots) else -1, o.visible_streams) for o in order]
        graph = lay.graph(n)
        graph["graph"] = {"critical_path_tokens": steps, "events": len(lay.events)}
        return Completion(
            request_id=request.request_id, prompt_tokens=n, output_ids=[o.token_id for o in order],
            text=self.tok.decode([o.token_id for o in order if o.kind == "content"], skip_control=True),
            tokens=tokens, graph=graph,
            # every pass advances every stream that can advance, so the number of passes is the
            # longest dependent chain of sampled tokens (prompt -> promise -> chunk -> sync -> ...)
            critical_path_tokens=steps, steps=steps, peak_live_kv_tokens=peak_tokens, peak_kv_bytes=peak_bytes,
            status="ok" if stop_reason == "stop_token" else "truncated", stop_reason=stop_reason, events=list(lay.events),
        )
