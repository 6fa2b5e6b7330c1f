"""Shipped defaults are operating points: each task's default `max_tokens` fits its longest answer,
and Planned Diffusion's default knobs are the setting its benchmark chose on the dev split."""

from __future__ import annotations

import json

import pytest

from runtime.answer_length import (
    answer_tokens,
    default_max_tokens,
    longest_answer_tokens,
)
from runtime.tasks import get_task, task_names
from runtime.tokenizer import Tokenizer


@pytest.mark.parametrize("task", [t for t in task_names() if getattr(get_task(t), "scored", True)])
def test_default_max_tokens_fit_every_held_out_answer(task):
    """(Tasks with written answers; open_questions has none: its default is its own `default_max_tokens`.)"""
    """Drawn from other splits than the default was derived from (train): test and dev answers fit."""
    tok, limit = Tokenizer(), default_max_tokens(task)
    held_out = get_task(task).examples("test", 64, seed=7) + get_task(task).examples("dev", 16, seed=7)
    longest = max(answer_tokens(ex, tok) for ex in held_out)
    assert longest <= longest_answer_tokens(task) <= limit, (task, longest, limit)


def test_reasoning_answers_are_counted_as_worked_solutions():
    """tree_reduce's answer is one digit, its worked solution (what TIP writes) hundreds of tokens:
    128, the old default for every task, cut every one of them short."""
    assert longest_answer_tokens("tree_reduce") > 128 and default_max_tokens("tree_reduce") >= longest_answer_tokens(
        "tree_reduce"
    )


def test_capture_without_max_tokens_uses_the_tasks_default(tmp_path):
    from runtime.capture import CaptureConfig, capture

    out = capture(CaptureConfig(system="sequential", model="tiny-2l", n=1, page_size=4), tmp_path / "c", progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["task"] == "reverse_words" and meta["knobs"]["max_tokens"] == default_max_tokens("reverse_words")


def test_planned_diffusion_defaults_are_the_operating_point_chosen_on_dev():
    """`solm capture --system planned_diffusion` with no knobs runs the setting bench/planned_diffusion.py
    chose on the dev split, recorded with the command and dev figures that chose it."""
    from runtime.engines.operating_points import (
        OPERATING_POINTS_FILE,
        engine_defaults,
        operating_points,
    )

    entry = json.loads(OPERATING_POINTS_FILE.read_text())["planned_diffusion"]
    assert entry == operating_points()["planned_diffusion"]
    assert entry["command"].startswith("python bench/planned_diffusion.py") and "dev split" in entry["rule"]
    assert entry["dev_quality"] >= entry["ar_dev_quality"] - 0.03 and entry["dev_speedup_geomean"] > 1
    defaults = engine_defaults("planned_diffusion")
    assert entry["knobs"] and {k: defaults[k] for k in entry["knobs"]} == entry["knobs"]
    assert (
        defaults["steps_ratio"] == entry["knobs"]["steps_ratio"]
    )  # not the paper's plain 1.0 / no threshold by accident
    assert defaults["confidence_threshold"] == entry["knobs"].get("confidence_threshold")


def test_a_capture_records_the_settings_its_engine_ran_with(tmp_path):
    from runtime.capture import CaptureConfig, capture
    from runtime.engines.operating_points import operating_knobs

    out = capture(
        CaptureConfig(
            system="planned_diffusion", model="tiny-2l", task="word_facts", n=1, max_tokens=8, knobs={"order": "margin"}
        ),
        tmp_path / "pd",
        progress=False,
    )
    meta = json.loads((out / "meta.json").read_text())
    assert meta["knobs"]["order"] == "margin" and "steps_ratio" not in meta["knobs"]
    settings = meta["engine_settings"]
    assert settings["order"] == "margin"
    assert {k: settings[k] for k in operating_knobs("planned_diffusion")} == operating_knobs("planned_diffusion")


def test_answer_length_prints_each_tasks_longest_answer_and_default(capsys):
    """`python -m runtime.answer_length` prints the figures docs/planned_diffusion.md quotes."""
    from runtime.answer_length import main

    assert main(["word_facts", "open_questions"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"word_facts: longest written answer {longest_answer_tokens('word_facts')} tokens")
    assert out[0].endswith(
        f"default max_tokens {default_max_tokens('word_facts')} (1.25 x that, rounded up to a multiple of 32)"
    )
    assert (
        out[1]
        == f"open_questions: default max_tokens {default_max_tokens('open_questions')} (the task's own: no written answers)"
    )
    with pytest.raises(SystemExit) as e:
        main(["no_such_task"])
    assert e.value.code == 2
