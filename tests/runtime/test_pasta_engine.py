"""The PASTA interpreter on tiny random models: scripted main threads, greedy chunks.

Equivalence tests: every logits row the engine used equals the dense recompute of the same
sequence under the training mask (so engine and training agree on positions and visibility), and
a chunk decoded among its siblings equals that chunk decoded alone.
"""

from __future__ import annotations

import torch

from runtime.engines import GenerationConfig, Request, drain
from runtime.engines.pasta import MAIN, PastaEngine
from runtime.engines.skeleton import SkeletonEngine
from runtime.lang.pasta import ASYNC_END, PROMISE_OPEN, SYNC, annotate, promise_close
from runtime.tasks import get_task
from runtime.train.pasta import prompt_ids, replay, to_seq


class Scripted(PastaEngine):
    """Main follows `script` (then <eos>); each thread takes `chunk` greedy byte tokens, then </async>."""

    def __init__(self, *a, script=(), chunk=5, **k):
        super().__init__(*a, **k)
        self.script, self.chunk, self.seen = list(script), chunk, []

    def choose(self, lay, sids, logits, sample):
        out = []
        for sid, row in zip(sids, logits):
            s = lay.streams[sid]
            self.seen.append((sid, lay.fed[s.last_row].position, row.clone()))
            n = sum(1 for o in s.outs if not o.forced)
            if sid == MAIN:
                out.append(self.script[n] if n < len(self.script) else self.tok.eos_id)
            else:
                out.append(int(row[:256].argmax()) if n < self.chunk else self.tok.token_id(ASYNC_END))
        return out


class ScriptedSkeleton(Scripted, SkeletonEngine):
    pass


def main_script(tok, tail=b"ok"):
    def promise(t):
        return [tok.token_id(PROMISE_OPEN), *t, tok.token_id(promise_close(10))]

    return [*promise(b"a"), *promise(b"b"), *promise(b"c"), tok.token_id(SYNC), *tail]


def run_steps(engine, prompt="facts: ab,cd,ef"):
    return drain(engine.run(Request(0, prompt)))


def test_forks_run_in_one_pass_per_step(tiny_model, tok):
    calls = []
    orig = tiny_model.forward

    def counting(*a, **k):
        calls.append(a[0].shape[0])
        return orig(*a, **k)

    eng = Scripted(tiny_model, tok, GenerationConfig(max_tokens=64), script=main_script(tok), chunk=9)
    tiny_model.forward = counting
    try:
        steps, c = run_steps(eng)
    finally:
        del tiny_model.forward
    assert c.status == "ok" and not c.events, c.events
    assert len(calls) == len(steps) == c.steps == c.critical_path_tokens
    threads = sorted({t.stream for t in c.tokens} - {MAIN})
    assert threads == [1, 2, 3]
    for tid in threads:  # a live thread has a query row in every pass from its fork to its end
        ks = sorted(
            {
                t.step_index
                for t in c.tokens
                if t.stream == tid and t.kind != "tag" or t.token_id == tok.token_id(ASYNC_END) and t.stream == tid
            }
        )
        assert all(tid in steps[k].streams for k in range(ks[0], ks[-1] + 1))
    assert max(len(s.streams) for s in steps) == 4  # main and three threads together
    assert c.theoretical_speedup > 1.3
    seq_len = len(c.output_ids)
    assert c.steps < seq_len


def test_engine_rows_equal_dense_recompute_with_training_mask(tiny_model, tok):
    eng = Scripted(tiny_model, tok, GenerationConfig(max_tokens=64), script=main_script(tok), chunk=6)
    _, c = run_steps(eng)
    prompt = prompt_ids(tok, "facts: ab,cd,ef")
    seq = to_seq(tok, prompt, c.output_ids)
    with torch.no_grad():
        dense = tiny_model.forward_dense(torch.tensor([seq.ids]), torch.tensor([seq.positions]), seq.mask[None])[0]
    lay, _ = replay(tok, prompt, c.output_ids)
    row_of = {(max(MAIN, f.stream), f.position): i for i, f in enumerate(lay.fed)}
    for sid, pos, logits in eng.seen:
        torch.testing.assert_close(logits, dense[row_of[(sid, pos)]].float(), atol=2e-4, rtol=1e-4)
    # chunk tokens never see a sibling; the closing sees all three chunks
    for f in lay.fed:
        if f.stream > 0:
            assert {lay.fed[j].stream for j in f.sees} <= {-1, MAIN, f.stream}
    sync = next(f for f in lay.fed if f.token_id == tok.token_id(SYNC))
    assert {lay.fed[j].stream for j in sync.sees} == {-1, 0, 1, 2, 3}


