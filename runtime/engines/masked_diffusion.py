"""`masked_diffusion`: the plain masked-diffusion baseline (LLaDA / Dream style; Fast-dLLM with a
confidence threshold). No plan: the whole answer is one span of `length` [MASK] tokens after the
prompt, denoised bidirectionally in a fixed number of `steps` (default: `length`, one token a
step), in entropy order by default; `confidence_threshold` also commits, each step, every
prediction at least that confident (Fast-dLLM), so the run can end in fewer steps. `[PAD]` lets
the answer end before the span does.

The first pass computes the prompt and the span together (the prompt is causal and never sees
the span, so this is exact); later passes recompute only the span over the cached prompt. Runs
on the Planned Diffusion checkpoint (its recipe trains this format too: `mdm` in
runtime/train/planned_diffusion.py), with the same `hybrid_mask` visibility.
"""

from __future__ import annotations

import json
from collections.abc import Generator

from runtime.engines.base import Completion, Engine, GenerationConfig, Request, Step, TokenRecord, linear_graph
from runtime.engines.diffusion_common import Layout, check_knobs, denoise, scaffold
from runtime.lang.planned_diffusion import ASYNC, ASYNC_END, MASK, PAD
from runtime.model import TinyLM
from runtime.sampling import Sampler
from runtime.tokenizer import Tokenizer


class MaskedDiffusionEngine(Engine):
    name = "masked_diffusion"
    default_model = "pd-tiny"
    default_task = "word_facts"

    def __init__(self, model: TinyLM, tokenizer: Tokenizer, config: GenerationConfig = GenerationConfig(), *,
                 length: int = 144, steps: int | None = None, order: str = "entropy",
                 confidence_threshold: float | None = None) -> None:
        super().__init__(model, tokenizer, config)
        check_knobs(1.0, order, confidence_threshold, 1.0)
        if int(length) < 1 or (steps is not None and int(steps) < 1):
            raise ValueError(f"length and steps must be >= 1, got length={length}, steps={steps}")
        self.length, self.steps = int(length), int(steps) if steps is not None else int(length)
        self.order, self.threshold = order, confidence_threshold or None
        t = tokenizer.token_id
        self.tags, self.mask_id, self.span_pad = (t(ASYNC), t(ASYNC_END)), t(MASK), t(PAD)

    def run(self, request: Request) -> Generator[Step, None, Completion]:
        kv = self.new_store()
        sample = Sampler(self.config.sampling, request.request_id)
        lay = Layout(self.model, kv)
        prompt = self.prompt_ids(request)
        n = len(prompt)
        lay.append("ar", prompt)
        span = scaffold(lay, 1, self.length, self.tags, self.mask_id)
        refresh = list(range(n))  # the first pass also computes the prompt
        step, peak = 0, [0, 0]
        gen = denoise(lay, [span], self.steps, sample, self.order, self.threshold, refresh)
        while True:
            try:
                d = next(gen)
            except StopIteration:
                break
            peak = [max(peak[0], kv.live_tokens), max(peak[1], kv.bytes_allocated)]
            note = {"round": 0, "step": d["i"] + 1, "masks_left": d["masks_left"], "unmasked": d["unmasked"]}
            yield Step(request.request_id, step, "denoise", d["streams"], d["rows"], d["kv_read"], kv.live_tokens,
                       kv.bytes_allocated, emitted=d["emitted"], note=json.dumps(note))
            step += 1
        tokens = []
        for r in span.rows:
            t = lay.ids[r]
            kind = "tag" if t in self.tags else "pad" if t == self.span_pad else "content"
            tokens.append(TokenRecord(t, 1, span.unmasked_at.get(r, 0), r, kind, lay.slots[r], (-1, 1)))
        text = self.tok.decode([t.token_id for t in tokens if t.kind == "content"], skip_control=True)
        graph = linear_graph(n, len(tokens))
        graph["nodes"][1].update(kind="span", stream=1, length=self.length, finished_at_step=span.finished_at)
        return Completion(
            request_id=request.request_id, prompt_tokens=n, output_ids=[t.token_id for t in tokens], text=text,
            tokens=tokens, graph=graph, critical_path_tokens=self.length, steps=step,
            peak_live_kv_tokens=peak[0], peak_kv_bytes=peak[1], status="ok", stop_reason="denoised",
            events=[{"event": "mdm", "length": self.length, "steps": self.steps, "denoise_passes": step,
                     "finished_at": span.finished_at}])
