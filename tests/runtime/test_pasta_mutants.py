"""What the PASTA engine records, pinned against its spec (runtime/engines/pasta.py's docstring):
position ids and reservations, what each token sees, the step, slot and stream of every token
record, the chunk graph, the stop conditions and the knobs' validation. Each stream's tokens are
scripted, so every figure follows from the script (tests written in a mutation-testing round:
each kills a mutant the other PASTA tests let through)."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.engines import GenerationConfig, Request, drain
from runtime.engines.pasta import MAIN, PastaEngine
from runtime.lang.pasta import ASYNC, ASYNC_END, PROMISE_OPEN, SYNC, promise_close
from runtime.model import TinyLM
from runtime.train.pasta import prompt_ids

PROMPT = "facts: ab,cd,ef"


class Script(PastaEngine):
    """Main writes `main` then <eos>; every thread writes `thread` then </async>. Records (stream,
    position of the row its token was sampled from) for every token sampled."""

    def __init__(self, *a, main=(), thread=(), **k):
        super().__init__(*a, **k)
        self.main, self.thread, self.rows = list(main), list(thread), []

    def choose(self, lay, sids, logits, sample):
        out = []
        for sid in sids:
            s = lay.streams[sid]
            self.rows.append((sid, lay.fed[s.last_row].position))
            n = sum(1 for o in s.outs if not o.forced)
            seq = self.main if sid == MAIN else self.thread
            out.append(seq[n] if n < len(seq) else self.tok.eos_id if sid == MAIN else self.tok.token_id(ASYNC_END))
        return out


def promise(tok, topic=b"a", n=10):
    return [tok.token_id(PROMISE_OPEN), *topic, tok.token_id(promise_close(n))]


def run(model, tok, max_tokens=64, cls=Script, **k):
    eng = cls(model, tok, GenerationConfig(max_tokens=max_tokens), **k)
    steps, c = drain(eng.run(Request(0, PROMPT)))
    return eng, steps, c


def of(c, stream):
    return [t for t in c.tokens if t.stream == stream]


def test_positions_follow_the_reservations(tiny_model, tok):
    """A promise closing at p: its thread writes <async> at p+1 and its content after it; main goes
    on at p+1+N. Unfed closing tags (</async>, <eos>) carry the position they would have had."""
    main = [*promise(tok, b"a", 10), *promise(tok, b"b", 20), tok.token_id(SYNC), *b"ok"]
    _, _, c = run(tiny_model, tok, main=main, thread=list(b"xyz"))
    n = c.prompt_tokens
    m = of(c, MAIN)
    assert [t.position_id for t in m[:3]] == [n, n + 1, n + 2]  # open, topic byte, close of promise a
    assert [t.position_id for t in m[3:6]] == [n + 13, n + 14, n + 15]  # promise b after a's 10 ids
    assert [t.position_id for t in m[6:]] == [n + 36, n + 37, n + 38, n + 39]  # <sync/> o k <eos>, b's 20 after
    for tid, close in ((1, n + 2), (2, n + 15)):
        assert [t.position_id for t in of(c, tid)] == list(range(close + 1, close + 6))  # <async> x y z </async>
    assert not c.events


def test_token_records_carry_streams_steps_and_slots(tiny_model, tok):
    """Each record: the streams its token saw (a thread its own, main every thread merged by a fed
    <sync/>); a thread's forced <async> has the step of the promise that forked it (its first
    content token is sampled in the next pass, beside main); fed tokens have distinct slots, the
    unfed closing tags none."""
    main = [*promise(tok, b"a"), *promise(tok, b"b"), tok.token_id(SYNC), *b"ok"]
    _, steps, c = run(tiny_model, tok, main=main, thread=list(b"xy"))
    m = of(c, MAIN)
    sync = next(i for i, t in enumerate(m) if t.token_id == tok.token_id(SYNC))
    assert all(t.visible_streams == (-1, MAIN) for t in m[: sync + 1])
    assert all(t.visible_streams == (-1, MAIN, 1, 2) for t in m[sync + 1 :])
    closes = [t for t in m if t.token_id == tok.token_id(promise_close(10))]
    for tid, close in zip((1, 2), closes):
        th = of(c, tid)
        assert th[0].token_id == tok.token_id(ASYNC) and th[-1].token_id == tok.token_id(ASYNC_END)
        assert all(t.visible_streams == (-1, MAIN, tid) for t in th)
        assert th[0].step_index == close.step_index and th[1].step_index == close.step_index + 1
        assert tid in steps[close.step_index + 1].streams and MAIN in steps[close.step_index + 1].streams
    unfed = {tok.token_id(ASYNC_END), tok.eos_id}
    slots = [t.kv_slot for t in c.tokens if t.token_id not in unfed]
    assert all(s >= 0 for s in slots) and len(set(slots)) == len(slots)
    assert all(t.kv_slot == -1 for t in c.tokens if t.token_id in unfed)
    assert steps[0].streams == (MAIN,) and steps[0].phase == "prefill"
    fed_sync = [s.step_index for s in steps if s.phase == "sync"]  # the one pass that feeds main's <sync/>
    assert len(fed_sync) == 1 and fed_sync[0] > m[sync].step_index


def test_the_graph_counts_every_token_and_links_chunks_to_the_sync_that_merged_them(tiny_model, tok):
    """Main segments split at each promise that forked and at each fed <sync/>; a chunk node counts
    its thread's records; a second <sync/> merges only the threads forked since the first."""
    main = [*promise(tok, b"a"), tok.token_id(SYNC), *b"x", *promise(tok, b"b"), tok.token_id(SYNC), *b"ok"]
    _, _, c = run(tiny_model, tok, main=main, thread=list(b"pq"))
    g = c.graph
    nodes = {n["id"]: n for n in g["nodes"]}
    links = {(e["source"], e["target"]) for e in g["links"]}
    assert nodes["prompt"]["tokens"] == c.prompt_tokens
    assert sum(n["tokens"] for n in g["nodes"] if n["kind"] == "main") == len(of(c, MAIN))
    for tid in (1, 2):
        assert nodes[f"thread:{tid}"]["tokens"] == len(of(c, tid)) == 4  # <async> p q </async>
    # main:0 forks thread 1 -> main:1 (the promise's tail is empty) -> the sync: main:2
    assert ("main:0", "thread:1") in links and ("main:0", "main:1") in links
    assert ("thread:1", "main:2") in links and ("main:1", "main:2") in links
    assert ("main:2", "thread:2") in links and ("thread:2", "main:4") in links
    assert len(g["links"]) == len(links) == 9 and len(nodes) == 8  # prompt, main:0-4, two threads
    assert [t.visible_streams for t in of(c, MAIN)][-1] == (-1, MAIN, 1, 2)