def assert_thread_in_parallel_equals_thread_alone(model, tok, chunk: int) -> None:
    """A chunk decoded in parallel gives the greedy tokens of that chunk decoded alone with the same
    visibility and positions (also run on real architectures by tests/runtime/test_hf_adapter.py)."""
    eng = Scripted(model, tok, GenerationConfig(max_tokens=64), script=main_script(tok), chunk=chunk)
    _, c = run_steps(eng)
    prompt = prompt_ids(tok, "facts: ab,cd,ef")
    lay, _ = replay(tok, prompt, c.output_ids)
    tid = 2  # the second chunk: sees the prompt, promise a, promise b, and itself
    first = next(i for i, f in enumerate(lay.fed) if f.stream == tid)
    context = lay.fed[first].sees  # prompt + main up to its promise + its <async>
    ids = [lay.fed[j].token_id for j in context]
    pos = [lay.fed[j].position for j in context]
    kv = model.new_kv_store(page_size=4)
    slots = kv.allocate(len(ids))
    vis = torch.zeros((len(ids), kv.num_slots), dtype=torch.bool)
    for r in range(len(ids)):
        vis[r, slots[: r + 1]] = True
    logits = model(torch.tensor(ids), torch.tensor(pos), torch.tensor(slots), vis, kv)[-1]
    alone, p = [], pos[-1]
    for _ in range(chunk):
        t = int(logits[:256].argmax())
        alone.append(t)
        p += 1
        slots.append(kv.allocate(1)[0])
        v = torch.zeros((1, kv.num_slots), dtype=torch.bool)
        v[0, slots] = True
        logits = model(torch.tensor([t]), torch.tensor([p]), torch.tensor([slots[-1]]), v, kv)[0]
    parallel = [t.token_id for t in c.tokens if t.stream == tid and t.kind == "content"]
    assert parallel == alone


def test_thread_in_parallel_equals_thread_alone(tiny_model, tok):
    assert_thread_in_parallel_equals_thread_alone(tiny_model, tok, chunk=8)


def decode_gold(model, tok, ex, style: str):
    """Run the engine with each stream's tokens scripted from the gold `style` annotation of `ex`:
    (completion, the annotation's ids + <eos>, the replayed layout)."""
    answer = tok.encode(annotate(ex.meta, tok, style)) + [tok.eos_id]
    lay, _ = replay(tok, prompt_ids(tok, ex.prompt), answer)
    per_stream = {sid: [o.token_id for o in s.outs if not o.forced] for sid, s in lay.streams.items()}

    class Gold(PastaEngine):
        def choose(self, lay, sids, logits, sample):
            return [per_stream[sid][sum(1 for o in lay.streams[sid].outs if not o.forced)] for sid in sids]

    return Gold(model, tok, GenerationConfig(max_tokens=128)).generate(Request(0, ex.prompt)), answer, lay


def test_gold_annotation_replayed_through_engine_gives_the_answer(tiny_model, tok):
    for name in ("word_facts", "map_numbers", "list_stats", "copy_line"):
        ex = get_task(name).examples("test", 1)[0]
        c, answer, _ = decode_gold(tiny_model, tok, ex, "fine")
        assert c.text == ex.answer and c.status == "ok" and not c.events
        assert c.output_ids == answer
        n_parts = len(ex.meta["parts"])
        assert len([n for n in c.graph["nodes"] if n["kind"] == "async"]) == n_parts
        assert (c.theoretical_speedup > 1.5) == (n_parts > 0)


def test_eager_closing_sees_no_chunk_and_shortens_the_critical_path(tiny_model, tok):
    """`eager` writes the closing part before `<sync/>`: the same answer text, its closing tokens see
    the prompt and the promises only (in the engine's layout, which training replays), and it takes
    fewer passes than `fine`, whose closing waits for every chunk."""
    for name in ("word_facts", "map_numbers", "list_stats"):
        ex = get_task(name).examples("test", 1)[0]
        steps = {}
        for style in ("fine", "eager"):
            c, answer, lay = decode_gold(tiny_model, tok, ex, style)
            assert c.text == ex.answer and c.status == "ok" and not c.events
            n_closing = len(tok.encode(ex.meta["closing"]))
            main = [f for f in lay.fed if f.stream == MAIN]
            # rows fed by main that produce the closing part's tokens: eager, before <sync/>; fine, after
            rows = main[-n_closing - 2 : -2] if style == "eager" else main[-n_closing:]
            assert any(lay.fed[j].stream > MAIN for f in rows for j in f.sees) == (style == "fine"), style
            steps[style] = c.steps
        assert steps["eager"] < steps["fine"], steps


def test_skeleton_expands_all_points_in_one_batch(tiny_model, tok):
    pasta = Scripted(tiny_model, tok, GenerationConfig(max_tokens=64), script=main_script(tok))
    skel = ScriptedSkeleton(tiny_model, tok, GenerationConfig(max_tokens=64), script=main_script(tok))
    sp, cp = run_steps(pasta)
    ss, cs = run_steps(skel)
    assert cs.text == cp.text and cs.status == "ok"  # same positions and visibility, another schedule
    assert "plan" in {s.phase for s in ss} and max(len(s.streams) for s in ss) == 3
    assert len(ss) > len(sp)  # waiting for the whole skeleton costs steps


def test_guards_cut_long_chunks_and_inline_over_max_threads(tiny_model, tok):
    eng = Scripted(
        tiny_model,
        tok,
        GenerationConfig(max_tokens=64),
        script=main_script(tok),
        chunk=50,
        max_chunk_tokens=12,
        max_threads=2,
    )
    _, c = run_steps(eng)
    kinds = [e["event"] for e in c.events]
    assert "max_threads" in kinds and "chunk_cut" in kinds and "chunk_overrun" in kinds
    assert isinstance(c.text, str) and len({t.stream for t in c.tokens}) == 3  # main + two threads
