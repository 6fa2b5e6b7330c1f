"""What a scheduler may see and do: the small protocol both clocks implement.

What: `ServingState` is the view of one server's queue that `scheduling.Scheduler` reads and
changes at every pass boundary. The SimPy replay (`simulator.replay.Replay`, simulated clock)
and the batched runtime (`runtime.server`, wall clock) both implement it, so the one policy code
in this package forms every batch on both sides; neither imports the other.

Requests are named by integer ids (the implementer's own numbering). Arrays are numpy arrays
aligned with the ids passed in. Nothing here says how a pass is timed or run.

Members a policy may always read (what a real server knows when it schedules):
`running`, `waiting`, `pool_capacity_blocks`, `next_tokens_and_blocks`, `peak_blocks_of`,
`arrival_of`, `prompt_tokens_of`, `max_tokens_of`. `remaining_passes` is the future: only an
oracle policy (SJF with `oracle=True`, a simulator-only what-if) may call it.

What the server does with the scheduler's answer (`Scheduler.schedule(state)` returns
{id: query tokens}): it runs one forward pass holding those requests' rows; a request given fewer
tokens than its whole next pass runs that many prompt tokens of its prefill (a chunk) and emits
nothing; a request readmitted after `preempt` first re-prefills its tokens so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class ServingState(Protocol):
    """One server's queue and KV pool, as a scheduler sees it."""

    running: list[int]
    """Ids in the batch, in admission order (the scheduler appends by `admit`, removes by `preempt`;
    the server removes finished ones)."""

    waiting: Sequence[int]
    """Ids arrived and not running, in queue order: arrivals at the back, preempted at the front."""

    @property
    def pool_capacity_blocks(self) -> int:
        """KV pages (blocks of the server's block size) the whole shared pool holds."""
        ...

    def next_tokens_and_blocks(
        self, ids: Sequence[int], limit: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(query tokens, KV blocks held after it) of each request's next forward pass.

        Query tokens: the rows the pass computes for that request (a prompt prefill: what is left
        of the prompt; a decode: 1 per stream; a denoise step: its span; after a preemption: the
        re-prefill of its tokens so far plus that pass). Blocks: the pages the request holds once
        that pass has written its KV (a waiting request holds none before it).

        `limit` (one per id): cut a prefill or a re-prefill (never another pass) to at most that
        many tokens, a chunk; blocks are then those held after the chunk."""
        ...

    def peak_blocks_of(self, ids: Sequence[int]) -> np.ndarray:
        """The most pages each request may hold at once over its life, as the server bounds it
        (prompt + max_tokens for a real server); read only under `reserve="peak"`."""
        ...

    def admit(self, rid: int) -> None:
        """Move `rid` from `waiting` to the end of `running`; its next pass is in the next batch."""
        ...

    def preempt(self, rid: int) -> None:
        """Move `rid` from `running` to the front of `waiting` and free its pages; when readmitted
        it recomputes the KV of its tokens so far (vLLM's RECOMPUTE)."""
        ...

    def arrival_of(self, ids: Sequence[int]) -> np.ndarray:
        """Arrival time of each request, seconds on the implementer's clock (FCFS order, ties)."""
        ...

    def prompt_tokens_of(self, ids: Sequence[int]) -> np.ndarray:
        """Prompt length of each request in tokens (known at arrival)."""
        ...

    def max_tokens_of(self, ids: Sequence[int]) -> np.ndarray:
        """The request's max_tokens setting (an upper bound on its output, known at arrival)."""
        ...

    def remaining_passes(self, ids: Sequence[int]) -> np.ndarray:
        """Forward passes each request has left. The future: read only by oracle policies."""
        ...