def test_main_goes_on_beside_a_thread_forked_after_a_fed_sync(tiny_model, tok):
    """A fed <sync/> stops main waiting: after it, main advances in the same passes as a thread
    forked later (only a pending <sync/> waits for live threads)."""
    main = [*promise(tok, b"a"), tok.token_id(SYNC), *promise(tok, b"b"), *b"xyz", tok.token_id(SYNC)]
    _, steps, c = run(tiny_model, tok, main=main, thread=list(b"pqrs"))
    x = next(t for t in of(c, MAIN) if t.token_id == ord("x"))
    th2 = of(c, 2)
    assert th2[1].step_index <= x.step_index < th2[-1].step_index  # main's x sampled while thread 2 writes
    assert any(set(s.streams) == {MAIN, 2} for s in steps)


def test_max_tokens_counts_content_tokens_only(tiny_model, tok):
    """`max_tokens` bounds content tokens: tags and <eos> do not count. Main ends at once (<eos>
    before <sync/>: the thread is still live); the thread's 4 content tokens stay under
    max_tokens=5, with 5 the request stops at the fifth."""
    main = [*promise(tok, b"a")]
    _, _, ok = run(tiny_model, tok, max_tokens=5, main=main, thread=list(b"wxyz"))
    assert (
        ok.status == "ok" and ok.stop_reason == "stop_token" and [e["event"] for e in ok.events] == ["end_before_sync"]
    )
    assert [t.token_id for t in of(ok, 1) if t.kind == "content"] == list(b"wxyz")
    _, _, cut = run(tiny_model, tok, max_tokens=5, main=main, thread=list(b"uvwxyz"))
    assert cut.status == "truncated" and cut.stop_reason == "max_tokens"
    assert [t.token_id for t in of(cut, 1) if t.kind == "content"] == list(b"uvwxy")


