"""Reasoning tasks for TIP: multi-step problems whose worked solutions are chains of short steps,
each step reading a few earlier ones, most of them dead long before the answer.

Each example's `meta` carries the worked solution as the annotation generator needs it:
`steps` (step texts, no register tags), `deps` (for each step, the earlier steps it reads; the
prompt is always readable) and `final` (the answer line, which reads the last step). All
arithmetic is mod 10, so every value is one digit and every step of a family has one length.

- `var_tracking`: two variables updated in turn for 11-15 steps. Prompt `a3 b5 +- N` means
  a=3, b=5; repeat a = a+b, b = b-a (mod 10), steps lettered A, B, ... up to N. Step `C:8-1=7`
  (step C updates a: old a 8, minus the current b 1). Each step reads the two before it and is
  dead two steps later, so with a short prompt the dead steps are most of the KV.
- `nested_arith`: a full binary expression tree of depth 3 over digits, evaluated bottom-up in
  post-order (`((3+4)*(2+5))-((6*1)+(8-2))` -> steps `3+4=7`, `2+5=7`, `7*7=9`, ...). A genuine
  DAG: leaf steps die as soon as their parent is computed; three results are pending at once.

- `tree_reduce`: a sequence from a recurrence, reduced pairwise in a balanced tree as soon as
  each pair is ready (a binary counter). Prompt `x2 +2 -K` means terms A..K with A=2 and each term
  the previous plus 2 (`-2`: minus 2); combine with `-` (or `+`). Steps `A=2`, `B:2+2=4`,
  `AB:2-4=8`, `C:4+2=6`, `D:6+2=8`, `CD:6-8=8`, `AD:8-8=0`, ...; leftover subtrees are combined right to left at the end. A DAG
  with a short prompt and long reasoning (the shape of the thesis's AIME runs): a term is read by
  the next term and by its pair, a pair's result by its parent, at most log2(n) + 2 steps are
  pending, so five registers cover 9-14 terms.

Scorer: exact match of the final answer, the text after the last `#`.
"""

from __future__ import annotations

import random
import string

from runtime.tasks.base import Example, Task

LETTERS = string.ascii_uppercase
OPS = {"+": lambda x, y: (x + y) % 10, "-": lambda x, y: (x - y) % 10, "*": lambda x, y: (x * y) % 10}


def final_answer(output: str) -> str:
    """The text after the last `#` (the answer line), stripped; "" when there is none."""
    _, sep, tail = output.rpartition("#")
    return tail.strip() if sep else ""


def check_length(lo: int, hi: int, what: str) -> None:
    """A task's length range: at least 2, at most one step per letter (steps are lettered)."""
    if not 2 <= lo <= hi <= len(LETTERS):
        raise ValueError(f"need 2 <= min_{what} <= max_{what} <= {len(LETTERS)}")


class ReasoningTask(Task):
    def score(self, example: Example, output: str) -> float:
        return float(final_answer(output) == example.answer)


class VarTracking(ReasoningTask):
    name = "var_tracking"
    description = "two variables updated in turn many times (mod 10); answer the last value"

    def __init__(self, min_steps: int = 11, max_steps: int = 15) -> None:
        check_length(min_steps, max_steps, "steps")
        self.min_steps, self.max_steps = min_steps, max_steps

    def sample(self, rng: random.Random) -> Example:
        n = rng.randint(self.min_steps, self.max_steps)
        val = {"a": rng.randrange(10), "b": rng.randrange(10)}
        op = {"a": rng.choice("+-"), "b": rng.choice("+-")}
        prompt = f"a{val['a']} b{val['b']} {op['a']}{op['b']} {LETTERS[n - 1]}"
        steps, deps = [], []
        last = {"a": -1, "b": -1}  # step that holds each variable's value (-1: the prompt)
        for k in range(n):
            var, other = ("a", "b") if k % 2 == 0 else ("b", "a")
            x, y = val[var], val[other]
            val[var] = OPS[op[var]](x, y)
            steps.append(f"{LETTERS[k]}:{x}{op[var]}{y}={val[var]}")
            deps.append(tuple(sorted(j for j in (last[var], last[other]) if j >= 0)))
            last[var] = k
        answer = str(steps[-1][-1])
        return Example(prompt, answer, meta={"steps": steps, "deps": deps, "final": f"#{answer}"})


class NestedArith(ReasoningTask):
    name = "nested_arith"
    description = "evaluate a nested expression over digits bottom-up (mod 10)"

    def __init__(self, depth: int = 3) -> None:
        if not 1 <= depth <= 4:
            raise ValueError(f"depth must be 1..4, got {depth}")
        self.depth = depth

    def sample(self, rng: random.Random) -> Example:
        steps: list[str] = []
        deps: list[tuple[int, ...]] = []

        def build(d: int) -> tuple[str, int, int]:
            """(infix text, value, step index or -1 for a leaf) of a subtree of depth d."""
            if d == 0:
                v = rng.randrange(10)
                return str(v), v, -1
            (lt, lv, ls), (rt, rv, rs) = build(d - 1), build(d - 1)
            op = rng.choice("+-*")
            v = OPS[op](lv, rv)
            steps.append(f"{lv}{op}{rv}={v}")
            deps.append(tuple(s for s in (ls, rs) if s >= 0))
            return f"({lt}{op}{rt})", v, len(steps) - 1

        text, value, _ = build(self.depth)
        return Example(text[1:-1], str(value), meta={"steps": steps, "deps": deps, "final": f"#{value}"})


class TreeReduce(ReasoningTask):
    name = "tree_reduce"
    description = "a recurrence's terms reduced pairwise in a balanced tree as they come (mod 10)"

    def __init__(self, min_terms: int = 9, max_terms: int = 14) -> None:
        check_length(min_terms, max_terms, "terms")
        self.min_terms, self.max_terms = min_terms, max_terms

    def sample(self, rng: random.Random) -> Example:
        n = rng.randint(self.min_terms, self.max_terms)
        x, rop, d, op = rng.randrange(10), rng.choice("+-"), rng.randrange(1, 10), rng.choice("+-")
        steps: list[str] = []
        deps: list[tuple[int, ...]] = []

        def combine(left: tuple[int, int, int, int], right: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
            """Nodes are (first term, last term, value, step index)."""
            v = OPS[op](left[2], right[2])
            steps.append(f"{LETTERS[left[0]]}{LETTERS[right[1]]}:{left[2]}{op}{right[2]}={v}")
            deps.append((left[3], right[3]))
            return left[0], right[1], v, len(steps) - 1

        stack: list[tuple[int, int, int, int]] = []  # finished subtrees not yet combined, left to right
        value, last_term = x, -1  # the latest term's value and step index
        for k in range(n):
            if k == 0:
                steps.append(f"{LETTERS[0]}={x}")
                deps.append(())
            else:
                nxt = OPS[rop](value, d)
                steps.append(f"{LETTERS[k]}:{value}{rop}{d}={nxt}")
                deps.append((last_term,))
                value = nxt
            last_term = len(steps) - 1
            node = (k, k, value, last_term)
            while stack and stack[-1][1] - stack[-1][0] == node[1] - node[0]:
                node = combine(stack.pop(), node)
            stack.append(node)
        node = stack.pop()
        while stack:
            node = combine(stack.pop(), node)
        answer = str(node[2])
        return Example(
            f"x{x} {rop}{d} {op}{LETTERS[n - 1]}", answer, meta={"steps": steps, "deps": deps, "final": f"#{answer}"}
        )
