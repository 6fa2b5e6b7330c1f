"""Task families with real independence (PASTA, Planned Diffusion) and one without any.

Each parallel family's answer is 3-4 independent *parts* (one line each, ~15-30 tokens) and a
short *closing* line that depends on all of them, so a parallel decoder must wait (`<sync/>`)
before writing it. `copy_line` has no parallel structure: the model must learn not to fork.

Every example's `meta` carries its dependence structure, independent of any annotation language:

    meta = {"parts": ["<line>\\n", ...],   # independent parts, in answer order
            "topics": ["c", ...],          # a 1-3 byte label per part (distinct within an example)
            "closing": "<line>"}           # depends on every part; answer == "".join(parts) + closing

Scorers are exact with partial credit: the fraction of answer lines reproduced exactly (position
by position, divided by the longer of reference and output), so a missing or extra part costs
one line.
"""

from __future__ import annotations

import random
import string

from runtime.tasks.base import Example, Task

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def line_score(reference: str, output: str) -> float:
    ref = reference.strip("\n").split("\n")
    got = output.strip("\n").split("\n")
    hits = sum(a == b for a, b in zip(ref, got))
    return hits / max(len(ref), len(got))


def structured(prompt: str, parts: list[str], topics: list[str], closing: str) -> Example:
    parts = [p + "\n" for p in parts]
    return Example(
        prompt=prompt, answer="".join(parts) + closing, meta={"parts": parts, "topics": topics, "closing": closing}
    )


class LineTask(Task):
    min_items, max_items = 3, 4

    def score(self, example: Example, output: str) -> float:
        return line_score(example.answer, output)

    def n_items(self, rng: random.Random) -> int:
        return rng.randint(self.min_items, self.max_items)


class WordFacts(LineTask):
    """`facts: cat,dog` -> one line per word (`cat up CAT rev tac len 3`), then the initials."""

    name = "word_facts"
    description = "describe each word (upper case, reversed, length), then list the initials"

    def sample(self, rng: random.Random) -> Example:
        initials = rng.sample(string.ascii_lowercase, self.n_items(rng))
        words = [c + "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 4))) for c in initials]
        parts = [f"{w} up {w.upper()} rev {w[::-1]} len {len(w)}" for w in words]
        return structured("facts: " + ",".join(words), parts, initials, "ini " + "".join(initials).upper())


class MapNumbers(LineTask):
    """`spell: 47,305` -> one line per number (`47 is four seven`), then the largest."""

    name = "map_numbers"
    description = "spell each number digit by digit, then give the largest"

    def sample(self, rng: random.Random) -> Example:
        leads = rng.sample("123456789", self.n_items(rng))
        nums = [lead + "".join(rng.choice(string.digits) for _ in range(rng.randint(2, 3))) for lead in leads]
        parts = [f"{x} is " + " ".join(DIGIT_WORDS[int(d)] for d in x) for x in nums]
        return structured("spell: " + ",".join(nums), parts, leads, f"max {max(nums, key=int)}")


class ListStats(LineTask):
    """`stats: a=381;b=52` -> one line per list (`a min 1 max 8 rev 183`), then the overall max."""

    name = "list_stats"
    description = "give min, max and the reversed digits of each list, then the overall max"

    def sample(self, rng: random.Random) -> Example:
        names = list("abcd"[: self.n_items(rng)])
        lists = ["".join(rng.choice(string.digits) for _ in range(rng.randint(3, 5))) for _ in names]
        parts = [f"{n} min {min(x)} max {max(x)} rev {x[::-1]}" for n, x in zip(names, lists)]
        closing = f"max {max(max(x) for x in lists)}"
        return structured("stats: " + ";".join(f"{n}={x}" for n, x in zip(names, lists)), parts, names, closing)


class CopyLine(LineTask):
    """`copy: ab qrs t` -> `ab qrs t`. No parallel structure: one dependent line."""

    name = "copy_line"
    description = "copy a line of words (no parallel structure)"

    def sample(self, rng: random.Random) -> Example:
        words = [
            "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 5)))
            for _ in range(rng.randint(4, 6))
        ]
        text = " ".join(words)
        return Example(prompt="copy: " + text, answer=text, meta={"parts": [], "topics": [], "closing": text})


PARALLEL_TASKS = ("word_facts", "map_numbers", "list_stats")
ALL_TASKS = (*PARALLEL_TASKS, "copy_line")