@pytest.mark.parametrize("max_total,sampled", [(0, 2 * 4), (5, 5)])
def test_max_total_tokens_bounds_every_sampled_token(tiny_model, tok, max_total, sampled):
    """A main thread of tags only (stray <sync/>s: no content) stops after `max_total_tokens`
    sampled tokens, 0 meaning twice `max_tokens`."""
    main = [tok.token_id(SYNC)] * 20
    _, _, c = run(tiny_model, tok, max_tokens=4, main=main, max_total_tokens=max_total)
    assert c.stop_reason == "max_tokens" and c.status == "truncated"
    assert len(c.output_ids) == sampled


def test_a_reservation_past_max_positions_stops_the_request(tiny_model, tok):
    """Main's next position jumps past a promise's reservation; a pass that would feed a position
    >= the model's max_positions is not run: the request stops (truncated) and every token fed
    has a position below it."""
    n = len(prompt_ids(tok, PROMPT))
    cfg = dataclasses.replace(tiny_model.cfg, max_positions=n + 13)
    model = TinyLM(cfg, seed=1).eval()
    main = [*promise(tok, b"a", 10), *b"xy"]
    _, _, c = run(model, tok, main=main, thread=list(b"pq"))
    assert c.stop_reason == "max_positions" and c.status == "truncated"
    # the close (n+2) and the thread's <async> (n+3) are fed; x, sampled from the close, would be
    # fed at n+13 (beside the thread's p at n+4)
    assert [t.token_id for t in of(c, MAIN)] == main[:4] and of(c, MAIN)[-1].position_id == n + 13
    assert [t.token_id for t in of(c, 1)] == [tok.token_id(ASYNC), ord("p")]
    assert [t.kv_slot for t in c.tokens] == [*range(n, n + 4), -1, -1]


def test_chunk_guards_flag_the_first_overrun_and_cut_at_max_chunk_tokens(tiny_model, tok):
    """A thread reserved 10 ids flags the first token written at or past them (`chunk_overrun`,
    once), and at `max_chunk_tokens` records (its <async> included) is cut: a forced </async> ends
    it. Main is never cut."""
    main = [*promise(tok, b"a", 10), *b"0123456789abcdefghij"]
    _, _, c = run(tiny_model, tok, main=main, thread=list(b"x" * 40), max_chunk_tokens=14)
    th = of(c, 1)
    assert len(th) == 15 and th[-1].token_id == tok.token_id(ASYNC_END) and th[-1].kv_slot == -1
    assert [t.kind for t in th[1:-1]] == ["content"] * 13
    (over,) = [e for e in c.events if e["event"] == "chunk_overrun"]
    first = next(i for i, t in enumerate(th) if t.position_id >= over["reserved_end"])
    assert over["stream"] == 1 and over["stream_token"] == first == 10
    assert [e["event"] for e in c.events] == ["chunk_overrun", "chunk_cut"]
    assert bytes(t.token_id for t in of(c, MAIN) if t.kind == "content" and t.token_id < 256) == b"0123456789abcdefghij"


