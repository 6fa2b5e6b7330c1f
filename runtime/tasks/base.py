"""Task interface: prompts with exact scorers, fixed train / dev / test splits from a seed.

A split is decided by a hash of the prompt, never by generation order, so no two splits can share
a prompt whatever `n` and `seed` are asked for. 10% of prompts are held out from training; one
tenth of those (1% of all) is the `dev` split, where benchmarks choose settings (and the shipped
defaults come from), and the other nine tenths the `test` split they report on.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from profiler.errors import UsageError

SPLITS = ("train", "dev", "test")
MAX_EXAMPLES = 100_000  # more than any run here uses (training draws 20,000); drawing stays seconds
STALL = 20_000  # draws in a row without a new prompt of the split: the split is used up


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, hash=False, compare=False)


def split_of(prompt: str, held_out_percent: int = 10, dev_percent: int = 1) -> str:
    """`train`, `dev` or `test`: the held-out bucket (never trained on) is split into dev and test."""
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big") % 100
    if h >= held_out_percent:
        return "train"
    return "dev" if h >= held_out_percent - dev_percent else "test"


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
        """`n` distinct examples of `split`, deterministic from `seed` (none for `n` 0).

        A UsageError, before memory grows, when `n` is beyond MAX_EXAMPLES or beyond what the task
        can draw (STALL draws in a row found nothing new: its prompts of this split are used up)."""
        if split not in SPLITS:
            raise UsageError(f"split must be one of {SPLITS}, got {split!r}")
        if not 0 <= n <= MAX_EXAMPLES:
            raise UsageError(f"task {self.name}: asked for {n} examples; at most {MAX_EXAMPLES} can be drawn")
        if n == 0:  # was: drew until the split ran out, then "could draw only 98 ..., not 0"
            return []
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
