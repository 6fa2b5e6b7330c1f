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

`TipStream` is one request's state with one query row per pass, so `runtime.server` can batch
many requests into one forward pass over one fixed-size KV pool (memory-limited serving).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from runtime.engines.base import (
    Completion,
    Engine,
    GenerationConfig,
    PassInputs,
    Request,
    RequestState,
    Step,
    TokenRecord,
    causal_inputs,
)
from runtime.engines.eviction import get_policy
from runtime.kv import RequestKV
from runtime.lang.tip import DEFAULT_REGISTERS, PROMPT_STREAM, RegisterParser, check_registers
from runtime.model import TinyLM
from runtime.sampling import Sampler
from runtime.tokenizer import Tokenizer


class TipEngine(Engine):
    name = "tip"
    default_model = "tip-tiny"
    default_task = "var_tracking"

    def __init__(
        self,
        model: TinyLM,
        tokenizer: Tokenizer,
        config: GenerationConfig = GenerationConfig(),
        policy: str = "tip",
        budget_tokens: int | None = None,
        registers: int = DEFAULT_REGISTERS,
        free_pages: bool = True,
        sinks: int = 4,
        heavy_fraction: float = 0.5,
    ) -> None:
        super().__init__(model, tokenizer, config)
        self.policy_name = str(policy)
        self.policy_args: dict[str, Any] = dict(
            budget_tokens=budget_tokens, sinks=int(sinks), heavy_fraction=float(heavy_fraction)
        )
        self.registers = check_registers(registers)
        self.free_pages = bool(free_pages)
        self.make_policy()  # fail now on a bad policy or budget, not mid-capture

    def make_policy(self):
        return get_policy(self.policy_name)(**self.policy_args)

    def start(self, request: Request, kv: RequestKV) -> TipStream:
        return TipStream(self, request, kv)


