"""The scheduler base: continuous batching with two policy hooks.

What: at every pass boundary the server (simulated or real) asks `schedule(state)` for the batch
of the next forward pass; `state` is any `scheduling.protocol.ServingState`. Iteration-level
scheduling as vLLM's (v1) scheduler does it (Orca, OSDI '22):

1. Running requests first, in admission order, each taking its next pass's query tokens from the
   batched-token budget (`max_batch_tokens`). Passes that cannot be cut (decodes, PASTA thread
   passes, diffusion denoise steps) run whole, wherever they stand in that order; when chunked
   prefill is on (vLLM's default) a prompt prefill (or a recompute's re-prefill) is cut to what
   they and the prefills before it leave of the budget, so the batch keeps to the budget unless
   the uncuttable passes alone exceed it; a running request whose prefill gets no budget sits
   this pass out.
2. While the pages the running requests hold after their passes exceed the pool, a victim (policy
   hook) is preempted: its pages are freed and it goes back to the front of the queue; when
   readmitted it recomputes the KV of its tokens so far in one re-prefill (vLLM's RECOMPUTE).
3. Waiting requests are admitted in policy order (hook) while the sequence cap, the token budget
   and the free pages allow, stopping at the first that does not fit (no skipping, as vLLM).
   Admission counts what a real server knows, the pages the request's next pass needs
   (`reserve="current"`, vLLM); `reserve="peak"` instead keeps every admitted request's peak
   pages reserved (`peak_blocks_of`), so nothing is ever preempted, at the price of fewer
   requests in the batch.

A policy is a subclass that overrides one or both hooks (`order`, `victim`) in its own short file,
listed in `SCHEDULERS` (scheduling/__init__.py). Hooks read only the protocol's members; only a
scheduler built with `oracle=True` may read `remaining_passes`.
"""

from __future__ import annotations

import numpy as np

from profiler.errors import UsageError
from scheduling.protocol import ServingState

RESERVE_MODES = ("current", "peak")


class Scheduler:
    name = "base"

    def __init__(
        self,
        max_seqs: int,
        max_batch_tokens: int,
        *,
        chunked_prefill: bool = True,
        reserve: str = "current",
        oracle: bool = False,
    ) -> None:
        if reserve not in RESERVE_MODES:
            raise UsageError(f"reserve must be one of {', '.join(RESERVE_MODES)}, got {reserve!r}")
        self.max_seqs = max_seqs
        self.max_batch_tokens = max_batch_tokens
        self.chunked_prefill = chunked_prefill
        self.reserve = reserve
        self.oracle = oracle

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

    def _running_pass(self, state: ServingState) -> tuple[dict[int, int], int, int]:
        """Token allotment of every running request under the budget: (batch, tokens left, blocks after)."""
        running = list(state.running)
        if not running:
            return {}, self.max_batch_tokens, 0
        full, blocks = state.next_tokens_and_blocks(running)
        whole = np.asarray(full, np.int64).tolist()  # Python ints (numpy scalars are slow one by one)
        take = list(whole)
        if self.chunked_prefill and sum(take) > self.max_batch_tokens:  # cut prefills, in running order
            fixed = state.next_tokens_and_blocks(running, [0] * len(running))[0].tolist()  # not cuttable
            # the passes no budget can cut run whole: the prefills share what they leave
            budget = self.max_batch_tokens - sum(f for f, z in zip(take, fixed) if z == f)
            for i, (f, z) in enumerate(zip(take, fixed)):
                if z != f:
                    take[i] = min(f, max(budget, 0))
                    budget -= take[i]
            _, blocks = state.next_tokens_and_blocks(running, take)
        # a prefill cut to nothing sits this pass out; a pass with no rows of its own (a sync) still runs
        batch = {r: t for r, t, f in zip(running, take, whole) if t > 0 or f == 0}
        return batch, self.max_batch_tokens - sum(take), int(np.asarray(blocks).sum())

    def schedule(self, state: ServingState) -> dict[int, int]:
        """Preempt until the next pass fits, admit while caps allow.

        Returns the batch: request id -> query tokens it runs this pass (less than its whole next
        pass only for a chunk of a prefill), running requests first, in `state.running` order."""
        cap = state.pool_capacity_blocks
        while True:
            batch, budget, used = self._running_pass(state)
            if used <= cap or not state.running:
                break
            state.preempt(self.victim(list(state.running), state))
        if self.reserve == "peak":
            used = int(state.peak_blocks_of(state.running).sum()) if state.running else 0
        for r in self.order(list(state.waiting), state):
            if len(state.running) >= self.max_seqs:
                break
            limit = [max(budget, 0)] if self.chunked_prefill else None
            (q,), (blocks,) = state.next_tokens_and_blocks([r], limit)
            if self.reserve == "peak":
                (blocks,) = state.peak_blocks_of([r])
            if used + blocks > cap:
                break
            if state.running and (q == 0 or q > budget):  # an empty batch takes anything
                break
            state.admit(r)
            batch[r] = int(q)
            budget -= int(q)
            used += int(blocks)
        return batch
