"""Round robin: replica 0, 1, ..., K - 1, 0, ... in arrival order, blind to load."""

from __future__ import annotations

from simulator.cluster.routers.base import Router


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self) -> None:
        self.next = 0

    def choose(self, request: int, replicas) -> int:
        chosen = self.next % len(replicas)
        self.next += 1
        return chosen
