"""`sequential`: the autoregressive baseline. Prefill the prompt, then decode one token per
forward pass, each query seeing every earlier slot (the causal case of the one primitive).
"""

from __future__ import annotations

from collections.abc import Generator

from runtime.engines.base import Completion, Engine, Request, Step, TokenRecord, linear_graph, visibility_rows
from runtime.sampling import Sampler


class SequentialEngine(Engine):
    name = "sequential"
    default_model = "sequential-tiny"
    default_task = "reverse_words"

    def run(self, request: Request) -> Generator[Step, None, Completion]:
        kv = self.new_store()
        sample = Sampler(self.config.sampling, request.request_id)
        prompt = self.prompt_ids(request)
        n = len(prompt)
        if n >= self.model.cfg.max_positions:
            raise ValueError(f"prompt of {n} tokens exceeds the model's {self.model.cfg.max_positions} positions")
        slots = kv.allocate(n)
        rows = [slots[: i + 1] for i in range(n)]
        logits = self.model(self.tensor(prompt), self.tensor(list(range(n))), self.tensor(slots),
                            visibility_rows(rows, kv.num_slots, self.device), kv)
        kv_read = n * (n + 1) // 2
        tokens: list[TokenRecord] = []
        peak_tokens, peak_bytes = kv.live_tokens, kv.bytes_allocated
        step, phase, stop_reason = 0, "prefill", "max_tokens"
        last_logits = logits[-1:]
        while True:
            tok = int(sample(last_logits)[0])
            tokens.append(TokenRecord(tok, stream=0, step_index=step, position_id=n + len(tokens),
                                      visible_streams=(-1, 0)))
            query_tokens = n if phase == "prefill" else 1
            yield Step(request.request_id, step, phase, (0,), query_tokens, kv_read,
                       kv.live_tokens, kv.bytes_allocated, emitted=(tok,))
            if self.is_stop(tok):
                stop_reason = "stop_token"
                break
            if len(tokens) >= self.config.max_tokens:
                break
            if n + len(tokens) >= self.model.cfg.max_positions:
                stop_reason = "max_positions"
                break
            step += 1
            phase = "decode"
            (slot,) = kv.allocate(1)
            slots.append(slot)
            tokens[-1].kv_slot = slot
            pos = n + len(tokens) - 1
            last_logits = self.model(self.tensor([tok]), self.tensor([pos]), self.tensor([slot]),
                                     visibility_rows([slots], kv.num_slots, self.device), kv)
            kv_read = len(slots)
            peak_tokens, peak_bytes = max(peak_tokens, kv.live_tokens), max(peak_bytes, kv.bytes_allocated)
        out = [t.token_id for t in tokens]
        return Completion(
            request_id=request.request_id,
            prompt_tokens=n,
            output_ids=out,
            text=self.tok.decode(out, skip_control=True),
            tokens=tokens,
            graph=linear_graph(n, len(out)),
            critical_path_tokens=len(out),
            steps=step + 1,
            peak_live_kv_tokens=peak_tokens,
            peak_kv_bytes=peak_bytes,
            status="ok" if stop_reason == "stop_token" else "truncated",
            stop_reason=stop_reason,
        )
