"""Task interface: prompts with exact scorers, fixed train / held-out splits from a seed.

A split is decided by a hash of the prompt, never by generation order, so train and test can
never share a prompt whatever `n` and `seed` are asked for.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from profiler.errors import UsageError

SPLITS = ("train", "test")
MAX_EXAMPLES = 100_000  # more than any run here uses (training draws 20,000); drawing stays seconds
STALL = 20_000  # draws in a row without a new prompt of the split: the split is used up


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

    def sample(self, rng: random.Random) -> Example:
        raise NotImplementedError

    def score(self, example: Example, output: str) -> float:
        raise NotImplementedError

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """`n` distinct examples of `split`, deterministic from `seed`.

        A UsageError, before memory grows, when `n` is beyond MAX_EXAMPLES or beyond what the task
        can draw (STALL draws in a row found nothing new: its prompts of this split are used up)."""
        if split not in SPLITS:
            raise UsageError(f"split must be one of {SPLITS}, got {split!r}")
        if not 0 <= n <= MAX_EXAMPLES:
            raise UsageError(f"task {self.name}: asked for {n} examples; at most {MAX_EXAMPLES} can be drawn")
        rng = random.Random(f"{self.name}:{seed}:{split}")
        out: list[Example] = []
        seen: set[str] = set()
        since_new = 0
        for _ in range(200 * n + 1000):
            ex = self.sample(rng)
            since_new += 1
            if ex.prompt in seen or split_of(ex.prompt) != split:
                if since_new > STALL:
                    break
                continue
            since_new = 0
            seen.add(ex.prompt)
            out.append(ex)
            if len(out) == n:
                return out
        raise UsageError(f"task {self.name}: could draw only {len(out)} distinct {split} examples, not {n}")
