"""The batched server: every system's requests batched into one forward pass over one shared KV
pool give, greedy, exactly what each request gives alone; a pool too small preempts and
recomputes without losing a request; a request larger than the pool gets an error row."""

from __future__ import annotations

import re

import pytest

from profiler.errors import UsageError
from runtime.checkpoint import load_model
from runtime.engines import GenerationConfig, Request, get_engine
from runtime.server import FakeClock, Server
from runtime.tasks import get_task
from runtime.tokenizer import Tokenizer
from scheduling import get_scheduler

TOK = Tokenizer()
# system -> (knobs, max_tokens): small runs of the shipped checkpoints
SYSTEMS = {
    "sequential": ({}, 16),
    "pasta": ({}, 16),
    "skeleton": ({}, 16),
    "tip": ({}, 16),
    "planned_diffusion": ({}, 16),
    "masked_diffusion": ({"length": 12}, 16),
}


def engine(system: str, page_size: int = 4):
    cls = get_engine(system)
    model, _ = load_model(cls.default_model)
    knobs, max_tokens = SYSTEMS[system]
    return cls(model, TOK, GenerationConfig(max_tokens=max_tokens, page_size=page_size), **knobs)


def prompts(system: str, n: int = 4) -> list[str]:
    return [e.prompt for e in get_task(get_engine(system).default_task).examples("test", n, seed=3)]


def served(eng, ps: list[str], arrivals=None, **kw) -> dict:
    sched = kw.pop("scheduler", None) or get_scheduler("fcfs")(max_seqs=16, max_batch_tokens=4096)
    server = Server(eng, scheduler=sched, clock=FakeClock(), **kw)
    return server.serve(list(zip(arrivals or [0.0] * len(ps), ps)))


@pytest.mark.parametrize(
    "system,attention", [(s, "mask") for s in SYSTEMS] + [(s, "gather") for s in ("pasta", "tip", "planned_diffusion")]
)
def test_batched_equals_alone(system, attention):
    eng, ps = engine(system), prompts(system, 3)
    alone = [eng.generate(Request(i, p)) for i, p in enumerate(ps)]
    # staggered arrivals: a prefill joins passes that already decode other requests
    out = served(eng, ps, arrivals=[0.0, 0.0, 0.025], max_pages=4096, attention=attention)
    assert out["preemptions"] == 0
    assert max(sum(not e.chunk for e in p.entries) for p in out["passes"]) == len(ps)  # really batched
    for a, t in zip(alone, out["requests"]):
        c = t.completion
        assert c.status == a.status and c.output_ids == a.output_ids and c.text == a.text
        assert [x.stream for x in c.tokens] == [x.stream for x in a.tokens]
    for p in out["passes"]:  # a request's kv reads are its own rows over its own slots
        assert all(e.step.kv_tokens_read == e.kv_read for e in p.entries if e.step)
        assert all(e.step.host_s > 0 for e in p.entries if e.step)  # its own rows and `after`, timed


def test_alone_steps_record_their_host_work():
    eng = engine("pasta")
    steps = list(eng.run(Request(0, prompts("pasta", 1)[0])))
    assert steps and all(0 < s.host_s < 1 for s in steps) and all("host_s" in s.as_row() for s in steps)


@pytest.mark.parametrize("system", ["sequential", "pasta", "tip", "planned_diffusion"])
def test_tight_pool_preempts_recomputes_and_text_matches(system):
    eng, ps = engine(system), prompts(system, 3)
    alone = [eng.generate(Request(i, p)) for i, p in enumerate(ps)]
    need = max(a.peak_kv_bytes for a in alone) // (eng.model.kv_bytes_per_token * 4)
    out = served(eng, ps, max_pages=need + 4)
    assert out["preemptions"] > 0 and out["recomputes"] > 0 and out["recompute_tokens"] > 0
    assert [t.completion.status for t in out["requests"]] == [a.status for a in alone]  # none lost
    for a, t in zip(alone, out["requests"]):
        assert t.completion.text == a.text
    assert sum(e.recompute_tokens for p in out["passes"] for e in p.entries) == out["recompute_tokens"]


def test_request_larger_than_the_pool_gets_an_error_row():
    eng = engine("sequential")
    ps = prompts("sequential", 3)
    huge = " ".join(ps) * 3
    out = served(eng, [ps[0], huge, ps[1]], max_pages=40)  # 160 tokens: each prompt fits, `huge` never does
    status = [t.completion.status for t in out["requests"]]
    assert status[1] == "error" and "KV pages" in out["requests"][1].completion.error
    assert status[0] != "error" and status[2] != "error"


def test_gather_scores_fewer_keys_than_the_mask():
    eng, ps = engine("sequential"), prompts("sequential")
    mask = served(eng, ps, max_pages=4096, attention="mask")
    gather = served(eng, ps, max_pages=4096, attention="gather")
    read = sum(e.kv_read for p in gather["passes"] for e in p.entries)
    assert sum(p.attention_kv_tokens for p in gather["passes"]) < sum(p.attention_kv_tokens for p in mask["passes"])
    assert sum(p.attention_kv_tokens for p in gather["passes"]) >= read


