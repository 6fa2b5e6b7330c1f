"""PASTA-LANG: generator round trips, the parser's fallbacks, and property tests over random and
malformed tag sequences (the parser and the interpreter never raise and always yield text)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runtime.engines import GenerationConfig, Request
from runtime.engines.pasta import MAIN, PastaEngine
from runtime.lang.pasta import (
    ASYNC,
    ASYNC_END,
    PROMISE_OPEN,
    STYLES,
    SYNC,
    Finish,
    Fork,
    Inline,
    PastaParser,
    Sync,
    annotate,
    promise_close,
    reserve_for,
    strip,
)
from runtime.tasks import get_task
from runtime.tasks.parallel import ALL_TASKS, PARALLEL_TASKS
from runtime.tokenizer import Tokenizer

TOK = Tokenizer()
PIECES = [
    [TOK.token_id(PROMISE_OPEN)],
    [TOK.token_id(PROMISE_OPEN + "a")],
    [TOK.token_id(PROMISE_OPEN + "7")],
    [TOK.token_id(promise_close(10))],
    [TOK.token_id(promise_close(40))],
    [TOK.token_id(promise_close(100))],
    [TOK.token_id(ASYNC)],
    [TOK.token_id(ASYNC_END)],
    [TOK.token_id(SYNC)],
    [TOK.eos_id],
    [TOK.token_id("<reg_3>")],
    list(b"a"),
    list(b"xy"),
    list(b'"'),
    list(b'" tokens="15"/>'),
    list(b'" tokens="0"/>'),
    list(b'" tokens="zz"/>'),
    list(b"\n"),
]
token_lists = st.lists(st.sampled_from(PIECES), max_size=40).map(lambda ps: [t for p in ps for t in p])


@pytest.mark.parametrize("name", ALL_TASKS)
def test_tasks_are_deterministic_scored_and_structured(name):
    task = get_task(name)
    test = task.examples("test", 20)
    assert test == task.examples("test", 20)
    assert not {e.prompt for e in test} & {e.prompt for e in task.examples("train", 300)}
    for ex in test:
        m = ex.meta
        assert ex.answer == "".join(m["parts"]) + m["closing"] and len(m["topics"]) == len(m["parts"])
        assert len(set(m["topics"])) == len(m["topics"]) and all(1 <= len(t) <= 3 for t in m["topics"])
        assert task.score(ex, ex.answer) == 1.0 and task.score(ex, "") == 0.0
        if name in PARALLEL_TASKS:
            assert 3 <= len(m["parts"]) <= 4
            assert task.score(ex, "".join(m["parts"][1:]) + m["closing"]) < 1.0


@pytest.mark.parametrize("name", ALL_TASKS)
@pytest.mark.parametrize("style", STYLES)
def test_annotation_strips_back_to_the_answer(name, style):
    for ex in get_task(name).examples("train", 10):
        a = annotate(ex.meta, TOK, style)
        assert strip(a) == ex.answer
        assert (SYNC in a) == (style != "none" and bool(ex.meta["parts"]))
        for n in range(10, 101, 10):
            a = a.replace(promise_close(n), "")
        assert '" tokens="' not in a  # every length estimate is one of the single-token multiples of 10


def test_reserve_leaves_room_for_async_and_content():
    assert [reserve_for(k) for k in (1, 9, 10, 25, 29, 30, 500)] == [10, 10, 20, 30, 30, 40, 100]


def feed_all(parser, state, ids, can_fork=True):
    return [parser.feed(state, t, can_fork) for t in ids]


def test_parser_well_formed_and_fallbacks():
    p = PastaParser(TOK)
    main = p.new_stream("main")
    out = feed_all(p, main, TOK.encode('<promise topic="ab" tokens="30"/>'))
    assert out[-1].action == Fork("ab", 30) and all(x.kind == "tag" for x in out)
    assert feed_all(p, main, TOK.encode('<promise topic="q" tokens="15"/>'))[-1].action == Fork("q", 15)
    fused = TOK.encode('<promise topic="7" tokens="30"/>')  # the opening carries the topic: 2 tokens
    assert len(fused) == 2 and feed_all(p, main, fused)[-1].action == Fork("7", 30)
    assert feed_all(p, main, TOK.encode('<promise topic="Q" tokens="30"/>'))[-1].action == Fork("Q", 30)
    assert feed_all(p, main, [TOK.token_id(SYNC)])[-1].action == Sync()
    cases = {
        '<promise topic="" tokens="30"/>': "promise_without_topic",
        '<promise topic="a" tokens="0"/>': "bad_token_count",
        '<promise topic="a" tokens="x"/>': "bad_token_count",
        "</async>": "close_without_async",
        '" tokens="20"/>': "close_without_promise",
    }
    for text, event in cases.items():
        res = feed_all(p, p.new_stream("main"), TOK.encode(text))
        assert res[-1].event == event, text
        if event in ("promise_without_topic", "bad_token_count"):
            assert isinstance(res[-1].action, Inline)
    thread = p.new_stream("thread")
    r = feed_all(p, thread, TOK.encode('<promise topic="a" tokens="10"/>'))
    assert r[-1].action == Inline("nested_promise")
    assert feed_all(p, p.new_stream("main"), [TOK.token_id(ASYNC), TOK.eos_id])[-1].event == "unclosed_async"
    assert feed_all(p, p.new_stream("thread"), [TOK.token_id(ASYNC_END)])[-1].action == Finish()
    interrupted = feed_all(p, p.new_stream("main"), [TOK.token_id(PROMISE_OPEN), *b"ab", TOK.token_id(SYNC)])
    assert interrupted[-1].event == "unclosed_promise" and interrupted[-1].action == Sync()
    long = feed_all(p, p.new_stream("main"), [TOK.token_id(PROMISE_OPEN)] + [97] * 40)
    assert "unclosed_promise" in {r.event for r in long} and long[-1].kind == "content"
    assert (
        feed_all(p, p.new_stream("main"), TOK.encode('<promise topic="a" tokens="10"/>'), can_fork=False)[-1].event
        == "max_threads"
    )


@settings(max_examples=300, deadline=None)
@given(token_lists, st.sampled_from(["main", "thread"]), st.booleans())
def test_parser_never_raises(ids, role, can_fork):
    p = PastaParser(TOK)
    s = p.new_stream(role)
    for t in ids:
        r = p.feed(s, t, can_fork)
        assert r.kind in ("tag", "content") and isinstance(r.event, str)


class FromList(PastaEngine):
    """Every stream draws its next token from one shared list (then <eos> / </async>)."""

    def __init__(self, *a, ids=(), **k):
        super().__init__(*a, **k)
        self.ids = list(ids)

    def choose(self, lay, sids, logits, sample):
        return [
            self.ids.pop(0) if self.ids else (TOK.eos_id if sid == MAIN else TOK.token_id(ASYNC_END)) for sid in sids
        ]


# A promise, main's <sync/> while the thread ends at once, then a second promise: the second thread
# forks from main after the sync merged the first into main's context, so it sees stream 1 through
# main (hypothesis found it; the check below once wrongly said a thread never sees a sibling).
_AFTER_SYNC = TOK.encode('<promise topic="a" tokens="15"/><sync/></async><promise topic="a" tokens="15"/>')


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(token_lists)
@example(_AFTER_SYNC)
def test_interpreter_never_raises_and_always_yields_text(tiny_model, ids):
    eng = FromList(tiny_model, TOK, GenerationConfig(max_tokens=48), ids=ids, max_threads=3, max_chunk_tokens=16)
    c = eng.generate(Request(0, "x"))
    assert isinstance(c.text, str) and c.status in ("ok", "truncated")
    assert all(isinstance(e["event"], str) for e in c.events)
    assert len(c.tokens) == len(c.output_ids) and c.critical_path_tokens == c.steps >= 1
    steps: dict[int, list[int]] = {}
    for t in c.tokens:
        steps.setdefault(t.stream, []).append(t.step_index)
    for t in (t for t in c.tokens if t.stream > 0):  # a thread sees a sibling only once merged before its fork
        for other in set(t.visible_streams) - {-1, MAIN, t.stream}:
            assert max(steps.get(other, [-1])) < min(steps[t.stream]), (t.stream, other)
