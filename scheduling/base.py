"""The scheduler base: continuous batching with two policy hooks.

What: at every pass boundary the server (simulated or real) asks `schedule(state)` for the batch
of the next forward pass; `state` is any `scheduling.protocol.ServingState`. Iteration-level
scheduling (Orca, OSDI '22; vLLM's scheduler): running requests stay in the batch; while the KV
their next pass needs does not fit the pool, a victim is preempted (its pages freed, it goes back
to the front of the queue and recomputes its KV when readmitted, vLLM's RECOMPUTE mode); then
waiting requests are admitted in policy order while the sequence cap, the batched-token cap and
the free pages allow, stopping at the first that does not fit (no skipping, as vLLM). Prefills
and decodes share a pass; prefills are not chunked.

A policy is a subclass that overrides one or both hooks (`order`, `victim`) in its own short file,
listed in `SCHEDULERS` (scheduling/__init__.py). The hooks read only the protocol's members.
"""

from __future__ import annotations

from scheduling.protocol import ServingState


class Scheduler:
    name = "base"

    def __init__(self, max_seqs: int, max_batch_tokens: int) -> None:
        self.max_seqs = max_seqs
        self.max_batch_tokens = max_batch_tokens

    # ---- the two hooks -----------------------------------------------------------------
    def order(self, waiting: list[int], state: ServingState) -> list[int]:
        """The order in which waiting requests are considered for admission."""
        return waiting

    def victim(self, running: list[int], state: ServingState) -> int:
        """The running request to preempt when the KV pool cannot hold the next pass."""
        return running[-1]

    # ---- the loop ----------------------------------------------------------------------
    def head(self, state: ServingState) -> int | None:
        """The waiting request that would be admitted next, if anything frees up."""
        return self.order(list(state.waiting), state)[0] if state.waiting else None

    def schedule(self, state: ServingState) -> list[int]:
        """Preempt until the next pass fits, admit while caps allow; return the batch."""
        cap = state.pool_capacity_blocks
        while state.running:
            q, blocks = state.next_tokens_and_blocks(state.running)
            if blocks.sum() <= cap:
                break
            state.preempt(self.victim(list(state.running), state))
        tokens, used = (int(x.sum()) for x in state.next_tokens_and_blocks(state.running))
        for r in self.order(list(state.waiting), state):
            (q,), (blocks,) = state.next_tokens_and_blocks([r])
            if len(state.running) >= self.max_seqs or used + blocks > cap:
                break
            if state.running and tokens + q > self.max_batch_tokens:  # an empty batch takes anything
                break
            state.admit(r)
            tokens += int(q)
            used += int(blocks)
        return state.running