class TipStream(RequestState):
    """One request: its slots, liveness, parser and records. One query row per forward pass."""

    eng: TipEngine

    def __init__(self, engine: TipEngine, request: Request, kv: RequestKV) -> None:
        self.eng, self.req, self.kv = engine, request, kv
        self.model = engine.model
        self.policy = engine.make_policy()
        self.parser = RegisterParser(engine.tok, engine.registers)
        self.sample = Sampler(engine.config.sampling, request.request_id)
        self.prompt = engine.prompt_ids(request)
        self.n = len(self.prompt)  # fits the model's positions: checked by prompt_ids
        self.live: dict[int, int] = {}  # visible slot -> stream, oldest first
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
        self.fed: list[tuple[int, int, np.ndarray]] = []  # every token fed: (id, position, fed indices it saw)
        self.fed_slot: list[int] = []  # fed index -> slot
        self.slot_fed: dict[int, int] = {}  # slot -> fed index
        self.free_after_replay = False

    # ------------------------------------------------------------------ inputs of the next pass
    prompt_owner = "prompt"

    def next_rows(self) -> int:
        return self.n - len(self.fed) if len(self.fed) < self.n else 1

    def next_new_slots(self) -> dict:
        return {"prompt": self.n - len(self.fed)} if len(self.fed) < self.n else {"gen": 1}

    def _feed(self, ids: list[int], positions: list[int], slots: list[int], sees: list[np.ndarray]) -> None:
        for t, p, sl, se in zip(ids, positions, slots, sees):
            self.slot_fed[sl] = len(self.fed)
            self.fed.append((t, p, se))
            self.fed_slot.append(sl)

    def next_inputs(self) -> PassInputs:
        if len(self.fed) < self.n:
            return self.prefill_inputs(self.n - len(self.fed))
        return self.decode_inputs()

    def prompt_left(self) -> int:
        return self.n - len(self.fed) if len(self.fed) < self.n else 0

    def prompt_chunk(self, k: int) -> PassInputs:
        return self.prefill_inputs(k)

    def restart_prefill(self) -> None:
        self.live.clear()
        self.fed, self.fed_slot, self.slot_fed = [], [], {}
        self.policy.forget()  # H2O: the chunks' scores start over with them

    def prefill_inputs(self, k: int) -> PassInputs:
        """The next `k` prompt tokens (all that is left: the prefill pass; fewer: a chunk)."""
        p = len(self.fed)
        slots = self.kv.allocate(k, owner="prompt")
        for s in slots:
            self.live[s] = PROMPT_STREAM
        self._feed(self.prompt[p : p + k], list(range(p, p + k)), slots, [np.arange(i + 1) for i in range(p, p + k)])
        self._peak()
        self.query_tokens, self.kv_read = k, (p + k) * (p + k + 1) // 2 - p * (p + 1) // 2
        inp = causal_inputs(self.prompt[p : p + k], list(range(p, p + k)), self.fed_slot, "prefill", start=p)
        inp.attention = self.policy.needs_attention
        return inp

    def decode_inputs(self) -> PassInputs:
        """Allocate the last token's slot (KVPoolFull, with nothing changed, if the pool is full)."""
        (slot,) = self.kv.allocate(1, owner="gen")
        rec = self.tokens[-1]
        rec.kv_slot = slot
        self.live[slot] = rec.stream
        self.slot_token[slot] = len(self.tokens) - 1
        rec.visible_streams = tuple(sorted(set(self.live.values())))
        if rec.kind == "tag":
            self.parents[rec.stream] = [s for s in rec.visible_streams if s not in (PROMPT_STREAM, rec.stream)]
        self.step, self.phase, self.query_tokens = self.step + 1, "decode", 1
        self.kv_read = len(self.live)
        self._peak()
        cols = np.fromiter(self.live, dtype=np.int64, count=len(self.live))
        self.slot_fed[slot] = len(self.fed)  # the new token sees itself
        self._feed(
            [rec.token_id],
            [rec.position_id],
            [slot],
            [np.fromiter((self.slot_fed[s] for s in self.live), dtype=np.int64, count=len(self.live))],
        )
        return PassInputs(
            [rec.token_id],
            [rec.position_id],
            [slot],
            cols,
            np.ones((1, len(cols)), dtype=bool),
            "decode",
            self.policy.needs_attention,
        )

    def _peak(self) -> None:
        self.peak_tokens = max(self.peak_tokens, len(self.live))
        self.peak_bytes = max(self.peak_bytes, self.kv.bytes_allocated)

    # ------------------------------------------------------------------ preemption
    def held(self) -> list[tuple[int, int, np.ndarray]]:
        """Every token fed so far, evicted ones too: a living token's K/V were computed while it saw
        steps now dead (as training saw them), so an exact re-prefill needs them for one pass."""
        return list(self.fed)

    def readmit(self) -> int:
        n = super().readmit()
        self.free_after_replay = True
        return n

    def replay_owners(self) -> list:
        return ["prompt" if i < self.n else "gen" for i in range(len(self.fed))]

    def remap(self, new_slots: list[int]) -> None:
        old_to_new = dict(zip(self.fed_slot, new_slots))
        self.live = {old_to_new[s]: st for s, st in self.live.items()}
        self.dead = {old_to_new[s] for s in self.dead}
        self.slot_token = {old_to_new[s]: i for s, i in self.slot_token.items() if s in old_to_new}
        for rec in self.tokens:
            if rec.kv_slot >= 0:
                rec.kv_slot = old_to_new[rec.kv_slot]
        self.policy.moved(old_to_new)  # H2O's scores are per slot
        self.fed_slot = list(new_slots)
        self.slot_fed = {s: i for i, s in enumerate(new_slots)}

    def dead_after_replay(self) -> list[int]:
        return [s for s in self.fed_slot if s not in self.live] if self.eng.free_pages else []

    # ------------------------------------------------------------------ after a pass
    def after_chunk(self, attention: torch.Tensor | None) -> None:
        """H2O scores the prompt's chunks as a run alone scores its whole prefill (was: only the last
        chunk's attention counted, so a chunked run evicted other tokens than the run alone)."""
        if attention is not None:
            self.policy.observe(list(self.live), attention)

    def after(self, logits: torch.Tensor, attention: torch.Tensor | None) -> Step:
        """Sample, parse, evict; the `Step` of the pass that just ran."""
        if self.free_after_replay:  # the replay rewrote tokens evicted before the preemption: free them again
            dead = self.dead_after_replay()
            self.kv.free(dead)
            self.free_after_replay = False
        logits = logits[-1:]
        if attention is not None:
            self.policy.observe(list(self.live), attention)
        tok = int(self.sample(logits)[0])
        effect = self.parser.feed(tok)
        self.tokens.append(
            TokenRecord(
                tok,
                stream=effect.stream,
                step_index=self.step,
                position_id=self.n + len(self.tokens),
                kind=effect.kind,
                visible_streams=tuple(sorted(set(self.live.values()))),
            )
        )
        note = ""
        if effect.killed_stream >= 0:
            self.killed_at[effect.killed_stream] = self.step
            self.dead.update(s for s, st in self.live.items() if st == effect.killed_stream)
            note = f"reg_{self.parser.stream_register[effect.stream]} kills step {effect.killed_stream}"
        if effect.event:
            note = f"ignored <reg_{effect.event['register']}> (registers={self.parser.registers})"
        evicted, freed = self.evict(self.policy.select(list(self.live), self.dead))
        self._check_stop(tok)
        return Step(
            self.req.request_id,
            self.step,
            self.phase,
            (effect.stream,),
            self.query_tokens,
            self.kv_read,
            len(self.live),
            self.kv.bytes_allocated,
            emitted=(tok,),
            evicted_tokens=evicted,
            freed_kv_bytes=freed,
            note=note,
        )

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
        return len(slots), freed

    def _check_stop(self, tok: int) -> None:
        if self.eng.is_stop(tok):
            self.done, self.stop_reason = True, "stop_token"
        elif len(self.tokens) >= self.eng.config.max_tokens:
            self.done = True
        elif self.n + len(self.tokens) >= self.model.cfg.max_positions:
            self.done, self.stop_reason = True, "max_positions"

    # ------------------------------------------------------------------ result
    def graph(self) -> dict:
        counts: dict[int, int] = {}
        for t in self.tokens:
            counts[t.stream] = counts.get(t.stream, 0) + 1
        nodes = [{"id": "prompt", "kind": "prompt", "stream": PROMPT_STREAM, "tokens": self.n}]
        links = []
        for s in sorted(counts):
            sid = f"step:{s}" if s > 0 else "main:0"
            nodes.append(
                {
                    "id": sid,
                    "kind": "step" if s > 0 else "main",
                    "stream": s,
                    "tokens": counts[s],
                    "register": self.parser.stream_register.get(s, -1),
                    "dead_at_step": self.killed_at.get(s, -1),
                }
            )
            links.append({"source": "prompt", "target": sid})
            links += [{"source": f"step:{p}" if p > 0 else "main:0", "target": sid} for p in self.parents.get(s, [])]
        return {
            "directed": True,
            "multigraph": False,
            "graph": {"registers": self.parser.registers},
            "nodes": nodes,
            "links": links,
        }

    def completion(self) -> Completion:
        out = [t.token_id for t in self.tokens]
        return Completion(
            request_id=self.req.request_id,
            prompt_tokens=self.n,
            output_ids=out,
            text=self.eng.tok.decode(out, skip_control=True),
            tokens=self.tokens,
            graph=self.graph(),
            critical_path_tokens=len(out),
            steps=self.step + 1,
            peak_live_kv_tokens=self.peak_tokens,
            peak_kv_bytes=self.peak_bytes,
            status="ok" if self.stop_reason == "stop_token" else "truncated",
            stop_reason=self.stop_reason,
            events=list(self.events),
        )
