"""Least outstanding requests (Envoy's LEAST_REQUEST, vLLM production-stack's session-less
default): the replica with the fewest requests waiting or running."""

from __future__ import annotations

from simulator.cluster.routers.base import Router


class LeastOutstanding(Router):
    name = "least_outstanding"

    def choose(self, request: int, replicas) -> int:
        load = [len(r.waiting) + len(r.running) for r in replicas]
        return load.index(min(load))
