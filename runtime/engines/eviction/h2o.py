"""`h2o`: Heavy-Hitter Oracle (Zhang et al., arXiv 2306.14048). Keep the most recent tokens and
the "heavy hitters", the tokens with the largest attention accumulated over all passes so far;
`heavy_fraction` of the budget goes to heavy hitters (the paper's default split is half and half).
Scores come from the model's exposed attention (`forward(..., return_attention=True)`)."""

from __future__ import annotations

import torch

from runtime.engines.eviction.base import EvictionPolicy


class HeavyHitters(EvictionPolicy):
    name = "h2o"
    needs_attention = True

    def __init__(self, budget_tokens: int | None = None, sinks: int = 4, heavy_fraction: float = 0.5) -> None:
        super().__init__(budget_tokens, sinks, heavy_fraction)
        assert self.budget is not None  # needs_budget: the base class refused None
        self.recent = max(1, self.budget - int(self.budget * self.heavy_fraction) - 1)
        self.scores: dict[int, float] = {}

    def observe(self, live: list[int], attention: torch.Tensor | None) -> None:
        if attention is None:
            return
        got = attention[torch.tensor(live, dtype=torch.long, device=attention.device)].tolist()
        for s, a in zip(live, got):
            self.scores[s] = self.scores.get(s, 0.0) + a

    def moved(self, old_to_new: dict[int, int]) -> None:
        self.scores = {old_to_new[s]: v for s, v in self.scores.items() if s in old_to_new}

    def forget(self) -> None:
        self.scores.clear()

    def select(self, live: list[int], dead: set[int]) -> list[int]:
        n = self.excess(live)
        if n == 0:
            return []
        older = live[: max(0, len(live) - self.recent)]
        out = sorted(older, key=lambda s: (self.scores.get(s, 0.0), s))[:n]
        if len(out) < n:  # the recent window alone is over budget: drop its oldest too
            rest = [s for s in live if s not in set(out)]
            out += rest[: n - len(out)]
        for s in out:
            self.scores.pop(s, None)
        return out
