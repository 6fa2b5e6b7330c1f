"""`masked_diffusion`: the plain masked-diffusion baseline (LLaDA / Dream style; Fast-dLLM with a
confidence threshold). No plan: the whole answer is one span of `length` [MASK] tokens (default 144, at
most `GenerationConfig.max_tokens`; a longer `length` is refused) after the prompt, denoised bidirectionally in a fixed number of `steps` (default: `length`, one token a
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

import torch

from profiler.errors import UsageError
from profiler.schema import linear_graph
from runtime.engines.base import (
    Completion,
    Engine,
    GenerationConfig,
    PassInputs,
    Request,
    Step,
    TokenRecord,
)
from runtime.engines.diffusion_common import Denoiser, LaidOutState, Layout, check_knobs, scaffold
from runtime.kv import RequestKV
from runtime.lang.planned_diffusion import ASYNC, ASYNC_END, MASK, PAD
from runtime.model import TinyLM
from runtime.sampling import Sampler
from runtime.tokenizer import Tokenizer

DEFAULT_LENGTH = 144  # the span's length when the `length` knob is not given (at most max_tokens)


class MaskedDiffusionEngine(Engine):
    name = "masked_diffusion"
    default_model = "pd-tiny"
    default_task = "word_facts"

    def __init__(
        self,
        model: TinyLM,
        tokenizer: Tokenizer,
        config: GenerationConfig = GenerationConfig(),
        *,
        length: int | None = None,
        steps: int | None = None,
        order: str = "entropy",
        confidence_threshold: float | None = None,
    ) -> None:
        super().__init__(model, tokenizer, config)
        check_knobs(1.0, order, confidence_threshold, 1.0)
        if (length is not None and int(length) < 1) or (steps is not None and int(steps) < 1):
            raise ValueError(f"length and steps must be >= 1, got length={length}, steps={steps}")
        # The span is the whole answer, so `max_tokens` bounds it (was: ignored, a 144-token span
        # for --max-tokens 20): the default span fits it, a longer one asked for is refused.
        if length is not None and int(length) > config.max_tokens:
            raise UsageError(
                f"length {length} exceeds max_tokens {config.max_tokens} (the span is the whole answer): "
                "ask for a shorter span or more tokens (--max-tokens)"
            )
        self.length = min(DEFAULT_LENGTH, config.max_tokens) if length is None else int(length)
        self.steps = int(steps) if steps is not None else self.length
        self.order, self.threshold = order, confidence_threshold or None
        t = tokenizer.token_id
        self.tags, self.mask_id, self.span_pad = (t(ASYNC), t(ASYNC_END)), t(MASK), t(PAD)

    def start(self, request: Request, kv: RequestKV) -> MaskedDiffusionState:
        return MaskedDiffusionState(self, request, kv)


class MaskedDiffusionState(LaidOutState):
    """One request: the prompt and one span, then a denoising pass per step."""

    eng: MaskedDiffusionEngine

    def __init__(self, eng: MaskedDiffusionEngine, request: Request, kv: RequestKV) -> None:
        self.eng, self.req, self.kv = eng, request, kv
        self.lay = Layout(eng.model.cfg.max_positions, kv)
        prompt = eng.prompt_ids(request)
        self.n = len(prompt)
        self.lay.append("ar", prompt)
        self.span = scaffold(self.lay, 1, eng.length, eng.tags, eng.mask_id)
        # the first pass also computes the prompt
        self.den = Denoiser(
            self.lay,
            [self.span],
            eng.steps,
            Sampler(eng.config.sampling, request.request_id),
            eng.order,
            eng.threshold,
            list(range(self.n)),
        )
        self.step, self.peak = 0, [0, 0]

    def max_kv_tokens(self) -> int:
        return self.n + self.eng.length + 2

    def restart_prefill(self) -> None:
        self.lay.slots = []

    def pass_rows(self) -> list[int]:
        return self.den.rows()

    def next_inputs(self) -> PassInputs:
        self.inp = self.lay.inputs(self.pass_rows(), "denoise")
        return self.inp

    def after(self, logits: torch.Tensor, attention: torch.Tensor | None) -> Step:
        d = self.den.after(logits[self.inp.skip :], self.inp.kv_read)
        kv = self.kv
        self.peak = [max(self.peak[0], kv.live_tokens), max(self.peak[1], kv.bytes_allocated)]
        note = {"round": 0, "step": d["i"] + 1, "masks_left": d["masks_left"], "unmasked": d["unmasked"]}
        step = Step(
            self.req.request_id,
            self.step,
            "denoise",
            d["streams"],
            d["rows"],
            d["kv_read"],
            kv.live_tokens,
            kv.bytes_allocated,
            emitted=d["emitted"],
            note=json.dumps(note),
        )
        self.step += 1
        self.done = self.den.finished
        return step

    def completion(self) -> Completion:
        eng, lay, span = self.eng, self.lay, self.span
        tokens = []
        for r in span.rows:
            t = lay.ids[r]
            kind = "tag" if t in eng.tags else "pad" if t == eng.span_pad else "content"
            tokens.append(TokenRecord(t, 1, span.unmasked_at.get(r, 0), r, kind, lay.slots[r], (-1, 1)))
        text = eng.tok.decode([t.token_id for t in tokens if t.kind == "content"], skip_control=True)
        graph = linear_graph(self.n, len(tokens))
        graph["nodes"][1].update(kind="span", stream=1, length=eng.length, finished_at_step=span.finished_at)
        return Completion(
            request_id=self.req.request_id,
            prompt_tokens=self.n,
            output_ids=[t.token_id for t in tokens],
            text=text,
            tokens=tokens,
            graph=graph,
            critical_path_tokens=eng.length,
            steps=self.step,
            peak_live_kv_tokens=self.peak[0],
            peak_kv_bytes=self.peak[1],
            status="ok",
            stop_reason="denoised",
            events=[
                {
                    "event": "mdm",
                    "length": eng.length,
                    "steps": eng.steps,
                    "denoise_passes": self.step,
                    "finished_at": span.finished_at,
                }
            ],
        )
