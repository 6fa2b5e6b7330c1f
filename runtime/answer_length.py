"""Default `max_tokens` of a capture: room for the longest answer of the task.

The bound comes from the task itself, not a fixed number: the longest answer over `SAMPLES`
training examples, in tokens with its `<eos>`. A reasoning task's answer is its worked solution
as TIP writes it (`runtime.lang.tip.annotate`: the steps with their register tags and the final
line, the longest form any system writes, since every token counts against TIP's `max_tokens`);
any other task's is its reference answer (PASTA counts content tokens only against `max_tokens`,
Planned Diffusion its autoregressive plan and text only, both at most that). The default is
`HEADROOM` times the longest (a model may write a little more than the reference: an extra tag,
a longer line), rounded up to a multiple of `ROUND_TO`.

    default_max_tokens("tree_reduce")   # 288 (longest worked solution 228 tokens)
    python -m runtime.answer_length [TASK ...]   # prints each task's longest answer and default
"""

from __future__ import annotations

import math
from functools import cache

from runtime.tasks import Example, get_task
from runtime.tokenizer import Tokenizer

SAMPLES = 1000
HEADROOM = 1.25
ROUND_TO = 32


def written_answer(ex: Example) -> str:
    """The longest text a system writes for `ex`: a worked solution with TIP's tags, else the answer."""
    if "steps" in ex.meta and "deps" in ex.meta:
        from runtime.lang.tip import DEFAULT_REGISTERS, annotate

        return annotate(ex.meta["steps"], ex.meta["deps"], DEFAULT_REGISTERS, ex.meta.get("final", "")).text
    return ex.answer


def answer_tokens(ex: Example, tok: Tokenizer) -> int:
    """Tokens of `ex`'s written answer, `<eos>` included."""
    return max(len(tok.encode(ex.answer)), len(tok.encode(written_answer(ex)))) + 1


@cache
def longest_answer_tokens(task: str, samples: int = SAMPLES, split: str = "train", seed: int = 0) -> int:
    """The longest written answer of `samples` examples of `task` (`split`, `seed`), in tokens."""
    tok = Tokenizer()
    return max(answer_tokens(ex, tok) for ex in get_task(task).examples(split, samples, seed))


def default_max_tokens(task: str) -> int:
    fixed = getattr(get_task(task), "default_max_tokens", None)  # a task with no written answers names its own
    if fixed:
        return int(fixed)
    return ROUND_TO * math.ceil(HEADROOM * longest_answer_tokens(task) / ROUND_TO)


def main(argv: list[str] | None = None) -> int:
    """`python -m runtime.answer_length [TASK ...]`: each task's longest written answer and its
    default `max_tokens` (every task without arguments)."""
    import argparse

    from runtime.tasks import task_names

    ap = argparse.ArgumentParser(
        prog="python -m runtime.answer_length", description=(main.__doc__ or "").splitlines()[0]
    )
    ap.add_argument("tasks", nargs="*", metavar="TASK", help="default: every task")
    tasks = ap.parse_args(argv).tasks or task_names()
    unknown = [t for t in tasks if t not in task_names()]
    if unknown:
        ap.error(f"unknown task {unknown[0]!r}; choose from {', '.join(task_names())}")
    for task in tasks:
        if getattr(get_task(task), "default_max_tokens", None):
            print(f"{task}: default max_tokens {default_max_tokens(task)} (the task's own: no written answers)")
            continue
        print(
            f"{task}: longest written answer {longest_answer_tokens(task)} tokens (<eos> included, of {SAMPLES} "
            f"training examples); default max_tokens {default_max_tokens(task)} ({HEADROOM} x that, rounded up to "
            f"a multiple of {ROUND_TO})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
