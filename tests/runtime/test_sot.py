"""`sot` without the real model: the skeleton parser, the open_questions task, and the engine's
batching on a tiny random Llama with a scripted model (a stub chat tokenizer over bytes): every
point decoded in one batched pass per step over the shared prefix gives the same tokens as the
point decoded alone; an unparsable skeleton falls back to exactly the sequential answer."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.engines.sot import parse_skeleton
from runtime.tasks import get_task
from runtime.tasks.open_questions import QUESTIONS, split_questions


@pytest.mark.parametrize(
    "text,complete,want",
    [
        ("1. Sun\n2. **Moon** phases\n3. Stars.", True, ["Sun", "Moon phases", "Stars"]),
        ("1. Use an app. 2. Join a club. 3. Read a book", True, ["Use an app", "Join a club", "Read a book"]),
        ("1. Sun\n2. Moon\n3. Sta", False, ["Sun", "Moon"]),  # cut off: the last point is dropped
        ("Intro text 1. a\n2. b\n4. d", True, ["a", "b"]),  # numbering must run 1, 2, 3...
        ("The sky is blue because of scattering.", True, []),
        ("1) x\n2) y", True, ["x", "y"]),
    ],
)
def test_parse_skeleton(text, complete, want):
    assert [t for _, t in parse_skeleton(text, complete, max_points=8)] == want


def test_parse_skeleton_caps_points():
    text = "\n".join(f"{i}. p{i}" for i in range(1, 11))
    assert [i for i, _ in parse_skeleton(text, True, max_points=4)] == [1, 2, 3, 4]


def test_open_questions_task():
    task = get_task("open_questions")
    assert 30 <= len(QUESTIONS) <= 50 and len(set(QUESTIONS)) == len(QUESTIONS)
    test, train = split_questions("test"), split_questions("train")
    assert len(test) == 20 and not set(test) & set(train) and len(test) + len(train) == len(QUESTIONS)
    ex = task.examples("test", 8, seed=0)
    assert len({e.prompt for e in ex}) == 8 and all(e.prompt in test for e in ex)
    assert [e.prompt for e in ex] == [e.prompt for e in task.examples("test", 8, seed=0)]
    assert not task.scored and "not applicable" in task.quality_note and math.isnan(task.score(ex[0], "x"))
    with pytest.raises(ValueError, match="--n must be 1..20"):
        task.examples("test", 21)


def test_sot_needs_a_chat_tokenizer(tiny_model, tok):
    from runtime.engines import get_engine

    with pytest.raises(ValueError, match="needs a real model"):
        get_engine("sot")(tiny_model, tok)


class ByteChat:
    """A stub chat tokenizer over bytes (ids 0-255; end-of-turn 300), as `HFTokenizer` is used."""

    eos_id, bos_id, pad_id, vocab_size = 300, 301, 302, 384
    stop_ids = frozenset({300})

    def chat_ids(self, user: str) -> list[int]:
        return [self.bos_id, *self.encode(f"U:{user}|A:")]

    def followup_text(self, first_user: str, assistant: str, next_user: str) -> str:
        return f"|U:{next_user}|A:"

    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, ids, *, skip_control: bool = False) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")

    def token_text(self, i: int) -> str:
        return self.decode([i])


class ScriptFirst(torch.nn.Module):
    """The adapter's real forward; the first passes' logits forced to `script` (the skeleton)."""

    def __init__(self, inner, script: list[int]) -> None:
        super().__init__()
        self.inner, self.script, self.cfg = inner, script, inner.cfg
        self.i = 0

    @property
    def embed(self):
        return self.inner.embed

    def new_kv_store(self, *a, **kw):
        return self.inner.new_kv_store(*a, **kw)

    def forward(self, *args, **kw):
        logits = self.inner(*args, **kw)
        if self.i < len(self.script):
            logits = torch.full_like(logits, -1e9)
            logits[:, self.script[self.i]] = 0.0
        self.i += 1
        return logits


@pytest.fixture(scope="module")
def tiny_llama():
    pytest.importorskip("transformers", reason="transformers not installed")
    from runtime.hf_adapter import build_arch

    return build_arch("tiny-llama", seed=3)


def _run(model, script, **knobs):
    from runtime.engines import GenerationConfig, Request, drain, get_engine

    eng = get_engine("sot")(ScriptFirst(model, script), ByteChat(), GenerationConfig(max_tokens=64), **knobs)
    return eng, *drain(eng.run(Request(0, "q?")))


def test_points_batched_equal_each_point_alone(tiny_llama):
    """Each point's tokens, decoded among its siblings over the shared KV, equal greedy decoding of
    that point's whole conversation alone (transformers' generate, no shared store)."""
    from runtime.engines.sot import POINT_PROMPT, SKELETON_PROMPT

    tok = ByteChat()
    skeleton = "1. ab\n2. cd\n3. ef"
    _eng, steps, c = _run(tiny_llama, tok.encode(skeleton) + [tok.eos_id], point_max_tokens=5)
    assert [e["event"] for e in c.events] == ["sot_skeleton"] and c.events[0]["points"] == 3
    n_skel = len(skeleton) + 1
    assert [s.phase for s in steps[:2]] == ["prefill", "plan"] and steps[n_skel].phase == "prefill"
    assert all(s.phase == "decode" and len(s.streams) <= 3 for s in steps[n_skel + 1 :])
    assert steps[n_skel].streams == (1, 2, 3)
    prompt = tok.chat_ids(SKELETON_PROMPT.format(question="q?")) + tok.encode(skeleton)
    for i, title in ((1, "ab"), (2, "cd"), (3, "ef")):
        ids = prompt + tok.encode(tok.followup_text("", "", POINT_PROMPT.format(index=i)) + f"{i}. {title}")
        outs = [t.token_id for t in c.tokens if t.stream == i]
        ref = tiny_llama.hf.generate(
            torch.tensor([ids]),
            max_new_tokens=len(outs),
            do_sample=False,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            pad_token_id=tok.pad_id,
        )[0, len(ids) :].tolist()
        assert outs == ref and 1 <= len(outs) <= 5
    assert c.text.startswith("1. ab") and "\n2. cd" in c.text and "\n3. ef" in c.text
    assert c.steps == len(steps) and c.critical_path_tokens == len(steps)
    assert len(c.output_ids) > c.steps - n_skel  # more tokens than passes: the points ran in parallel


def test_unparsable_skeleton_falls_back_to_sequential(tiny_llama):
    from runtime.engines import GenerationConfig, Request, SequentialEngine

    tok = ByteChat()
    skeleton = tok.encode("no points here") + [tok.eos_id]
    _eng, steps, c = _run(tiny_llama, skeleton)
    assert c.events[0]["event"] == "sot_fallback" and "0 parsable point" in c.events[0]["reason"]
    seq = SequentialEngine(tiny_llama, tok, GenerationConfig(max_tokens=64)).generate(Request(0, "q?"))
    ans = [t.token_id for t in c.tokens if t.stream == 1]
    assert ans == seq.output_ids and c.text == seq.text
    assert [t.kind for t in c.tokens[: len(skeleton)]] == ["plan"] * len(skeleton)
    assert c.steps == len(steps) == len(skeleton) + seq.steps
