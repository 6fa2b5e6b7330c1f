"""KV eviction policies for the `tip` engine: a two-hook base (`base.py`) and one short file each.

tip        learned: a step dies when the model reuses its thought register (no budget)
full       dense: nothing is evicted (no budget)
window     the most recent `budget_tokens` tokens
streaming  StreamingLLM: attention sinks + recent window
h2o        H2O: heavy hitters by accumulated attention + recent tokens
"""

from __future__ import annotations

from profiler.errors import UnknownName
from runtime.engines.eviction.base import EvictionPolicy
from runtime.engines.eviction.full import FullCache
from runtime.engines.eviction.h2o import HeavyHitters
from runtime.engines.eviction.registers import RegisterLiveness
from runtime.engines.eviction.streaming import StreamingLLM
from runtime.engines.eviction.window import RollingWindow

POLICIES: dict[str, type[EvictionPolicy]] = {
    "tip": RegisterLiveness,
    "full": FullCache,
    "window": RollingWindow,
    "streaming": StreamingLLM,
    "h2o": HeavyHitters,
}


def get_policy(name: str) -> type[EvictionPolicy]:
    if name not in POLICIES:
        raise UnknownName(f"unknown eviction policy {name!r}; valid policies: {', '.join(POLICIES)}")
    return POLICIES[name]


__all__ = ["POLICIES", "EvictionPolicy", "get_policy"]
