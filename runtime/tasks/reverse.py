"""`reverse_words`: reverse the letters of each of 3-5 comma-separated words.

Exact scorer with partial credit: the fraction of word positions answered exactly. Each word is
independent of the others, so later systems can decode them in parallel.
"""

from __future__ import annotations

import random
import string

from runtime.tasks.base import Example, Task


class ReverseWords(Task):
    name = "reverse_words"
    description = "reverse the letters of each comma-separated word"

    def __init__(self, min_words: int = 3, max_words: int = 5, min_len: int = 2, max_len: int = 6) -> None:
        self.min_words, self.max_words, self.min_len, self.max_len = min_words, max_words, min_len, max_len

    def sample(self, rng: random.Random) -> Example:
        words = [
            "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(self.min_len, self.max_len)))
            for _ in range(rng.randint(self.min_words, self.max_words))
        ]
        answer = ",".join(w[::-1] for w in words)
        return Example(prompt="reverse: " + ",".join(words), answer=answer, meta={"parts": [w[::-1] for w in words]})

    def score(self, example: Example, output: str) -> float:
        ref = example.answer.split(",")
        got = output.strip().split(",")
        hits = sum(a == b for a, b in zip(ref, got))
        return hits / max(len(ref), len(got))
