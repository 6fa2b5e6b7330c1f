"""Shortest job first: admit the waiting request with the fewest forward passes left; preempt
the running one with the most left (ties: arrival order). Lowers mean latency, may starve long
requests under sustained load."""

from __future__ import annotations

from scheduling.base import Scheduler


class SJF(Scheduler):
    name = "sjf"

    def order(self, waiting: list[int], state) -> list[int]:
        left = state.remaining_passes(waiting)
        return [waiting[i] for i in sorted(range(len(waiting)), key=lambda i: (left[i], i))]

    def victim(self, running: list[int], state) -> int:
        left = state.remaining_passes(running)
        return running[max(range(len(running)), key=lambda i: (left[i], i))]
