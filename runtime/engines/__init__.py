"""Engines by name (plain string keys; each system adds one line)."""

from __future__ import annotations

from runtime.engines.base import Completion, Engine, GenerationConfig, Request, Step, TokenRecord, drain
from runtime.engines.sequential import SequentialEngine
from runtime.registry import available, resolve

ENGINES: dict[str, str] = {
    "sequential": "runtime.engines.sequential:SequentialEngine",
    "pasta": "runtime.engines.pasta:PastaEngine",
    "skeleton": "runtime.engines.skeleton:SkeletonEngine",
    "tip": "runtime.engines.tip:TipEngine",
    "planned_diffusion": "runtime.engines.planned_diffusion:PlannedDiffusionEngine",
    "masked_diffusion": "runtime.engines.masked_diffusion:MaskedDiffusionEngine",
    "sot": "runtime.engines.sot:SotEngine",  # prompted Skeleton-of-Thought on a real chat model
}


def get_engine(name: str) -> type[Engine]:
    return resolve(ENGINES, name, "system")


def systems() -> list[str]:
    return available(ENGINES)


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
