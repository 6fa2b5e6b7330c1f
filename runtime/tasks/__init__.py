"""Tasks by name (plain string keys; each task family adds one line)."""

from __future__ import annotations

from runtime.registry import available, resolve
from runtime.tasks.base import Example, Task

TASKS: dict[str, str] = {
    "reverse_words": "runtime.tasks.reverse:ReverseWords",
    # parallel families (PASTA, Planned Diffusion)
    "word_facts": "runtime.tasks.parallel:WordFacts",
    "map_numbers": "runtime.tasks.parallel:MapNumbers",
    "list_stats": "runtime.tasks.parallel:ListStats",
    "copy_line": "runtime.tasks.parallel:CopyLine",  # no parallel structure
    # reasoning families (TIP)
    "nested_arith": "runtime.tasks.reasoning:NestedArith",
    "var_tracking": "runtime.tasks.reasoning:VarTracking",
    "tree_reduce": "runtime.tasks.reasoning:TreeReduce",
    # open-ended questions for real pretrained models (no exact scorer)
    "open_questions": "runtime.tasks.open_questions:OpenQuestions",
}


def get_task(name: str) -> Task:
    return resolve(TASKS, name, "task")()


def task_names() -> list[str]:
    return available(TASKS)


__all__ = ["TASKS", "Example", "Task", "get_task", "task_names"]
