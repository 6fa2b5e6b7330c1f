"""`window`: a plain rolling window over the most recent `budget_tokens` tokens (prompt included)."""

from __future__ import annotations

from runtime.engines.eviction.base import EvictionPolicy


class RollingWindow(EvictionPolicy):
    name = "window"

    def select(self, live: list[int], dead: set[int]) -> list[int]:
        return live[: self.excess(live)]
