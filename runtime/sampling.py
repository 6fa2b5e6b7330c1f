"""Token choice: greedy, or seeded temperature / nucleus (top-p) sampling.

One `Sampler` per request: its generator is seeded from (seed, request id), so a request samples
the same tokens however many other requests ran before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from profiler.errors import UsageError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.temperature < math.inf):  # also refuses NaN
            raise UsageError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}")


class Sampler:
    def __init__(self, cfg: SamplingConfig, request_id: int = 0) -> None:
        self.cfg = cfg
        self.gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + request_id)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (R, V) -> token ids (R,)."""
        logits = logits.float().cpu()
        if self.cfg.temperature == 0.0:
            return logits.argmax(-1)
        # shifted so the top logit is 0 (others <= 0): a tiny temperature (1e-320 is 0 in float32,
        # 1e-37 overflows 100 / T) then gives -inf for the rest, never inf - inf = NaN (was: capture
        # --temperature 1e-320 exit 1, "probability tensor contains either inf, nan or element < 0")
        tiny = torch.finfo(logits.dtype).tiny
        shifted = logits - logits.max(-1, keepdim=True).values
        probs = (shifted / max(self.cfg.temperature, tiny)).softmax(-1)
        if self.cfg.top_p < 1.0:
            sorted_p, idx = probs.sort(-1, descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < self.cfg.top_p
            # the top token always: a top_p below float32's least (1e-300) is 0 there, which kept none
            keep[..., 0] = True
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        return torch.multinomial(probs, 1, generator=self.gen).squeeze(-1)
