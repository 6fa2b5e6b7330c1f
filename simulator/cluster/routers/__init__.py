"""Routers: which replica serves an arriving request. One short file each, looked up by name."""

from profiler.errors import UnknownName
from simulator.cluster.routers.base import Router
from simulator.cluster.routers.kv_aware import KVAware
from simulator.cluster.routers.least_outstanding import LeastOutstanding
from simulator.cluster.routers.round_robin import RoundRobin

ROUTERS: dict[str, type[Router]] = {
    "round_robin": RoundRobin,
    "least_outstanding": LeastOutstanding,
    "kv_aware": KVAware,
}


def get_router(name: str) -> type[Router]:
    """Exact lookup; `KeyError` naming the valid routers."""
    try:
        return ROUTERS[name]
    except KeyError:
        raise UnknownName(f"unknown router {name!r}; valid names: {', '.join(sorted(ROUTERS))}") from None
