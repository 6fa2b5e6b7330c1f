"""Mutation round on runtime/engines/sot.py: the facts test_sot.py left open (each test names the
mutants it kills; see the commit message). The scripted tiny Llama and the byte chat tokenizer are
test_sot.py's."""

from __future__ import annotations

import pytest

from runtime.engines import GenerationConfig, Request, drain, get_engine
from runtime.engines.sot import POINT_PROMPT, SKELETON_PROMPT, parse_skeleton
from tests.runtime.test_sot import ByteChat, ScriptFirst

TOK = ByteChat()


@pytest.fixture(scope="module")
def tiny_llama():
    pytest.importorskip("transformers", reason="transformers not installed")
    from runtime.hf_adapter import build_arch

    return build_arch("tiny-llama", seed=3)


def run(model, skeleton: str, stop: bool = True, max_tokens: int = 64, **knobs):
    """The sot engine with its first passes scripted: `skeleton` (then end-of-turn when `stop`)."""
    script = TOK.encode(skeleton) + ([TOK.eos_id] if stop else [])
    eng = get_engine("sot")(ScriptFirst(model, script), TOK, GenerationConfig(max_tokens=max_tokens), **knobs)
    return drain(eng.run(Request(0, "q?")))


@pytest.mark.parametrize(
    "text,want",
    [
        ("1. a\n2. b\n4. d\n3. c", ["a", "b"]),  # the numbering broke at 4: what follows is not read
        ("\n".join(f"{i}. p{i}" for i in range(1, 13)), [f"p{i}" for i in range(1, 13)]),  # two-digit numbers
    ],
)
def test_parse_skeleton_stops_at_a_break_and_reads_two_digits(text, want):
    """Kills: a numbering break skipped (the parse goes on at the next number that fits); one-digit
    point numbers only (a skeleton of 12 points read as 9)."""
    assert [t for _, t in parse_skeleton(text, True, max_points=12)] == want


