"""`tip`: Thinking in Place (thesis arXiv 2609.14850, ch. 4). The model opens every reasoning
step with a thought register `<reg_i>`; reusing a register declares the step it held dead. The
engine parses the model's own tokens (`runtime.lang.tip.RegisterParser`), and an eviction policy
decides what leaves the cache: `tip` drops dead steps the moment the killing tag is sampled,
before the tag is fed, which is exactly the visibility training used (`tip_visibility`); the
baselines (`full`, `window`, `streaming`, `h2o`) enforce a budget in tokens on the same engine.

Evicted slots become invisible and are freed in the paged store; a page is released when all of
its slots are gone, so each step reports logical eviction (`evicted_tokens`) and physical
eviction (`freed_kv_bytes`) separately. `free_pages=False` keeps the pages and only masks (for
the test that freeing changes memory, not semantics). Prompt and generated tokens fill separate
pages (store owners), so the always-live prompt never pins a page of dead steps.

`TipStream` is one request's state with one query row per pass, so `serve` can batch many
requests into one forward pass over one fixed-size KV pool (memory-limited serving).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Generator

import torch

from profiler.errors import KVPoolFull
from runtime.engines.base import Completion, Engine, GenerationConfig, Request, Step, TokenRecord, visibility_rows
from runtime.engines.eviction import get_policy
from runtime.kv import PagedKVStore
from runtime.lang.tip import DEFAULT_REGISTERS, PROMPT_STREAM, RegisterParser, check_registers
from runtime.model import TinyLM
from runtime.sampling import Sampler
from runtime.tokenizer import Tokenizer


class TipEngine(Engine):
    name = "tip"
    default_model = "tip-tiny"
    default_task = "var_tracking"

    def __init__(self, model: TinyLM, tokenizer: Tokenizer, config: GenerationConfig = GenerationConfig(),
                 policy: str = "tip", budget_tokens: int | None = None, registers: int = DEFAULT_REGISTERS,
                 free_pages: bool = True, sinks: int = 4, heavy_fraction: float = 0.5) -> None:
        super().__init__(model, tokenizer, config)
        self.policy_name = str(policy)
        self.policy_args = dict(budget_tokens=budget_tokens, sinks=int(sinks), heavy_fraction=float(heavy_fraction))
        self.registers = check_registers(registers)
        self.free_pages = bool(free_pages)
        self.make_policy()  # fail now on a bad policy or budget, not mid-capture

    def make_policy(self):
        return get_policy(self.policy_name)(**self.policy_args)

    def run(self, request: Request) -> Generator[Step, None, Completion]:
        st = TipStream(self, request, self.new_store())
        logits, attn = st.forward_prefill()
        while True:
            yield st.after_forward(logits, attn)
            if st.done:
                return st.completion()
            logits, attn = st.forward_decode()


class TipStream:
    """One request: its slots, liveness, parser and records. One query row per forward pass."""

    def __init__(self, engine: TipEngine, request: Request, kv: PagedKVStore) -> None:
        self.eng, self.req, self.kv = engine, request, kv
        self.model = engine.model
        self.policy = engine.make_policy()
        self.parser = RegisterParser(engine.tok, engine.registers)
        self.sample = Sampler(engine.config.sampling, request.request_id)
        self.prompt = engine.prompt_ids(request)
        self.n = len(self.prompt)
        if self.n >= self.model.cfg.max_positions:
            raise ValueError(f"prompt of {self.n} tokens exceeds the model's {self.model.cfg.max_positions} positions")
        self.live: dict[int, int] = {}  # visible slot -> stream, oldest first
        self.allocated: set[int] = set()  # slots held in the store (live, or masked when free_pages=False)
        self.slot_token: dict[int, int] = {}  # slot -> index in self.tokens
        self.dead: set[int] = set()  # live slots of steps a register reuse declared dead
        self.tokens: list[TokenRecord] = []
        self.events = self.parser.events
        self.parents: dict[int, list[int]] = {}  # step stream -> steps live when it opened
        self.killed_at: dict[int, int] = {}  # step stream -> pass index that declared it dead
        self.step, self.phase = 0, "prefill"
        self.query_tokens, self.kv_read = self.n, self.n * (self.n + 1) // 2
        self.peak_tokens = self.peak_bytes = 0
        self.done, self.stop_reason = False, "max_tokens"

    # ------------------------------------------------------------------ inputs of the next pass
    def prefill_inputs(self) -> tuple[list[int], list[int], list[int], list[list[int]]]:
        slots = self.kv.allocate(self.n, owner=(self.req.request_id, "prompt"))
        for s in slots:
            self.live[s] = PROMPT_STREAM
        self.allocated.update(slots)
        self._peak()
        return self.prompt, list(range(self.n)), slots, [slots[: i + 1] for i in range(self.n)]

    def decode_inputs(self) -> tuple[int, int, int, list[int]]:
        """Allocate the last token's slot (KVPoolFull, with nothing changed, if the pool is full)."""
        (slot,) = self.kv.allocate(1, owner=(self.req.request_id, "gen"))
        rec = self.tokens[-1]
        rec.kv_slot = slot
        self.live[slot] = rec.stream
        self.allocated.add(slot)
        self.slot_token[slot] = len(self.tokens) - 1
        rec.visible_streams = tuple(sorted(set(self.live.values())))
        if rec.kind == "tag":
            self.parents[rec.stream] = [s for s in rec.visible_streams if s not in (PROMPT_STREAM, rec.stream)]
        self.step, self.phase, self.query_tokens = self.step + 1, "decode", 1
        self.kv_read = len(self.live)
        self._peak()
        return rec.token_id, rec.position_id, slot, list(self.live)

    def _peak(self) -> None:
        self.peak_tokens = max(self.peak_tokens, len(self.live))
        self.peak_bytes = max(self.peak_bytes, self.kv.bytes_allocated)

    # ------------------------------------------------------------------ single-request passes
    def _forward(self, ids, pos, slots, rows) -> tuple[torch.Tensor, torch.Tensor | None]:
        t = self.eng.tensor
        out = self.model(t(ids), t(pos), t(slots), visibility_rows(rows, self.kv.num_slots, self.eng.device), self.kv,
                         return_attention=self.policy.needs_attention)
        logits, attn = out if isinstance(out, tuple) else (out, None)
        return logits[-1:], attn

    def forward_prefill(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._forward(*self.prefill_inputs())

    def forward_decode(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        tok, pos, slot, vis = self.decode_inputs()
        return self._forward([tok], [pos], [slot], [vis])

    # ------------------------------------------------------------------ after a pass
    def after_forward(self, logits: torch.Tensor, attention: torch.Tensor | None) -> Step:
        """Sample, parse, evict; the `Step` of the pass that just ran."""
        if attention is not None:
            self.policy.observe(list(self.live), attention)
        tok = int(self.sample(logits)[0])
        effect = self.parser.feed(tok)
        self.tokens.append(TokenRecord(tok, stream=effect.stream, step_index=self.step,
                                       position_id=self.n + len(self.tokens), kind=effect.kind,
                                       visible_streams=tuple(sorted(set(self.live.values())))))
        note = ""
        if effect.killed_stream >= 0:
            self.killed_at[effect.killed_stream] = self.step
            self.dead.update(s for s, st in self.live.items() if st == effect.killed_stream)
            note = f"reg_{self.parser.stream_register[effect.stream]} kills step {effect.killed_stream}"
        if effect.event:
            note = f"ignored <reg_{effect.event['register']}> (registers={self.parser.registers})"
        evicted, freed = self.evict(self.policy.select(list(self.live), self.dead))
        self._check_stop(tok)
        return Step(self.req.request_id, self.step, self.phase, (effect.stream,), self.query_tokens, self.kv_read,
                    len(self.live), self.kv.bytes_allocated, emitted=(tok,), evicted_tokens=evicted,
                    freed_kv_bytes=freed, note=note)

    def evict(self, slots: list[int]) -> tuple[int, int]:
        """Make `slots` invisible (and free them): (tokens evicted, bytes released)."""
        if not slots:
            return 0, 0
        for s in slots:
            del self.live[s]
            i = self.slot_token.get(s)
            if i is not None:
                self.tokens[i].evicted_at_step = self.step
        self.dead.difference_update(slots)
        freed = 0
        if self.eng.free_pages:
            freed = self.kv.free(slots)
            self.allocated.difference_update(slots)
        return len(slots), freed

    def _check_stop(self, tok: int) -> None:
        if self.eng.is_stop(tok):
            self.done, self.stop_reason = True, "stop_token"
        elif len(self.tokens) >= self.eng.config.max_tokens:
            self.done = True
        elif self.n + len(self.tokens) >= self.model.cfg.max_positions:
            self.done, self.stop_reason = True, "max_positions"

    def release(self) -> int:
        """Free everything this request holds (it finished or was preempted). Bytes released."""
        freed = self.kv.free(sorted(self.allocated))
        self.allocated.clear()
        self.live.clear()
        return freed

    # ------------------------------------------------------------------ result
    def graph(self) -> dict:
        counts: dict[int, int] = {}
        for t in self.tokens:
            counts[t.stream] = counts.get(t.stream, 0) + 1
        nodes = [{"id": "prompt", "kind": "prompt", "stream": PROMPT_STREAM, "tokens": self.n}]
        links = []
        for s in sorted(counts):
            sid = f"step:{s}" if s > 0 else "main:0"
            nodes.append({"id": sid, "kind": "step" if s > 0 else "main", "stream": s, "tokens": counts[s],
                          "register": self.parser.stream_register.get(s, -1), "dead_at_step": self.killed_at.get(s, -1)})
            links.append({"source": "prompt", "target": sid})
            links += [{"source": f"step:{p}" if p > 0 else "main:0", "target": sid} for p in self.parents.get(s, [])]
        return {"directed": True, "multigraph": False, "graph": {"registers": self.parser.registers}, "nodes": nodes,
                "links": links}

    def completion(self) -> Completion:
        out = [t.token_id for t in self.tokens]
        return Completion(
            request_id=self.req.request_id, prompt_tokens=self.n, output_ids=out,
            text=self.eng.tok.decode(out, skip_control=True), tokens=self.tokens, graph=self.graph(),
            critical_path_tokens=len(out), steps=self.step + 1, peak_live_kv_tokens=self.peak_tokens,
            peak_kv_bytes=self.peak_bytes, status="ok" if self.stop_reason == "stop_token" else "truncated",
            stop_reason=self.stop_reason, events=list(self.events))


# ---------------------------------------------------------------------- memory-limited serving
def serve(engine: TipEngine, prompts: list[str], pool_bytes: int) -> dict:
    """Continuous batching of `prompts` over one KV pool of `pool_bytes` (whole pages).

    A request is admitted when its prompt fits with one spare page per running request; every
    decode pass batches one query row per running request into one forward; when the pool runs
    out, the newest request is preempted (its pages freed, recomputed later, as vLLM does).
    Returns concurrency and throughput figures; completions are in `completions`.
    """
    P = engine.config.page_size
    kv = engine.model.new_kv_store(page_size=P, max_pages=pool_bytes // (engine.model.kv_bytes_per_token * P))
    waiting = deque(Request(i, p) for i, p in enumerate(prompts))
    active: list[TipStream] = []
    done: dict[int, Completion] = {}
    batch_sizes: list[int] = []
    preemptions, t0 = 0, time.perf_counter()

    def free_pages() -> int:
        return kv.max_pages - kv.pages_held

    def preempt() -> TipStream:
        victim = active.pop()
        victim.release()
        waiting.appendleft(victim.req)
        return victim

    def finish(st: TipStream) -> None:
        st.release()
        done[st.req.request_id] = st.completion()

    while waiting or active:
        while waiting and free_pages() >= math.ceil((len(waiting[0].prompt) + 2) / P) + 1 + len(active):
            st = TipStream(engine, waiting.popleft(), kv)
            st.after_forward(*st.forward_prefill())
            (finish if st.done else active.append)(st)
        if not active:
            if waiting and kv.pages_held == 0:
                raise KVPoolFull(f"KV pool of {pool_bytes} bytes cannot hold one prompt")
            continue
        rows: list[tuple[TipStream, tuple[int, int, int, list[int]]]] = []
        i = 0
        while i < len(active):
            try:
                rows.append((active[i], active[i].decode_inputs()))
                i += 1
            except KVPoolFull:
                victim = preempt()
                preemptions += 1
                rows = [r for r in rows if r[0] is not victim]
        if not rows:
            continue
        t = engine.tensor
        vis = visibility_rows([r[1][3] for r in rows], kv.num_slots, engine.device)
        logits = engine.model(t([r[1][0] for r in rows]), t([r[1][1] for r in rows]), t([r[1][2] for r in rows]), vis, kv)
        batch_sizes.append(len(rows))
        for j, (st, _) in enumerate(rows):
            st.after_forward(logits[j: j + 1], None)
            if st.done:
                active.remove(st)
                finish(st)
    wall = time.perf_counter() - t0
    out_tokens = sum(len(c.output_ids) for c in done.values())
    return {"requests": len(done), "pool_bytes": int(pool_bytes), "pool_pages": kv.max_pages, "wall_s": wall,
            "output_tokens": out_tokens, "tokens_per_s": out_tokens / wall if wall > 0 else float("nan"),
            "mean_concurrency": sum(batch_sizes) / max(1, len(batch_sizes)),
            "max_concurrency": max(batch_sizes, default=0), "decode_passes": len(batch_sizes),
            "preemptions": preemptions, "completions": [done[i] for i in sorted(done)]}
