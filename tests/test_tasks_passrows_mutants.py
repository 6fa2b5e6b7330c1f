"""Mutation round on runtime/tasks/*.py (generators, splits, scorers) and simulator/passrows.py.

58 mutants (41 in the tasks, 17 in the pass rows; runner /work/wt/mut.py): 17 killed by the
existing tests (4 of the tasks' 41: the dev boundary, the hash's byte count, the duplicate-prompt
check, `partition` for `rpartition`; 13 of the pass rows' 17, by tests/simulator/test_replay.py and
test_simtrace_compact.py), 40 of the 41 survivors killed here, 1 equivalent:

- tree_reduce's merge test `stack[-1] size == node size` as `<=`: the stack is a binary counter
  (sizes strictly decreasing powers of two, the new node the smallest), so the top is never
  smaller than the node and `<=` holds exactly when `==` does.

The existing task tests checked that splits are disjoint and that a reference scores 1 and junk 0;
nothing pinned what the generators draw (the split's hash, its seed, any generator's arithmetic:
`-` computed as y - x, `max` of the spelled numbers as text), nor a scorer's edges (extra lines or
words, surrounding whitespace, no `#` answer line, a `#17` for 7). The pinned first examples below
are what shipped traces and models were made from. The pass rows' untested parts were the
per-request counts of a request without rows, per-pass totals of a pass without rows,
`_plain_keys` in more than one group, and the guard against two stretches on one pass.

Bug found: `Task.examples(split, 0)` passed the 0..MAX_EXAMPLES guard, then drew until the split
ran out and raised "could draw only 98 distinct test examples, not 0" (a training pool whose task
weight rounds to 0 examples could hit it); it returns [] now. No shipped figure moves (it raised before).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

import runtime.tasks.base as base
from profiler.errors import UsageError
from runtime.tasks import get_task
from runtime.tasks.base import Example, Task, split_of
from runtime.tasks.open_questions import split_questions
from runtime.tasks.parallel import line_score
from runtime.tasks.reasoning import OPS, NestedArith, TreeReduce, VarTracking, final_answer
from simulator.demand import Demand
from simulator.passrows import KEYS, OWN_COLUMNS, PassRows, _plain_keys, build
from simulator.replay import Stretch

# ---- splits and drawing --------------------------------------------------------------------------


def test_split_of_at_its_bucket_boundaries():
    """Bucket (the first 4 bytes of the prompt's sha256, big-endian, mod 100): 0..8 test, 9 dev,
    10.. train. The prompts below sit on each boundary (bucket in the comment)."""
    got = {p: split_of(p) for p in ("p199", "p1", "p29", "p5", "p97")}
    assert got == {"p199": "test", "p1": "test", "p29": "dev", "p5": "train", "p97": "train"}  # 0, 8, 9, 10, 11
    assert split_of("p5", held_out_percent=11) == "dev" and split_of("p29", dev_percent=0) == "test"


class Counter(Task):
    """A stub task: prompt i on the i-th draw (every draw new), or one of `distinct` prompts."""

    name = "counter"

    def __init__(self, distinct: int = 0) -> None:
        self.distinct, self.draws = distinct, 0

    def sample(self, rng: random.Random) -> Example:
        self.draws += 1
        i = rng.randrange(self.distinct) if self.distinct else self.draws
        return Example(f"p{i}", str(i))


def test_examples_limits(monkeypatch):
    """n may be 0..MAX_EXAMPLES inclusive (0: none); one more is a UsageError before any draw."""
    monkeypatch.setattr(base, "MAX_EXAMPLES", 30)
    assert len(Counter().examples("train", 30)) == 30
    t = Counter()
    with pytest.raises(UsageError, match="at most 30"):
        t.examples("train", 31)
    assert t.draws == 0
    assert Counter().examples("test", 0) == []  # was: UsageError "could draw only 98 ... not 0"
    with pytest.raises(UsageError, match="split must be"):
        Counter().examples("valid", 1)


def test_stall_counts_draws_since_the_last_new_prompt(monkeypatch):
    """STALL is draws in a row without a new prompt of the split, not draws in all: a long draw
    that keeps finding new prompts goes on; a used-up task stops STALL draws after its last new one."""
    monkeypatch.setattr(base, "STALL", 50)
    assert len(Counter().examples("test", 20)) == 20  # ~220 draws, never 50 in a row without a new one
    t = Counter(distinct=40)
    with pytest.raises(UsageError, match="could draw only"):
        t.examples("train", 39)  # 40 prompts, about 36 of them train
    assert t.draws < 400  # (200 x 39 + 1000 draws without the stall)


def test_examples_are_distinct_and_of_their_split():
    ex = Counter(distinct=300).examples("train", 100)
    assert len({e.prompt for e in ex}) == 100 and all(split_of(e.prompt) == "train" for e in ex)


# the first examples of each split (seed 0; dev seed 3): shipped traces and models depend on them
GOLDEN = {
    "copy_line": [("copy: yb uic vb kad akfzm", "yb uic vb kad akfzm"), ("copy: xxndt rq vesw jpret cy hns", None)],
    "list_stats": [
        (
            "stats: a=0816;b=81079;c=97619;d=932",
            "a min 0 max 8 rev 6180\nb min 0 max 9 rev 97018\nc min 1 max 9 rev 91679\nd min 2 max 9 rev 239\nmax 9",
        ),
        ("stats: a=201;b=90063;c=5994;d=3321", None),
    ],
    "map_numbers": [
        (
            "spell: 455,349,816,1628",  # the largest by value, not as text ("816")
            "455 is four five five\n349 is three four nine\n816 is eight one six\n1628 is one six two eight\nmax 1628",
        ),
        ("spell: 1747,2964,4057,7134", None),
    ],
    "nested_arith": [("((4-5)*(5*1))*((8*0)-(5+0))", "5"), ("((0-3)+(5-1))-((4-6)+(2*7))", "9")],
    "reverse_words": [
        ("reverse: mza,kttkqs,ytyls,vxpam,iza", "azm,sqkttk,slyty,mapxv,azi"),
        ("reverse: vqbxv,kmekg,prm,fn", None),
    ],
    "tree_reduce": [("x6 -6 -M", "4"), ("x9 -4 -K", "5")],
    "var_tracking": [("a6 b2 -- K", "6"), ("a7 b2 -- O", "6")],
    "word_facts": [
        (
            "facts: iul,lqte,jltq,omsm",
            "iul up IUL rev lui len 3\nlqte up LQTE rev etql len 4\njltq up JLTQ rev qtlj len 4\n"
            "omsm up OMSM rev msmo len 4\nini ILJO",
        ),
        ("facts: oqlkv,vvxns,irsi,eqxf", None),
    ],
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_first_examples_are_pinned(name):
    (tp, ta), (dp, da) = GOLDEN[name]
    test, dev = get_task(name).examples("test", 1)[0], get_task(name).examples("dev", 1, seed=3)[0]
    assert (test.prompt, test.answer) == (tp, ta) and dev.prompt == dp and (da is None or dev.answer == da)


def test_open_questions_splits_and_order_are_pinned():
    test = split_questions("test")
    assert test[:3] == [
        "What is the difference between weather and climate?",
        "What are three benefits of regular exercise?",
        "List four things to pack for a camping trip.",
    ]
    assert split_questions("dev") == split_questions("train")  # the rest: dev is where settings are chosen
    task = get_task("open_questions")
    assert [e.prompt for e in task.examples("test", 3, seed=0)] == [
        "Explain how rain forms.",
        "What are three ways to make a small room look bigger?",
        "List four things to pack for a camping trip.",
    ]
    assert [e.prompt for e in task.examples("train", 2, seed=1)] == [
        "Give three tips for writing a clear email.",
        "Name three popular sports and how they are played.",
    ]
    assert sorted(e.prompt for e in task.examples("test", 20)) == sorted(test)  # the whole split may be asked for
    with pytest.raises(ValueError, match="split must be"):
        split_questions("valid")


# ---- scorers -------------------------------------------------------------------------------------


def test_line_score_edges():
    ref = "a 1\nb 2\nmax 2"
    assert line_score(ref, ref + "\n") == 1.0 and line_score(ref, "\n" + ref + "\n\n") == 1.0  # blank ends
    assert line_score(ref, ref + "\nextra") == 3 / 4  # an extra line costs one line
    assert line_score(ref, "a 1\nb 2") == 2 / 3  # so does a missing one
    assert line_score(ref, " a 1\nb 2\nmax 2") == 2 / 3  # lines are exact: no whitespace forgiven
    assert line_score(ref, "a 1 \nb 2\nmax 2 ") == 1 / 3
    assert line_score(ref, "b 2\nmax 2") == 0.0  # position by position


def test_reverse_words_score_edges():
    t = get_task("reverse_words")
    ex = t.examples("test", 1)[0]  # five words
    assert t.score(ex, " " + ex.answer + "\n") == 1.0  # surrounding whitespace is not an answer
    assert t.score(ex, ex.answer + ",zz") == 5 / 6  # an extra word costs one word
    assert t.score(ex, ex.answer.rsplit(",", 1)[0]) == 4 / 5


def test_reasoning_score_needs_the_answer_line():
    t = get_task("nested_arith")
    ex = t.examples("test", 1)[0]
    assert t.score(ex, "#" + ex.answer) == 1.0 and t.score(ex, "#1#" + ex.answer + " \n") == 1.0
    assert t.score(ex, ex.answer) == 0.0  # no `#`: no answer line
    assert t.score(ex, "#1" + ex.answer) == 0.0 and t.score(ex, "#" + ex.answer + "0") == 0.0  # exact
    assert final_answer("7") == "" and final_answer("a#b#c") == "c"


# ---- reasoning generators ------------------------------------------------------------------------


def test_reasoning_length_ranges():
    for bad in ((1, 5), (5, 4), (2, 27)):
        with pytest.raises(ValueError):
            VarTracking(*bad)
        with pytest.raises(ValueError):
            TreeReduce(*bad)
    assert VarTracking(2, 26) and TreeReduce(2, 26) and NestedArith(4)
    with pytest.raises(ValueError):
        NestedArith(5)
    ex = VarTracking(26, 26).sample(random.Random(0))
    assert ex.prompt.endswith(" Z") and len(ex.meta["steps"]) == 26


def test_mod_10_ops():
    assert (OPS["+"](7, 5), OPS["-"](3, 5), OPS["*"](7, 8)) == (2, 8, 6)


def test_var_tracking_steps_and_deps():
    ex = get_task("var_tracking").examples("test", 1)[0]  # a6 b2 -- K
    assert ex.meta["steps"][:3] == ["A:6-2=4", "B:2-4=8", "C:4-8=6"] and len(ex.meta["steps"]) == 11
    assert ex.meta["deps"][:4] == [(), (0,), (0, 1), (1, 2)]  # the prompt is not a step
    for ex in get_task("var_tracking").examples("test", 20):
        assert len(ex.meta["steps"]) == "ABCDEFGHIJKLMNOPQRSTUVWXYZ".index(ex.prompt[-1]) + 1


def test_tree_reduce_steps_are_pinned():
    """x6 -6 -M: 13 terms, pairs combined as they are ready, leftover subtrees (8, 4, 1 terms)
    combined right to left."""
    ex = get_task("tree_reduce").examples("test", 1)[0]
    steps = ex.meta["steps"]
    assert steps[:7] == ["A=6", "B:6-6=0", "AB:6-0=6", "C:0-6=4", "D:4-6=8", "CD:4-8=6", "AD:6-6=0"]
    assert steps[-4:] == ["IL:6-6=0", "M:0-6=4", "IM:0-4=6", "AM:0-6=4"] and len(steps) == 25
    assert ex.meta["deps"][-3:] == [(19,), (21, 22), (14, 23)]  # AM reads AH (step 14) and IM


# ---- pass rows -----------------------------------------------------------------------------------


def _demand(requests: int, **given) -> Demand:
    cols = {f: np.zeros(requests, np.int64) for f in Demand._fields}
    cols["final"] = np.ones(requests, bool)
    cols.update({k: np.asarray(v) for k, v in given.items()})
    return Demand(**cols)


def _sim(stretches, n_pass: int, n_requests: int = 4) -> SimpleNamespace:
    flat = np.arange(8)
    w = SimpleNamespace(
        n_requests=n_requests,  # request 3 ran nothing
        query_tokens=flat * 10 + 1,
        kv_tokens_read=flat * 100,
        query_groups=flat % 3 + 1,
        live_kv_tokens=flat + 50,
        emits=flat % 2,
    )
    return SimpleNamespace(w=w, blocks=flat + 200, stretches=stretches, n_pass=n_pass)


def _stretches() -> list[Stretch]:
    """Requests 0 (flat passes 0..2), 1 (3..5), 2 (6..7); global passes 0..4:
    0: request 1's prefill chunk of flat 3 (own demand); 1-2: requests 0 and 1, two whole passes;
    3: request 2's flat 6 and request 0's recompute of flat 2 (own demand); 4: requests 1 and 2."""
    f = np.array
    return [
        Stretch(f([1]), f([3]), f([0.0]), f([1.0]), 0, _demand(1, query=[7], blocks=[9], final=[False], flat=[3])),
        Stretch(f([0, 1]), f([0, 3]), f([1.0, 2.0]), f([1.0, 1.5]), 1),
        Stretch(
            f([2, 0]),
            f([6, 2]),
            f([3.5]),
            f([0.5]),
            3,
            _demand(2, query=[4, 6], kv_read=[5, 9], rebuild=[0, 5], emits=[1, 1], live=[3, 4], flat=[6, 2]),
        ),
        Stretch(f([1, 2]), f([5, 7]), f([4.0]), f([2.0]), 4),
    ]


def _reference(sim) -> dict[str, list]:
    """The rows built one at a time, the plain way: (request, pass) order, own demand where given."""
    w, rows = sim.w, []
    for s in sim.stretches:
        for i, r in enumerate(s.requests):
            for j in range(len(s.durations_s)):
                b = s.first_batch + j
                row = {"request": int(r), "batch_index": b, "start_s": s.starts_s[j], "duration_s": s.durations_s[j]}
                if s.demand is not None:
                    row["flat"] = int(s.demand.flat[i])
                    row |= {k: getattr(s.demand, k)[i].item() for k in OWN_COLUMNS}
                else:
                    fl = row["flat"] = int(s.first_pass[i]) + j
                    row |= {"query": w.query_tokens[fl], "kv_read": w.kv_tokens_read[fl], "groups": w.query_groups[fl]}
                    row |= {"live": w.live_kv_tokens[fl], "emits": w.emits[fl], "blocks": sim.blocks[fl]}
                    row |= {"rebuild": 0, "final": True}
                rows.append(row)
    rows.sort(key=lambda x: (x["request"], x["batch_index"]))
    for k, x in enumerate(rows):
        x["step_index"] = sum(y["request"] == x["request"] for y in rows[:k])
    return {k: [x[k] for x in rows] for k in KEYS}


def test_pass_rows_match_the_rows_built_one_at_a_time():
    sim = _sim(_stretches(), 5)
    rows, want = build(sim), _reference(_sim(_stretches(), 5))
    assert want["request"] == [0, 0, 0, 1, 1, 1, 1, 2, 2] and want["batch_index"] == [1, 2, 3, 0, 1, 2, 4, 3, 4]
    assert want["step_index"] == [0, 1, 2, 0, 1, 2, 3, 0, 1] and want["final"][3] is False
    assert rows.n == 9 and set(rows) == set(KEYS) and len(rows) == len(KEYS)
    for key in KEYS:
        assert rows[key].tolist() == want[key], key
        for lo in range(rows.n + 1):  # every slice: what the trace writer streams
            for hi in range(lo, rows.n + 1):
                assert rows.column(key, lo, hi).tolist() == want[key][lo:hi], (key, lo, hi)
    assert rows.counts.tolist() == [3, 4, 2, 0]  # one count per request, 0 for one that ran nothing
    assert rows.pass_totals().tolist() == [1, 2, 2, 2, 2]
    assert rows.pass_totals(rows["query"].astype(float)).tolist() == [7, 1 + 31, 11 + 41, 4 + 6, 51 + 71]
    with pytest.raises(KeyError):
        rows["tokens"]


def test_pass_totals_count_a_pass_without_rows():
    rows = PassRows(
        SimpleNamespace(n_requests=1),
        np.zeros(1, np.int64),
        np.zeros(1, np.int32),
        np.zeros(1, np.int32),
        np.zeros(1, np.int32),
        np.zeros(3),
        np.ones(3),
        np.zeros(0, np.int64),
        {},
    )
    assert rows.pass_totals().tolist() == [1, 0, 0]


def test_plain_keys_in_groups_match_all_at_once():
    plain = [s for s in _stretches() if s.demand is None] * 3
    whole = [np.concatenate(k) for k in zip(*_plain_keys(plain))]
    for group in (1, 2, 4):
        got = [np.concatenate(k) for k in zip(*_plain_keys(plain, group))]
        assert all(np.array_equal(a, b) for a, b in zip(got, whole))
    assert len(whole[0]) == 3 * 6


def test_stretches_that_overlap_are_a_bug():
    """Passes counted once each: two stretches on one pass (and none on another) raise."""
    s = _stretches()
    s[3] = s[3].renumbered(2)
    with pytest.raises(RuntimeError, match="a bug"):
        build(_sim(s, 5))
    with pytest.raises(RuntimeError, match="a bug"):
        build(_sim(_stretches(), 6))