def test_an_inlined_promise_feeds_its_async_and_samples_from_it(tiny_model, tok):
    """Over `max_threads` a promise is decoded inline: the interpreter feeds a forced <async> in
    main right after the close (same streams seen, the next position) and main's next token is
    sampled from that row, not from the close's."""
    main = [*promise(tok, b"a"), *promise(tok, b"b"), *b"mn", tok.token_id(ASYNC_END), tok.token_id(SYNC), *b"k"]
    eng, _, c = run(tiny_model, tok, main=main, thread=list(b"pq"), max_threads=1)
    m = of(c, MAIN)
    k = next(k for k, t in enumerate(m) if t.token_id == tok.token_id(ASYNC))
    close = m[k - 1]
    assert close.token_id == tok.token_id(promise_close(10)) and [e["event"] for e in c.events] == ["max_threads"]
    assert m[k].position_id == close.position_id + 1 and m[k].kv_slot >= 0
    assert m[k].visible_streams == close.visible_streams == (-1, MAIN) and m[k].step_index == close.step_index
    assert (MAIN, m[k].position_id) in eng.rows  # m sampled from the <async> row
    assert (MAIN, close.position_id) not in eng.rows


@pytest.mark.parametrize(
    "knob",
    [
        {"max_threads": 0},
        {"max_chunk_tokens": 0},
        {"max_threads": 2.5},
        {"max_chunk_tokens": "8"},
        {"max_total_tokens": -1},
        {"max_total_tokens": 1.5},
    ],
)
def test_bad_knobs_are_refused(tiny_model, tok, knob):
    with pytest.raises(ValueError, match=next(iter(knob))):
        PastaEngine(tiny_model, tok, **knob)


def test_the_smallest_knobs_are_accepted(tiny_model, tok):
    eng = PastaEngine(tiny_model, tok, GenerationConfig(max_tokens=3), max_threads=1, max_chunk_tokens=1)
    assert (eng.max_threads, eng.max_chunk_tokens, eng.max_total_tokens) == (1, 1, 6)


def test_end_before_sync_is_flagged_only_while_a_thread_is_live(tiny_model, tok):
    """<eos> without <sync/>: flagged when a thread is still writing; a finished (unmerged) chunk is
    no event, and its text is still in the answer after its promise."""
    late = [*promise(tok, b"a"), *b"0123456789"]
    _, _, c = run(tiny_model, tok, main=late, thread=list(b"pq"))
    assert not c.events and c.status == "ok" and c.text == "pq0123456789"
    _, _, c = run(tiny_model, tok, main=promise(tok, b"a"), thread=list(b"pq"))
    assert [e["event"] for e in c.events] == ["end_before_sync"] and c.text == "pq"


