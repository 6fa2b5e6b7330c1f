"""The scheduler base: continuous batching with two policy hooks.

What: at every pass boundary the replay asks `schedule(sim)` for the batch of the next forward
pass. Iteration-level scheduling (Orca, OSDI '22; vLLM's scheduler): running requests stay in the
batch; while the KV their next pass needs does not fit the pool, a victim is preempted (its pages
freed, it goes back to the front of the queue and recomputes its KV when readmitted, vLLM's
RECOMPUTE mode); then waiting requests are admitted in policy order while the sequence cap, the
batched-token cap and the free pages allow, stopping at the first that does not fit (no
skipping, as vLLM). Prefills and decodes share a pass; prefills are not chunked.

A policy is a subclass that overrides one or both hooks (`order`, `victim`) in its own short file,
listed in `SCHEDULERS` (simulator/schedulers/__init__.py). The hooks see the replay `sim`, whose
arrays (`arrival_s`, `remaining_passes()`) say what a policy may want to know.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from simulator.replay import Replay


class Scheduler:
    name = "base"

    def __init__(self, max_seqs: int, max_batch_tokens: int) -> None:
        self.max_seqs = max_seqs
        self.max_batch_tokens = max_batch_tokens

    # ---- the two hooks -----------------------------------------------------------------
    def order(self, waiting: list[int], sim: Replay) -> list[int]:
        """The order in which waiting requests are considered for admission."""
        return waiting

    def victim(self, running: list[int], sim: Replay) -> int:
        """The running request to preempt when the KV pool cannot hold the next pass."""
        return running[-1]

    # ---- the loop ----------------------------------------------------------------------
    def head(self, sim: Replay) -> int | None:
        """The waiting request that would be admitted next, if anything frees up."""
        return self.order(list(sim.waiting), sim)[0] if sim.waiting else None

    def schedule(self, sim: Replay) -> list[int]:
        """Preempt until the next pass fits, admit while caps allow; return the batch."""
        pool = sim.pool
        while sim.running:
            q, blocks = sim.next_tokens_and_blocks(sim.running)
            if blocks.sum() <= pool.capacity_blocks:
                break
            sim.preempt(self.victim(list(sim.running), sim))
        tokens, used = (int(x.sum()) for x in sim.next_tokens_and_blocks(sim.running))
        for r in self.order(list(sim.waiting), sim):
            (q,), (blocks,) = sim.next_tokens_and_blocks([r])
            if len(sim.running) >= self.max_seqs or used + blocks > pool.capacity_blocks:
                break
            if sim.running and tokens + q > self.max_batch_tokens:  # an empty batch takes anything
                break
            sim.admit(r)
            tokens += int(q)
            used += int(blocks)
        return sim.running
