"""The eviction-policy interface: two hooks, called by the `tip` engine around every forward pass.

- `observe(live, attention)`: after a pass, with the attention each slot received (summed over
  layers, heads and query rows; only computed when `needs_attention`). H2O accumulates it.
- `select(live, dead)`: before the next pass, which slots to make invisible (and free). `live` is
  every visible slot, oldest first (the prompt's first); `dead` is the subset whose thought step a
  register reuse declared dead. A budgeted policy leaves room for the next token: at most
  `budget_tokens - 1` slots stay, so no decode pass attends to more than `budget_tokens` (a prompt
  longer than the budget is prefilled whole, then cut).

Slot-keyed state a policy keeps (H2O's scores) follows two more hooks: `moved(old_to_new)` when a
readmitted request's slots are renumbered, `forget()` when its prefill starts over.

The engine frees what `select` returns through the KV store, so every policy pays the same page
granularity: a page is released only when all of its slots are gone.
"""

from __future__ import annotations

import torch


class EvictionPolicy:
    name = "base"
    needs_attention = False
    needs_budget = True  # False: the policy refuses a budget (it decides by itself what dies)

    def __init__(self, budget_tokens: int | None = None, sinks: int = 4, heavy_fraction: float = 0.5) -> None:
        if self.needs_budget and budget_tokens is None:
            raise ValueError(
                f"policy {self.name!r} needs a KV budget: pass budget_tokens=N (e.g. --knob budget_tokens=48)"
            )
        if not self.needs_budget and budget_tokens is not None:
            raise ValueError(
                f"policy {self.name!r} takes no budget (got budget_tokens={budget_tokens}); "
                f"use window, streaming or h2o for a fixed budget"
            )
        if budget_tokens is not None and int(budget_tokens) < 2:
            raise ValueError(f"budget_tokens must be >= 2, got {budget_tokens}")
        if sinks < 0 or not 0.0 <= heavy_fraction < 1.0:
            raise ValueError(f"need sinks >= 0 and 0 <= heavy_fraction < 1, got {sinks}, {heavy_fraction}")
        self.budget = None if budget_tokens is None else int(budget_tokens)
        self.sinks, self.heavy_fraction = int(sinks), float(heavy_fraction)

    def excess(self, live: list[int]) -> int:
        """Slots to drop so that the next token fits in the budget."""
        return 0 if self.budget is None else max(0, len(live) + 1 - self.budget)

    def observe(self, live: list[int], attention: torch.Tensor | None) -> None:
        pass

    def moved(self, old_to_new: dict[int, int]) -> None:
        """The request's slots were renumbered (readmitted after a preemption)."""

    def forget(self) -> None:
        """The prefill starts over (preempted between its chunks): nothing observed so far holds."""

    def select(self, live: list[int], dead: set[int]) -> list[int]:
        raise NotImplementedError
