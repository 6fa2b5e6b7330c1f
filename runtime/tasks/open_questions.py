"""`open_questions`: open-ended questions for a real pretrained model (written for this project;
no data set is downloaded). Many ask for a short list ("three facts about ...", "four tips for
..."), the kind of answer Skeleton-of-Thought splits into independently written points; some do
not, so a skeleton that does not parse (and the sequential fallback) is exercised too.

There is no exact scorer for an open-ended answer: quality is not applicable, recorded as such in
the trace (`quality_applicable: false` with this task's note). What `bench/real_model.py` prints
beside a speedup is how the answer compares with the sequential answer of the same model (length
ratio, token overlap), labelled as such: a comparison, not a quality score.

Splits are fixed, not drawn: the questions sorted by a hash of their text, the first 20 are `test`,
the rest `train` (the dev split for choosing settings).
"""

from __future__ import annotations

import hashlib
import math
import random

from runtime.tasks.base import SPLITS, Example, Task

QUESTIONS: tuple[str, ...] = (
    "List three facts about the moon.",
    "Give four tips for learning a new language.",
    "What are three benefits of regular exercise?",
    "Name three ways to save energy at home.",
    "List three facts about honey bees.",
    "What are the main steps to plant a tree?",
    "Give three reasons to read books.",
    "List four things to pack for a camping trip.",
    "What are three ways to reduce stress?",
    "Describe three features of a good teacher.",
    "List three facts about the Pacific Ocean.",
    "Give three tips for writing a clear email.",
    "What are four healthy breakfast ideas?",
    "Name three inventions that changed the world.",
    "List three ways to keep a garden healthy.",
    "What are three advantages of public transport?",
    "Give four tips for a good night's sleep.",
    "List three facts about volcanoes.",
    "What are three ways to make a small room look bigger?",
    "Name three qualities of a good friend.",
    "List three causes of air pollution.",
    "Give three tips for saving money.",
    "What are four uses of water in daily life?",
    "List three facts about penguins.",
    "What are three ways to stay focused while studying?",
    "Give three reasons why trees are important.",
    "Name four common kitchen tools and what they do.",
    "List three steps to make a cup of tea.",
    "What are three benefits of learning to cook?",
    "Give three tips for a job interview.",
    "List three facts about the sun.",
    "What are three ways to help the environment?",
    "Name three popular sports and how they are played.",
    "List four tips for staying safe online.",
    "What are three reasons people keep pets?",
    "Why is the sky blue?",
    "How does a bicycle stay upright?",
    "What makes a city a good place to live?",
    "Explain how rain forms.",
    "What is the difference between weather and climate?",
)
TEST_SIZE = 20


def _rank(q: str) -> str:
    return hashlib.sha256(q.encode()).hexdigest()


def split_questions(split: str) -> list[str]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    ordered = sorted(QUESTIONS, key=_rank)
    return ordered[:TEST_SIZE] if split == "test" else ordered[TEST_SIZE:]


class OpenQuestions(Task):
    name = "open_questions"
    description = "open-ended questions (short lists, explanations) for a real pretrained model"
    scored = False
    default_max_tokens = 128  # no written answers to size it from (runtime/answer_length.py)
    quality_note = (
        "not applicable: open-ended questions have no exact scorer (task open_questions); "
        "bench/real_model.py compares answers with the sequential answer of the same model instead"
    )

    def sample(self, rng: random.Random) -> Example:
        return Example(prompt=rng.choice(QUESTIONS), answer="")

    def score(self, example: Example, output: str) -> float:
        return math.nan

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """`n` distinct questions of the fixed `split`, in an order drawn from `seed`."""
        pool = split_questions(split)
        if not 1 <= n <= len(pool):
            raise ValueError(f"task {self.name}: --n must be 1..{len(pool)} for the {split} split, got {n}")
        rng = random.Random(f"{self.name}:{seed}:{split}")
        return [Example(prompt=q, answer="") for q in rng.sample(pool, n)]