def test_one_point_skeleton_falls_back_and_frees_the_skeleton(tiny_llama):
    """A skeleton of one point is no plan to parallelise: the fallback answers the plain question.
    The skeleton's KV (its prompt and tokens) is freed first, so the peak is the larger of the two
    phases; the fallback answer is its own stream (1), seeing the prompt and itself; positions count
    from each phase's own prompt; the graph is prompt -> main:0 -> main:1 (kills: the fallback at one
    point; the skeleton prompt's KV kept through the answer; the answer recorded as seeing stream 0;
    positions one ahead; the fallback node named as a thread)."""
    skeleton = "1. ab"
    steps, c = run(tiny_llama, skeleton, max_tokens=12)
    assert c.events[0]["event"] == "sot_fallback" and "1 parsable point" in c.events[0]["reason"]
    skel_prompt = TOK.chat_ids(SKELETON_PROMPT.format(question="q?"))
    plain = TOK.chat_ids("q?")  # the plain question, as `Engine.prompt_ids` builds it for a chat model
    skel = [t for t in c.tokens if t.stream == 0]
    ans = [t for t in c.tokens if t.stream == 1]
    assert len(skel) == len(skeleton) + 1 and ans and len(skel) + len(ans) == len(c.tokens)
    assert [t.position_id for t in skel] == list(range(len(skel_prompt), len(skel_prompt) + len(skel)))
    assert [t.position_id for t in ans] == list(range(len(plain), len(plain) + len(ans)))
    assert {t.visible_streams for t in skel} == {(-1, 0)} and {t.visible_streams for t in ans} == {(-1, 1)}
    fed_skel = len(skel_prompt) + len(skel) - 1  # the last sampled token is never fed
    fed_ans = len(plain) + len(ans) - 1
    assert c.peak_live_kv_tokens == max(fed_skel, fed_ans) == max(s.live_kv_tokens for s in steps)
    assert [n["id"] for n in c.graph["nodes"]] == ["prompt", "main:0", "main:1"]
    # the passes read what they saw: a causal prefill, then each decode pass its prefix and itself
    P = len(skel_prompt)
    assert [s.kv_tokens_read for s in steps[: len(skel)]] == [P * (P + 1) // 2] + [P + j for j in range(1, len(skel))]
    slots = [t.kv_slot for t in skel]
    assert slots[-1] == -1 and min(slots[:-1]) >= 0  # every fed skeleton token has its slot


def test_points_stop_at_a_newline(tiny_llama):
    """A point's expansion that writes a newline is done (it would start another point): the
    scripted expansion pass writes '\\n' for every point, so each stops after one token with
    stop_token (kills: the newline rule dropped, points running on to point_max_tokens)."""
    script = TOK.encode("1. ab\n2. cd") + [TOK.eos_id, ord("\n")]  # then the expansion's first pass
    eng = get_engine("sot")(ScriptFirst(tiny_llama, script), TOK, GenerationConfig(max_tokens=64), point_max_tokens=4)
    _, c = drain(eng.run(Request(0, "q?")))
    assert c.events[0]["event"] == "sot_skeleton"
    points = [[t.token_id for t in c.tokens if t.stream == i] for i in (1, 2)]
    assert points == [[ord("\n")], [ord("\n")]] and c.stop_reason == "stop_token"


def test_a_cut_skeleton_feeds_its_last_token_before_the_points(tiny_llama):
    """A skeleton cut at skeleton_max_tokens: its last point is dropped, and its last sampled token
    (never fed) opens every point's turn, so each point's tokens sit after the whole skeleton text
    and the point's own turn (kills: the pending token left out, every point one position short)."""
    skeleton = "1. ab\n2. cd\n3. e"
    steps, c = run(tiny_llama, skeleton, stop=False, skeleton_max_tokens=len(skeleton), point_max_tokens=3)
    assert c.events[0] == {"event": "sot_skeleton", "points": 2}
    P = len(TOK.chat_ids(SKELETON_PROMPT.format(question="q?")))
    for i, title in ((1, "ab"), (2, "cd")):
        turn = TOK.encode(TOK.followup_text("", "", POINT_PROMPT.format(index=i)) + f"{i}. {title}")
        first = next(t for t in c.tokens if t.stream == i)
        assert first.position_id == P + len(skeleton) + len(turn)


def test_the_point_budget_counts_every_points_tokens(tiny_llama):
    """`max_tokens` bounds the points' tokens together: with 3 points and a budget of 6 the
    expansion stops after its second pass, every point truncated (kills: the budget checked with
    > instead of >=, a third pass)."""
    skeleton = "1. ab\n2. cd\n3. ef"
    steps, c = run(tiny_llama, skeleton, max_tokens=6, point_max_tokens=48)
    pts = [t for t in c.tokens if t.stream > 0]
    assert len(pts) == 6 and c.stop_reason == "max_tokens" and c.status == "truncated"


class Spy(ScriptFirst):
    """ScriptFirst that records (positions, slots, visibility) of every forward pass."""

    def __init__(self, inner, script):
        super().__init__(inner, script)
        self.calls = []

    def forward(self, tokens, positions, slots, vis, kv, **kw):
        self.calls.append((positions.tolist(), slots.tolist(), vis.clone()))
        return super().forward(tokens, positions, slots, vis, kv, **kw)


def test_every_row_sees_its_whole_prefix_and_each_step_reports_its_pass(tiny_llama):
    """In every pass (skeleton, the points' shared prefill, their decoding) a row at position p sees
    exactly p + 1 slots, its own among them: its conversation so far and itself. Each step reports
    its pass's rows and the slots they saw (kills: the points' shared rows not seeing themselves, a
    change the random model's greedy tokens did not show; a decode step's kv read one short)."""
    spy = Spy(tiny_llama, TOK.encode("1. ab\n2. cd\n3. ef") + [TOK.eos_id])
    eng = get_engine("sot")(spy, TOK, GenerationConfig(max_tokens=8), point_max_tokens=3)
    steps, c = drain(eng.run(Request(0, "q?")))
    assert c.events[0]["event"] == "sot_skeleton" and len(steps) == len(spy.calls)
    for s, (positions, slots, vis) in zip(steps, spy.calls):
        for r, (p, slot) in enumerate(zip(positions, slots)):
            assert vis[r, slot] and int(vis[r].sum()) == p + 1, (s.phase, r, p)
        assert s.query_tokens == len(positions) and s.kv_tokens_read == int(vis.sum()), s


class NewlineAt(ScriptFirst):
    """ScriptFirst whose pass number `at` writes a newline on its row of the highest position only."""

    def __init__(self, inner, script, at):
        super().__init__(inner, script)
        self.at = at

    def forward(self, tokens, positions, slots, vis, kv, **kw):
        logits = super().forward(tokens, positions, slots, vis, kv, **kw)
        if self.i - 1 == self.at:
            r = int(positions.argmax())
            logits[r] = -1e9
            logits[r, ord("\n")] = 0.0
        return logits


def test_a_request_is_done_only_when_every_point_is(tiny_llama):
    """Point 2 (its title one byte longer, so its turn ends one position later) writes a newline
    and is done at once; point 1 runs to point_max_tokens. The request is truncated: not every point
    ended by itself (kills: the request 'stop_token' when any point is)."""
    script = TOK.encode("1. ab\n2. cde") + [TOK.eos_id]
    model = NewlineAt(tiny_llama, script, at=len(script))  # the points' shared prefill pass
    eng = get_engine("sot")(model, TOK, GenerationConfig(max_tokens=64), point_max_tokens=2)
    _, c = drain(eng.run(Request(0, "q?")))
    p1, p2 = ([t.token_id for t in c.tokens if t.stream == i] for i in (1, 2))
    assert p2 == [ord("\n")] and len(p1) == 2 and ord("\n") not in p1
    assert c.stop_reason == "max_tokens" and c.status == "truncated"
    assert [n["id"] for n in c.graph["nodes"]] == ["prompt", "main:0", "thread:1", "thread:2"]
