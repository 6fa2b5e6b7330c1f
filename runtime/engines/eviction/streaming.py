"""`streaming`: StreamingLLM (Xiao et al., arXiv 2309.17453): keep the first `sinks` tokens (the
attention sinks) and a window of the most recent ones; evict the oldest in between."""

from __future__ import annotations

from runtime.engines.eviction.base import EvictionPolicy


class StreamingLLM(EvictionPolicy):
    name = "streaming"

    def __init__(self, budget_tokens: int | None = None, sinks: int = 4, heavy_fraction: float = 0.5) -> None:
        super().__init__(budget_tokens, sinks, heavy_fraction)
        if self.budget is not None and self.budget <= self.sinks + 1:
            raise ValueError(f"streaming needs budget_tokens > sinks + 1 ({self.sinks + 1}), got {self.budget}")

    def select(self, live: list[int], dead: set[int]) -> list[int]:
        return live[self.sinks : self.sinks + self.excess(live)]
