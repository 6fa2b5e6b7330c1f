"""Task interface: prompts with exact scorers, fixed train / held-out splits from a seed.

A split is decided by a hash of the prompt, never by generation order, so train and test can
never share a prompt whatever `n` and `seed` are asked for.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, hash=False, compare=False)


def split_of(prompt: str, test_percent: int = 10) -> str:
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
    return "test" if h % 100 < test_percent else "train"


class Task:
    """Subclasses implement `sample(rng) -> Example` and `score(example, output) -> float`."""

    name = "task"
    description = ""
    scored = True  # False: no exact scorer (open-ended answers); quality is recorded as not applicable
    quality_note = ""  # why, when not scored

    def sample(self, rng: random.Random) -> Example:
        raise NotImplementedError

    def score(self, example: Example, output: str) -> float:
        raise NotImplementedError

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """`n` distinct examples of `split`, deterministic from `seed`."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        rng = random.Random(f"{self.name}:{seed}:{split}")
        out: list[Example] = []
        seen: set[str] = set()
        for _ in range(200 * n + 1000):
            ex = self.sample(rng)
            if ex.prompt in seen or split_of(ex.prompt) != split:
                continue
            seen.add(ex.prompt)
            out.append(ex)
            if len(out) == n:
                return out
        raise RuntimeError(f"task {self.name}: could not draw {n} distinct {split} examples")