def test_bad_budgets_are_clear_errors():
    eng = engine("sequential")
    with pytest.raises(ValueError, match="smaller than one page"):
        Server(eng, kv_budget_mib=1e-6)
    with pytest.raises(ValueError, match="kv_budget_mib must be > 0"):
        Server(eng, kv_budget_mib=-1)
    with pytest.raises(ValueError, match="attention"):
        Server(eng, kv_budget_mib=1, attention="dense")
    # was: ValueError "cannot convert float NaN to integer" (1e308 MiB in bytes is inf), exit 1
    for huge in (1e308, 1e15):
        with pytest.raises(UsageError, match=re.escape(f"a KV budget of {huge:g} MiB does not fit")):
            Server(eng, kv_budget_mib=huge)
    srv = Server(eng, kv_budget_mib=0.5)  # fractions of a MiB are budgets too
    assert srv.pool_capacity_blocks == int(0.5 * 2**20 // srv.store.page_bytes)


class ChunkingFCFS:
    """A minimal policy that admits everything and cuts every prefill to `chunk` rows a pass
    (the protocol's `limit`), to check the runtime's chunked prefill on its own."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk

    def schedule(self, state) -> dict[int, int]:
        for r in list(state.waiting):
            state.admit(r)
        q, _ = state.next_tokens_and_blocks(state.running, [self.chunk] * len(state.running))
        return dict(zip(state.running, q.tolist()))


@pytest.mark.parametrize("system", ["sequential", "pasta", "tip", "planned_diffusion"])
def test_chunked_prefill_equals_alone(system):
    eng, ps = engine(system), prompts(system, 2)
    alone = [eng.generate(Request(i, p)) for i, p in enumerate(ps)]
    out = served(eng, ps, max_pages=4096, scheduler=ChunkingFCFS(7))
    chunks = [e for p in out["passes"] for e in p.entries if e.chunk]
    assert chunks and all(not e.query_tokens and not e.step for e in chunks)
    for a, t in zip(alone, out["requests"]):
        assert t.completion.output_ids == a.output_ids and t.completion.text == a.text


class PreemptFirstPass:
    """Admits everything; on its first call preempts the last request admitted, before that request
    ran any pass; then runs every running request's whole next pass."""

    def __init__(self) -> None:
        self.calls = 0

    def schedule(self, state) -> dict[int, int]:
        self.calls += 1
        for r in list(state.waiting):
            state.admit(r)
        if self.calls == 1:
            state.preempt(state.running[-1])
        q, _ = state.next_tokens_and_blocks(state.running)
        return dict(zip(state.running, q.tolist()))


def test_a_request_preempted_before_its_first_pass_owes_no_recompute():
    """Nothing of it was computed, so its readmission re-prefills nothing: no recompute counted,
    and its answer is what it gives alone."""
    eng, ps = engine("sequential"), prompts("sequential", 2)
    alone = [eng.generate(Request(i, p)) for i, p in enumerate(ps)]
    out = served(eng, ps, max_pages=4096, scheduler=PreemptFirstPass())
    assert out["preemptions"] == 1 and out["requests"][1].preemptions == 1
    assert out["recomputes"] == 0 and out["recompute_tokens"] == 0
    assert [t.completion.output_ids for t in out["requests"]] == [a.output_ids for a in alone]


class PreemptAForkedRequest:
    """Runs request 0 (PASTA) whole passes until its next pass has several rows (threads forked),
    preempts it there and readmits it at once, offering a budget of one row more than its replay:
    less than its whole next pass, more than the replay a chunk may take."""

    def __init__(self) -> None:
        self.replay = self.offered = 0

    def schedule(self, state) -> dict[int, int]:
        for r in list(state.waiting):
            state.admit(r)
        st = state._state(0)
        if not self.replay and st.passes_done and st.next_rows() > 1:
            state.preempt(0)
            self.replay = len(state.preempted_ids[0])
            state.admit(0)
            q, _ = state.next_tokens_and_blocks([0], [self.replay + 1])
            self.offered = int(q[0])
            return {0: self.offered}
        q, _ = state.next_tokens_and_blocks(state.running)
        return dict(zip(state.running, q.tolist()))


def test_a_readmitted_request_chunks_no_more_than_its_replay():
    """A readmission offered a budget between its replay and its whole next pass re-prefills its
    replay alone in that pass (a chunk never takes rows of the pass after the replay), and the
    answer is what the request gives alone."""
    eng, ps = engine("pasta"), prompts("pasta", 1)
    alone = eng.generate(Request(0, ps[0]))
    policy = PreemptAForkedRequest()
    out = served(eng, ps, max_pages=4096, scheduler=policy)
    assert policy.replay > 0 and out["preemptions"] == 1
    assert policy.offered == policy.replay  # the tokens the scheduler counts for the chunk
    chunk = next(e for p in out["passes"] for e in p.entries if e.chunk)
    assert chunk.recompute_tokens == policy.replay
    assert out["requests"][0].completion.output_ids == alone.output_ids
