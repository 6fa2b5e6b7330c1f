"""Mutation-round tests of runtime/answer_length.py: behaviour test_defaults.py did not pin (each
kills a hand-made mutant that survived it: the worked solution's final line, the `<eos>` counted,
the 1.25 headroom and the rounding to 32, every task printed without arguments). The longest
answer is stubbed where only the arithmetic on it is under test, so nothing draws 1000 examples."""

from __future__ import annotations

import pytest

import runtime.answer_length as al
from runtime.tasks import Example, get_task, task_names
from runtime.tokenizer import Tokenizer


def test_a_worked_solution_ends_with_its_final_line():
    ex = get_task("tree_reduce").examples("train", 1, 0)[0]
    text = al.written_answer(ex)
    assert text.endswith(ex.meta["final"]) and text.startswith("<reg_")


def test_answer_tokens_count_the_eos():
    tok = Tokenizer()
    assert al.answer_tokens(Example("p", "abc"), tok) == len(tok.encode("abc")) + 1 == 4


@pytest.mark.parametrize(("longest", "default"), [(228, 288), (120, 160), (100, 128), (1, 32)])
def test_the_default_is_a_quarter_more_rounded_up_to_32(monkeypatch, longest, default):
    """The docstring's figure: tree_reduce's longest worked solution of 228 tokens gives 288."""
    monkeypatch.setattr(al, "longest_answer_tokens", lambda task: longest)
    assert al.default_max_tokens("tree_reduce") == default


def test_without_arguments_every_task_is_printed(monkeypatch, capsys):
    monkeypatch.setattr(al, "longest_answer_tokens", lambda task: 40)
    assert al.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == task_names()
