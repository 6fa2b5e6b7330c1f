"""The router base: one hook, `choose(request, replicas)`, called once per arrival.

A replica exposes what a router may read: `waiting` and `running` (request ids), `pool`
(`capacity_blocks`, `used_blocks`) and `next_tokens_and_blocks(ids)` (the query tokens and KV
blocks of each request's next pass). Ties go to the lowest replica index.
"""

from __future__ import annotations

from collections.abc import Sequence


class Router:
    name = "base"

    def choose(self, request: int, replicas: Sequence) -> int:
        """Index of the replica that serves `request`."""
        raise NotImplementedError
