"""`sequential`: the autoregressive baseline. Prefill the prompt, then decode one token per
forward pass, each query seeing every earlier slot (the causal case of the one primitive).
"""

from __future__ import annotations

import numpy as np
import torch

from profiler.schema import linear_graph
from runtime.engines.base import (
    Completion,
    Engine,
    PassInputs,
    Request,
    RequestState,
    Step,
    TokenRecord,
    causal_inputs,
)
from runtime.kv import RequestKV
from runtime.sampling import Sampler


class SequentialEngine(Engine):
    name = "sequential"
    default_model = "sequential-tiny"
    default_task = "reverse_words"

    def start(self, request: Request, kv: RequestKV) -> SequentialState:
        return SequentialState(self, request, kv)


class SequentialState(RequestState):
    """One request: the prompt's prefill, then one decode row per pass."""

    eng: SequentialEngine

    def __init__(self, eng: SequentialEngine, request: Request, kv: RequestKV) -> None:
        self.eng, self.req, self.kv = eng, request, kv
        self.sample = Sampler(eng.config.sampling, request.request_id)
        self.prompt = eng.prompt_ids(request)
        self.n = len(self.prompt)  # fits the model's positions: checked by prompt_ids
        self.slots: list[int] = []
        self.tokens: list[TokenRecord] = []
        self.peak_tokens = self.peak_bytes = 0
        self.step, self.phase, self.stop_reason = 0, "prefill", "max_tokens"

    def next_rows(self) -> int:
        return self.n - len(self.slots) if self.phase == "prefill" else 1

    def next_new_slots(self) -> dict:
        return {None: self.next_rows()}

    def prompt_left(self) -> int:
        return self.n - len(self.slots) if self.phase == "prefill" else 0

    def prompt_chunk(self, k: int) -> PassInputs:
        p = len(self.slots)
        self.slots += self.kv.allocate(k)
        return causal_inputs(self.prompt[p : p + k], list(range(p, p + k)), self.slots, "prefill", start=p)

    def restart_prefill(self) -> None:
        self.slots = []

    def next_inputs(self) -> PassInputs:
        if self.phase == "prefill":
            p = len(self.slots)
            self.slots += self.kv.allocate(self.n - p)
            self.inp = causal_inputs(self.prompt[p:], list(range(p, self.n)), self.slots, "prefill", start=p)
        else:
            (slot,) = self.kv.allocate(1)
            self.slots.append(slot)
            self.tokens[-1].kv_slot = slot
            self.inp = causal_inputs(
                [self.tokens[-1].token_id],
                [self.n + len(self.tokens) - 1],
                self.slots,
                "decode",
                start=len(self.slots) - 1,
            )
        return self.inp

    def after(self, logits: torch.Tensor, attention: torch.Tensor | None) -> Step:
        self.peak_tokens = max(self.peak_tokens, self.kv.live_tokens)
        self.peak_bytes = max(self.peak_bytes, self.kv.bytes_allocated)
        tok = int(self.sample(logits[-1:])[0])
        self.tokens.append(
            TokenRecord(
                tok, stream=0, step_index=self.step, position_id=self.n + len(self.tokens), visible_streams=(-1, 0)
            )
        )
        step = Step(
            self.req.request_id,
            self.step,
            self.phase,
            (0,),
            self.inp.rows - self.inp.skip,
            self.inp.kv_read,
            self.kv.live_tokens,
            self.kv.bytes_allocated,
            emitted=(tok,),
        )
        if self.eng.is_stop(tok):
            self.done, self.stop_reason = True, "stop_token"
        elif len(self.tokens) >= self.eng.config.max_tokens:
            self.done = True
        elif self.n + len(self.tokens) >= self.eng.model.cfg.max_positions:
            self.done, self.stop_reason = True, "max_positions"
        else:
            self.step, self.phase = self.step + 1, "decode"
        return step

    # ------------------------------------------------------------------ preemption
    def held(self) -> list[tuple[int, int, np.ndarray]]:
        ids = self.prompt + [t.token_id for t in self.tokens[: len(self.slots) - self.n]]
        return [(t, i, np.arange(i + 1)) for i, t in enumerate(ids)]

    def remap(self, new_slots: list[int]) -> None:
        self.slots = list(new_slots)
        for t, s in zip(self.tokens, new_slots[self.n :]):
            t.kv_slot = s

    def completion(self) -> Completion:
        out = [t.token_id for t in self.tokens]
        return Completion(
            request_id=self.req.request_id,
            prompt_tokens=self.n,
            output_ids=out,
            text=self.eng.tok.decode(out, skip_control=True),
            tokens=self.tokens,
            graph=linear_graph(self.n, len(out)),
            critical_path_tokens=len(out),
            steps=self.step + 1,
            peak_live_kv_tokens=self.peak_tokens,
            peak_kv_bytes=self.peak_bytes,
            status="ok" if self.stop_reason == "stop_token" else "truncated",
            stop_reason=self.stop_reason,
        )
