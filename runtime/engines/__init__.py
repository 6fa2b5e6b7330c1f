"""Engines by name: the table is runtime.options.ENGINES (importable without torch); `get_engine` resolves a name to its class."""

from __future__ import annotations

from runtime.engines.base import Completion, Engine, GenerationConfig, Request, Step, TokenRecord, drain
from runtime.engines.sequential import SequentialEngine
from runtime.options import ENGINES, systems
from runtime.registry import resolve


def get_engine(name: str) -> type[Engine]:
    return resolve(ENGINES, name, "system")


__all__ = [
    "ENGINES",
    "Completion",
    "Engine",
    "GenerationConfig",
    "Request",
    "SequentialEngine",
    "Step",
    "TokenRecord",
    "drain",
    "get_engine",
    "systems",
]
