"""Shortest job first, ranked by what a server knows at arrival: the request's `max_tokens`, then
its prompt length (ties: arrival order). With `oracle=True` (a simulator what-if, the upper bound
of any length predictor) it ranks by the forward passes each request has left. Admits the
shortest waiting job first and preempts the longest running one. Lowers mean latency, may starve
long requests under sustained load.

A length predictor plugs in as a subclass overriding `size`."""

from __future__ import annotations

import numpy as np

from scheduling.base import Scheduler


class SJF(Scheduler):
    name = "sjf"

    def size(self, ids: list[int], state) -> list[tuple]:
        """Sort key per request: smaller runs first."""
        if self.oracle:
            return [(int(x),) for x in state.remaining_passes(ids)]
        m, p = np.asarray(state.max_tokens_of(ids)), np.asarray(state.prompt_tokens_of(ids))
        return list(zip(m.tolist(), p.tolist()))

    def order(self, waiting: list[int], state) -> list[int]:
        key = self.size(waiting, state)
        return [waiting[i] for i in sorted(range(len(waiting)), key=lambda i: (key[i], i))]

    def victim(self, running: list[int], state) -> int:
        key = self.size(running, state)
        return running[max(range(len(running)), key=lambda i: (key[i], i))]
