"""Held-out quality of a model under a system's engine (greedy), per task."""

from __future__ import annotations

from runtime.engines import GenerationConfig, Request, get_engine
from runtime.model import TinyLM
from runtime.tasks import get_task
from runtime.tokenizer import Tokenizer


def evaluate(
    model: TinyLM, tok: Tokenizer, system: str, tasks: tuple[str, ...], n: int, max_tokens: int, seed: int = 0, **knobs
) -> dict[str, float]:
    engine = get_engine(system)(model, tok, GenerationConfig(max_tokens=max_tokens), **knobs)
    out: dict[str, float] = {}
    for name in tasks:
        task = get_task(name)
        exs = task.examples("test", n, seed)
        out[name] = sum(task.score(ex, engine.generate(Request(i, ex.prompt)).text) for i, ex in enumerate(exs)) / len(
            exs
        )
    return out
