"""Training recipes by system: how task examples become `TrainSeq`s, and the shipped defaults.

`sequential`: prompt and plain answer, causal mask, plain positions; loss on the answer.
Later systems add their recipes here (annotated targets, their own masks and positions).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.registry import resolve
from runtime.tasks import Example, get_task
from runtime.tokenizer import Tokenizer
from runtime.train.sft import IGNORE, TrainConfig, TrainSeq


def causal_seq(tok: Tokenizer, prompt: str, answer_ids: list[int]) -> TrainSeq:
    """bos prompt <sep> answer <eos>, loss on every answer token and the <eos>."""
    prefix = [tok.bos_id, *tok.encode(prompt), tok.token_id("<sep>")]
    ids = prefix + answer_ids + [tok.eos_id]
    targets = [IGNORE] * (len(prefix) - 1) + answer_ids + [tok.eos_id] + [IGNORE]
    return TrainSeq(ids=ids, positions=list(range(len(ids))), targets=targets)


@dataclass
class Recipe:
    system: str
    tasks: tuple[str, ...]
    preset: str
    train: TrainConfig
    # (tokenizer, example, task name) -> sequence; None for a recipe that overrides `sampler` (PD)
    build: Callable[[Tokenizer, Example, str], TrainSeq] | None = None
    train_examples: int = 20000
    eval_examples: int = 64
    max_tokens: int = 64
    extra: dict = field(default_factory=dict)

    def sampler(self, tok: Tokenizer, seed: int) -> Callable[[random.Random, int], list[TrainSeq]]:
        pools = {t: get_task(t).examples("train", self.train_examples // len(self.tasks), seed) for t in self.tasks}
        flat = [(t, ex) for t, exs in pools.items() for ex in exs]
        build = self.build
        if build is None:
            raise TypeError(f"the {self.system} recipe has no per-example builder and does not override sampler()")

        def sample(rng: random.Random, n: int) -> list[TrainSeq]:
            return [build(tok, ex, t) for t, ex in (rng.choice(flat) for _ in range(n))]

        return sample


def _plain(tok: Tokenizer, ex: Example, task: str) -> TrainSeq:
    return causal_seq(tok, ex.prompt, tok.encode(ex.answer))


SEQUENTIAL = Recipe(
    "sequential", ("reverse_words",), "tiny-4l", TrainConfig(steps=1200, batch_size=64, lr=3e-3), _plain
)

# system -> "module:Recipe object"; each system adds one line
RECIPES: dict[str, str] = {
    "sequential": "runtime.train.recipes:SEQUENTIAL",
    "pasta": "runtime.train.pasta:RECIPE",
    "tip": "runtime.train.tip:RECIPE",
    "planned_diffusion": "runtime.train.planned_diffusion:RECIPE",
}


def get_recipe(system: str) -> Recipe:
    return resolve(RECIPES, system, "training recipe")
