"""Mutation-round tests of runtime/server.py and runtime/serve_capture.py: behaviour that
tests/runtime/test_server.py, test_same_scheduler.py, tests/scheduling/test_two_clocks.py and
tests/cli/test_serve_capture_cli.py did not pin (each test names the mutants it kills).

The round: 45 hand-made mutants. server.py, 31 (chunking and page counts of `_next`, peak pages,
admit/preempt bookkeeping, submission and `_unblock`, the pass's clock and record, first token and
finish, the load loop, gather's scored keys): 11 killed by those tests, 1 equivalent (a chunk's
`kv_read` left unzeroed: `chunk_inputs` marks every row of a chunk `skip`, so its inputs read 0
anyway), 19 gaps killed here. serve_capture.py, 14 (load limits, Poisson arrivals, the closed
loop, step rows, request rows, chunked prefill on/off): 1 killed by the CLI tests (chunked prefill
inverted, once the bug below was fixed; before, both branches chunked), 13 gaps killed here.
A bug found: `make_scheduler` left chunked prefill on without `--chunked-prefill` (fixed; the
first test here fails on the old code).

All on the tiny untrained model (`tiny_model`) with the server's `FakeClock`: no wall time."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from profiler.errors import UsageError
from profiler.schema import MIN_RATE
from runtime.engines import GenerationConfig, Request, SequentialEngine, Step
from runtime.engines.sequential import SequentialState
from runtime.serve_capture import LoadConfig, load_arrivals, make_scheduler, poisson_arrivals, step_rows, write_requests
from runtime.server import Entry, FakeClock, PassRecord, Server
from runtime.tokenizer import Tokenizer
from scheduling import get_scheduler

LONG = "abcdefghijklmnopqrstuvwxyz"  # a prompt of more rows than a 4-token budget
PROMPT = "abcdefg"  # 9 prompt tokens (3 pages of 4)
PAGE = 4


class NoStop(SequentialEngine):
    """Exactly `max_tokens` tokens a request, whatever the random model samples."""

    def is_stop(self, token_id: int) -> bool:
        return False


def seq(model, tok, max_tokens: int = 3) -> NoStop:
    return NoStop(model, tok, GenerationConfig(max_tokens=max_tokens, page_size=PAGE))


def fcfs(max_seqs: int = 4, max_batch_tokens: int = 64, **kw):
    return get_scheduler("fcfs")(max_seqs=max_seqs, max_batch_tokens=max_batch_tokens, **kw)


def pages(tokens: int) -> int:
    return math.ceil(tokens / PAGE)


def drive(server: Server, arrivals: list[tuple[float, str]], most: int = 200) -> list[PassRecord]:
    """`serve` by hand, at most `most` iterations (a mutant that never drains fails, not hangs)."""
    for rid, (a, p) in enumerate(arrivals):
        server.clock.wait_until(a)
        server.submit(Request(rid, p), a)
    passes = []
    for _ in range(most):
        if not server.busy:
            return passes
        rec = server.step()
        if rec is not None:
            passes.append(rec)
    raise AssertionError(f"still busy after {most} iterations")


def preempted_decoder(tiny_model, tok, passes: int = 2) -> tuple[Server, int]:
    """A server whose request 0 ran `passes` passes (a prefill, then decodes) and was preempted:
    (the server, tokens its readmission re-prefills)."""
    server = Server(seq(tiny_model, tok, 6), max_pages=64, scheduler=fcfs(), clock=FakeClock())
    server.submit(Request(0, PROMPT), 0.0)
    for _ in range(passes):
        server.step()
    server.preempt(0)
    return server, len(server.preempted_ids[0])


# ---------------------------------------------------------------------- serve_capture: the bug
def test_a_load_capture_chunks_prefills_only_when_told(tiny_model, tok):
    """`--chunked-prefill` off (LoadConfig's default, what meta.serving records) runs a prompt over
    the token budget whole; on, in chunks. Was: the scheduler's own default (on) whatever the flag,
    so every load capture chunked while its meta said it did not (and `solm validate` replayed it
    unchunked)."""
    for chunked in (False, True):
        load = LoadConfig(concurrency=1, max_batch_tokens=4, chunked_prefill=chunked)
        sched = make_scheduler(load)
        assert sched.chunked_prefill is chunked
        server = Server(seq(tiny_model, tok), max_pages=64, scheduler=sched, clock=FakeClock())
        out = server.serve([(0.0, LONG)])
        assert any(e.chunk for p in out["passes"] for e in p.entries) is chunked
        assert out["requests"][0].completion.status != "error"


# ---------------------------------------------------------------------- server: the protocol
def test_a_readmission_counts_its_replay_and_its_pass(tiny_model, tok):
    """A preempted decoder: its whole next pass is the replay plus its decode row, holding the
    pages of both; a budget of exactly that runs it whole (mutant: `limit <= full`, a chunk of the
    replay alone); a smaller one cuts the replay (mutant: the prompt alone is chunkable, so a
    decoding request's replay never is), holding every replay page at once (mutant: the pages it
    holds now, none)."""
    server, owed = preempted_decoder(tiny_model, tok)
    assert owed == server._state(0).n + 1  # the prompt and the one token fed back
    (q,), (b,) = server.next_tokens_and_blocks([0])
    assert (q, b) == (owed + 1, pages(owed + 1))
    (q,), (b,) = server.next_tokens_and_blocks([0], [owed + 1])
    assert (q, b) == (owed + 1, pages(owed + 1))
    (q,), (b,) = server.next_tokens_and_blocks([0], [3])
    assert (q, b) == (3, pages(owed))
    (q,), (b,) = server.next_tokens_and_blocks([0], [owed + 5])
    assert (q, b) == (owed + 1, pages(owed + 1))


def test_a_readmitted_chunk_holds_the_replay_pages_it_took(tiny_model, tok):
    """Readmitted, the replay's slots are allocated at once: a chunk of it allocates nothing more
    (mutant: counted the chunk's prompt pages on top)."""
    server, owed = preempted_decoder(tiny_model, tok)
    server.admit(0)
    held = server.store.pages_held
    assert held == pages(owed)
    (q,), (b,) = server.next_tokens_and_blocks([0], [3])
    assert (q, b) == (3, held)


def test_peak_blocks_round_up(tiny_model, tok):
    """`reserve="peak"` reserves the pages of prompt + max_tokens, a part page a whole one
    (mutant: floor)."""
    server = Server(seq(tiny_model, tok, 6), max_pages=64, scheduler=fcfs(), clock=FakeClock())
    server.submit(Request(0, PROMPT), 0.0)
    n = server._state(0).n
    assert (n + 6) % PAGE and server.peak_blocks_of([0]).tolist() == [pages(n + 6)]


# ---------------------------------------------------------------------- server: bookkeeping
def test_a_readmitted_request_keeps_its_first_start(tiny_model, tok):
    """`start_s` (queue_s's end) is the first time a request was scheduled, not its readmission
    (mutant: reset at every admission)."""
    server, owed = preempted_decoder(tiny_model, tok)
    server.clock.wait_until(5.0)
    rec = server.step()
    assert rec.admitted == [0] and rec.entries[0].recompute_tokens == owed
    t = server.tracked[0]
    assert t.start_s == 0.0 and t.preemptions == 1 and server.recomputes == 1


def tight(tiny_model, tok, max_batch_tokens: int = 64):
    """Two 9-token prompts, 8 tokens each, over 6 pages: both admitted, growing, one preempted."""
    server = Server(
        seq(tiny_model, tok, 8), max_pages=6, scheduler=fcfs(max_batch_tokens=max_batch_tokens), clock=FakeClock()
    )
    return server, server.serve([(0.0, PROMPT), (0.0, PROMPT)])


def test_a_pass_records_whom_it_preempted_and_admitted(tiny_model, tok):
    """Mutant: `preempt` left the victim out of the pass's record (the trace's
    `preempted_requests`)."""
    _, out = tight(tiny_model, tok)
    assert out["preemptions"] == 1
    assert [p.preempted for p in out["passes"] if p.preempted] == [[1]]
    assert [p.admitted for p in out["passes"] if p.admitted] == [[0, 1], [1]]


def test_a_chunked_replay_counts_each_chunks_rows(tiny_model, tok):
    """Under a 4-token budget the readmission's replay runs in chunks: each counts the replay rows
    it ran (mutant: the whole replay left, on every chunk), together the request's recompute; the
    pass after the replay counts its own row as its query (mutant: the replay rows too); chunks
    have no query rows or reads of their own."""
    server, out = tight(tiny_model, tok, max_batch_tokens=4)
    mine = [e for p in out["passes"] for e in p.entries if e.request_id == 1]
    replayed = [e for e in mine if e.recompute_tokens]
    assert len(replayed) > 2 and sum(e.recompute_tokens for e in replayed) == out["recompute_tokens"]
    assert out["recompute_tokens"] == server.tracked[1].state.recompute_tokens > 4
    assert all(e.recompute_tokens <= 4 for e in replayed)
    for e in mine:
        if e.chunk:
            assert e.query_tokens == 0 and e.kv_read == 0 and e.step is None
        else:
            assert e.query_tokens == e.step.query_tokens == 1 or e.step.step_index == 0


class QuietFirst(NoStop):
    """Its first pass (the prefill) reports no emitted token, as a pass that only plans."""

    def start(self, request, kv):
        st = SequentialState(self, request, kv)
        after = st.after

        def quiet(logits, attn):
            step = after(logits, attn)
            if step.step_index == 0:
                step.emitted = ()
            return step

        st.after = quiet
        return st


def test_first_token_is_the_end_of_the_first_pass_that_emitted(tiny_model, tok):
    """Mutants: the last emitting pass's end; the first pass's end, emitted or not. And a request's
    end is its last pass's end (mutant: its first token)."""
    for eng, first in (
        (seq(tiny_model, tok, 4), 0),
        (QuietFirst(tiny_model, tok, GenerationConfig(4, page_size=PAGE)), 1),
    ):
        server = Server(eng, max_pages=64, scheduler=fcfs(), clock=FakeClock(pass_s=1.0))
        out = server.serve([(0.0, PROMPT)])
        t, ends = out["requests"][0], [p.end_s for p in out["passes"]]
        assert len(ends) == 4 and t.first_token_s == ends[first] and t.end_s == ends[-1]


def test_a_request_that_fits_the_pool_exactly_is_served(tiny_model, tok):
    """A first pass of exactly the pool's pages is admitted (mutant: `>=`, an error row)."""
    server = Server(seq(tiny_model, tok, 3), max_pages=3, scheduler=fcfs(), clock=FakeClock())
    out = server.serve([(0.0, PROMPT)])
    n = server._state(0).n
    assert pages(n) == 3 and pages(n + 2) == 3  # every pass fits, only just
    assert out["requests"][0].completion.status != "error"


def test_a_refused_request_ends_when_it_was_refused(tiny_model, tok):
    """A request too large for the pool, arriving while a pass runs, gets its error row at the next
    pass boundary: its end is then, not its arrival (mutant). A closed loop's next client is told
    that end (mutant: the clock after the next pass)."""
    told = []

    def more(rid, t):
        told.append((rid, t))

    server = Server(seq(tiny_model, tok, 3), max_pages=3, scheduler=fcfs(), clock=FakeClock(pass_s=1.0))
    out = server.serve([(0.0, PROMPT), (0.5, LONG)], more)
    bad = out["requests"][1]
    assert bad.completion.status == "error" and "whole pool holds 3" in bad.completion.error
    assert bad.end_s == 1.0 and math.isnan(bad.start_s)
    assert sorted(told) == [(r, out["requests"][r].end_s) for r in (0, 1)] and told[0] == (1, 1.0)


def test_a_request_that_outgrows_the_pool_alone_gets_an_error_row(tiny_model, tok):
    """Its first pass fits, a later one needs more than the whole pool: with nothing else running it
    is failed (mutant: no `_unblock`, the server spins forever)."""
    server = Server(seq(tiny_model, tok, 8), max_pages=3, scheduler=fcfs(), clock=FakeClock())
    drive(server, [(0.0, PROMPT)])
    c = server.tracked[0].completion
    assert c.status == "error" and "its next pass needs 4 KV pages, the whole pool holds 3" in c.error
    assert server.store.pages_held == 0 and not server.preempted_ids


class Stuck:
    """Admits nothing; its head is the last request waiting (not the queue's first)."""

    def schedule(self, state):
        return {}

    def head(self, state):
        return state.waiting[-1]


def test_unblock_fails_the_schedulers_head(tiny_model, tok):
    """Mutant: the queue's first is failed, not the one the policy would admit next."""
    server = Server(seq(tiny_model, tok), max_pages=64, scheduler=Stuck(), clock=FakeClock())
    server.submit(Request(0, PROMPT), 0.0)
    server.submit(Request(1, PROMPT), 0.0)
    assert server.step() is None
    assert server.finished == [1] and server.waiting == [0]


def test_sjf_admits_the_shortest_prompt_first(tiny_model, tok):
    """SJF ranks by max_tokens then prompt length: with one sequence at a time the short prompt
    runs first (mutant: `prompt_tokens_of` negated, the long one)."""
    sjf = get_scheduler("sjf")(max_seqs=1, max_batch_tokens=64)
    server = Server(seq(tiny_model, tok, 2), max_pages=64, scheduler=sjf, clock=FakeClock())
    out = server.serve([(0.0, LONG), (0.0, PROMPT)])
    assert [e.request_id for p in out["passes"] for e in p.entries] == [1, 1, 0, 0]


class HostWork(Server):
    """Building the pass's rows takes 0.5 s of the (fake) clock."""

    def _pass_inputs(self, batch):
        out = super()._pass_inputs(batch)
        self.clock.t += 0.5
        return out


def test_forward_s_is_the_forward_alone(tiny_model, tok):
    """Mutant: `forward_s` from the pass's start, building the rows included."""
    server = HostWork(seq(tiny_model, tok, 2), max_pages=64, scheduler=fcfs(), clock=FakeClock(1.0, 0.25))
    passes = server.serve([(0.0, PROMPT)])["passes"]
    for p in passes:
        assert p.forward_s == pytest.approx(1.0 + 0.25 * p.rows)
        assert p.end_s - p.start_s == pytest.approx(p.forward_s + 0.5)


def test_arrivals_out_of_order_are_served_in_time_order(tiny_model, tok):
    """Mutant: `serve` took the arrival list in the order given (a later arrival first: nothing ran
    until it came)."""
    server = Server(seq(tiny_model, tok, 2), max_pages=64, scheduler=fcfs(), clock=FakeClock(pass_s=1.0))
    out = server.serve([(10.0, PROMPT), (0.0, PROMPT)])
    first = out["passes"][0]
    assert first.start_s == 0.0 and [e.request_id for e in first.entries] == [1]
    assert [t.arrival_s for t in out["requests"]] == [10.0, 0.0]


# ---------------------------------------------------------------------- serve_capture
def test_load_settings_at_their_limits():
    """A rate of exactly MIN_RATE is a rate (mutant: `>`); zero max_seqs is refused (mutant: `< 0`)."""
    LoadConfig(rate=MIN_RATE).check()
    LoadConfig(concurrency=1, max_seqs=1, max_batch_tokens=1).check()
    for bad in (dict(max_seqs=0), dict(max_batch_tokens=0)):
        with pytest.raises(UsageError, match="--max-seqs and --max-batch-tokens must be >= 1"):
            LoadConfig(concurrency=1, **bad).check()


def test_poisson_arrivals_start_at_zero_and_add_up_gaps():
    """The first request at 0 (mutant: its gap kept), then cumulative gaps of mean 1/rate (mutant:
    the gaps themselves, not increasing); seeded."""
    a = poisson_arrivals(2000, 4.0, seed=7)
    assert a[0] == 0.0 and np.all(np.diff(a) >= 0) and a == poisson_arrivals(2000, 4.0, seed=7)
    assert a[-1] / 1999 == pytest.approx(0.25, rel=0.1)
    assert poisson_arrivals(3, math.inf, seed=7) == [0.0] * 3


def test_a_closed_loop_sends_the_next_prompt_when_one_finishes():
    """C clients start at 0; each finish at t sends the next prompt, in order, at t (mutants: the
    last prompt first; at 0)."""
    first, more = load_arrivals(LoadConfig(concurrency=2), ["a", "b", "c", "d"], seed=0)
    assert first == [(0.0, "a"), (0.0, "b")]
    assert more(0, 1.5) == (1.5, "c") and more(1, 2.5) == (2.5, "d") and more(2, 3.0) is None


def test_step_rows_carry_the_pass_figures():
    """Every row of a pass carries the pass's rows, chunk and replay rows included (mutant: the
    entries' own query rows), its preemptions (mutant: its admissions) and its own recomputed rows
    (mutant: 0)."""
    step = Step(1, 4, "decode", (0,), 1, 13, 13, 1024, emitted=(5,))
    rec = PassRecord(
        index=3,
        start_s=1.0,
        end_s=1.5,
        rows=9,
        attention_kv_tokens=100,
        entries=[Entry(0, 0, 0, recompute_tokens=4, chunk=True), Entry(1, 1, 13, step=step, attention_kv_tokens=20)],
        preempted=[2],
        admitted=[0, 5],
        forward_s=0.4,
    )
    rows = step_rows(rec)
    assert sorted(rows) == [0, 1] and all(len(r) == 1 for r in rows.values())
    chunk, own = rows[0][0], rows[1][0]
    for r in (chunk, own):
        assert (r["batch_index"], r["batch_requests"], r["batch_query_tokens"], r["preempted_requests"]) == (3, 2, 9, 1)
        assert r["duration_s"] == 0.5 and r["forward_s"] == 0.4
    assert (chunk["recompute_tokens"], chunk["chunk"], chunk["step_index"]) == (4, True, -1)
    assert (own["recompute_tokens"], own["chunk"], own["query_tokens"], own["attention_kv_tokens"]) == (0, False, 1, 20)


class Recorder:
    def __init__(self) -> None:
        self.requests: dict[int, tuple[dict, list[dict]]] = {}

    def add_request(self, row, steps, tokens, graph) -> None:
        self.requests[row["request_id"]] = (row, steps)


def test_request_rows_of_a_load_run(tiny_model, tok):
    """A request that queued, one preempted and replayed in chunks, one refused: `queue_s` to its
    first scheduling (mutant: to its first token), its recomputed tokens (mutant: its preemptions),
    a refused request's start at its end (mutant: NaN); a cut run keeps a request whose passes are
    all recorded, chunk rows aside (mutant: chunk rows counted as passes, the request dropped)."""
    server, out = tight(tiny_model, tok, max_batch_tokens=4)
    huge = Server(seq(tiny_model, tok), max_pages=3, scheduler=fcfs(), clock=FakeClock())
    refused = huge.serve([(0.0, LONG)])["requests"][0]
    examples = [SimpleNamespace(prompt=p, answer="") for p in (PROMPT, PROMPT)]
    for whole_only in (False, True):
        w = Recorder()
        write_requests(w, out["passes"], out["requests"], examples, None, Tokenizer(), False, whole_only)
        assert sorted(w.requests) == [0, 1]
        row, steps = w.requests[1]
        t = out["requests"][1]
        assert row["queue_s"] == t.start_s - t.arrival_s > 0 and row["ttft_s"] > row["queue_s"]
        assert t.preemptions == 1 and row["recompute_tokens"] == t.state.recompute_tokens > 1
        assert any(s["chunk"] for s in steps)
    w = Recorder()
    write_requests(w, [], [refused], examples, None, Tokenizer(), False)
    row, _ = w.requests[0]
    assert row["status"] == "error" and row["start_s"] == refused.end_s and row["queue_s"] == 0.0
