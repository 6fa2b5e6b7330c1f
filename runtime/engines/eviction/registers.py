"""`tip`: learned eviction. A step dies when the model reuses its register; its tokens go at once
(and no budget applies: the model's own annotations decide the live set)."""

from __future__ import annotations

from runtime.engines.eviction.base import EvictionPolicy


class RegisterLiveness(EvictionPolicy):
    name = "tip"
    needs_budget = False

    def select(self, live: list[int], dead: set[int]) -> list[int]:
        return [s for s in live if s in dead]