def test_only_the_prompt_is_prefilled_in_chunks(tiny_model, tok):
    """Served with prefill chunks of 3 rows, the prompt runs ahead in chunks and nothing else does:
    a pass of main and its threads is never cut, and the answer is what the request gives alone."""
    from runtime.server import FakeClock, Server
    from tests.runtime.test_server import ChunkingFCFS

    main = [*promise(tok, b"a"), *promise(tok, b"b"), *promise(tok, b"c"), tok.token_id(SYNC), *b"ok"]
    eng = Script(tiny_model, tok, GenerationConfig(max_tokens=64, page_size=4), main=main, thread=list(b"pqrstuvwxyz"))
    alone = eng.generate(Request(0, PROMPT))
    out = Server(eng, scheduler=ChunkingFCFS(3), clock=FakeClock(), max_pages=4096).serve([(0.0, PROMPT)])
    entries = [e for p in out["passes"] for e in p.entries]
    n = alone.prompt_tokens
    assert [e.query_tokens for e in entries if e.chunk] == [0] * (n // 3 - (n % 3 == 0))
    assert max(e.query_tokens for e in entries) == 4  # main and three threads in one pass
    assert out["requests"][0].completion.output_ids == alone.output_ids


class PreemptOnce:
    """Prefill chunks of 3 rows; on call `at` preempts request 0 and readmits it at once, noting the
    KV tokens it held then."""

    def __init__(self, at: int) -> None:
        self.at, self.calls, self.held = at, 0, -1

    def schedule(self, state) -> dict[int, int]:
        self.calls += 1
        for r in list(state.waiting):
            state.admit(r)
        if self.calls == self.at:
            self.held = state._state(0).kv.live_tokens
            state.preempt(0)
            state.admit(0)
        q, _ = state.next_tokens_and_blocks(state.running, [3] * len(state.running))
        return dict(zip(state.running, q.tolist()))


def serve_preempted(model, tok, at: int):
    from runtime.server import FakeClock, Server

    main = [*promise(tok, b"a"), *promise(tok, b"b"), tok.token_id(SYNC), *b"ok"]
    eng = Script(model, tok, GenerationConfig(max_tokens=64, page_size=4), main=main, thread=list(b"pqr"))
    alone = eng.generate(Request(0, PROMPT))
    policy = PreemptOnce(at)
    out = Server(eng, scheduler=policy, clock=FakeClock(), max_pages=4096).serve([(0.0, PROMPT)])
    assert out["preemptions"] == 1 and out["requests"][0].completion.output_ids == alone.output_ids
    return alone, out, policy.held


def test_a_prefill_preempted_between_chunks_starts_over(tiny_model, tok):
    """Preempted after one chunk of its prompt (nothing sampled yet): that chunk's pages are freed,
    the prompt is prefilled again from its first token (no recompute counted) and the answer and
    its slots are what the request gives alone."""
    alone, out, held = serve_preempted(tiny_model, tok, at=2)
    assert held == 3 and out["recompute_tokens"] == 0
    chunks = [e for p in out["passes"] for e in p.entries if e.chunk]
    assert len(chunks) == 1 + (alone.prompt_tokens - 1) // 3  # the lost chunk, then the prompt again
    assert [t.kv_slot for t in out["requests"][0].completion.tokens] == [t.kv_slot for t in alone.tokens]


def test_a_preempted_request_recomputes_exactly_the_kv_it_held(tiny_model, tok):
    """Preempted while its threads run: the readmission re-prefills the tokens it held, not the
    rows its next pass has yet to feed."""
    alone, out, held = serve_preempted(tiny_model, tok, at=12)
    assert held > alone.prompt_tokens and out["recompute_tokens"] == held


@pytest.mark.parametrize("max_threads", [1, 8])
@pytest.mark.parametrize("shape", ["forks", "inline", "nested"])
def test_the_kv_never_outgrows_the_requests_peak_reservation(tiny_model, tok, shape, max_threads):
    """`max_kv_tokens` (what a server with reserve="peak" keeps for the request) bounds the KV the
    request ever holds, also for an answer of nothing but promises: each forces an <async> that is
    fed beside the sampled tokens, however few threads are live at once."""
    fused = [tok.token_id('<promise topic="b'), tok.token_id(promise_close(10))]
    main, thread = {
        "forks": (fused * 40, []),  # every thread ends at once: promise after promise forks
        "inline": ([*promise(tok, b"a"), *fused * 40], list(b"x" * 100)),  # one live thread, the rest inline
        "nested": (fused * 40, fused * 40),  # threads inline promises of their own
    }[shape]
    held = {}

    class Holds(Script):
        def start(self, request, kv):
            held["state"] = st = super().start(request, kv)
            return st

    _, _, c = run(tiny_model, tok, max_tokens=20, cls=Holds, main=main, thread=thread, max_threads=max_threads)
    assert c.stop_reason == "max_tokens"
    assert c.peak_live_kv_tokens == len(held["state"].lay.fed) <= held["state"].max_kv_tokens()
