"""`full`: the dense cache. Nothing is ever evicted; dead thought steps stay visible."""

from __future__ import annotations

from runtime.engines.eviction.base import EvictionPolicy


class FullCache(EvictionPolicy):
    name = "full"
    needs_budget = False

    def select(self, live: list[int], dead: set[int]) -> list[int]:
        return []
