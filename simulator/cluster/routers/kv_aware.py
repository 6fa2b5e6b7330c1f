"""KV-aware: the replica whose KV pool is least committed, counting the blocks its running
requests' next passes hold and the blocks its queue's next passes will claim (llm-d's KV-utilisation scorer,
without prefix matching). Avoids the replica about to preempt even when request counts are equal."""

from __future__ import annotations

from simulator.cluster.routers.base import Router


class KVAware(Router):
    name = "kv_aware"

    def choose(self, request: int, replicas) -> int:
        def committed(r) -> float:
            running = int(r.next_tokens_and_blocks(list(r.running))[1].sum()) if r.running else 0
            queued = int(r.next_tokens_and_blocks(list(r.waiting))[1].sum()) if r.waiting else 0
            return (running + queued) / r.pool.capacity_blocks

        load = [committed(r) for r in replicas]
        return load.index(min(load))
