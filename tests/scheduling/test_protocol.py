"""The shared scheduler: imports nothing above it; the replay implements its protocol."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from scheduling import SCHEDULERS, ServingState, get_scheduler
from simulator.models import ModelSpec
from simulator.replay import Replay, ReplayConfig
from simulator.workload import uniform
from tests.simulator.toy_traces import MODEL_META, one_second_cost, toy_part


def test_scheduling_imports_neither_runtime_nor_simulator_nor_torch():
    code = (
        "import sys, scheduling, scheduling.base, scheduling.fcfs, scheduling.sjf, scheduling.protocol; "
        "print(sorted(m for m in ('runtime', 'simulator', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_replay_implements_the_protocol():
    model = ModelSpec.from_trace_meta(MODEL_META)
    hw = toy_part()
    sim = Replay(uniform(2, 4, 3), one_second_cost(hw, model), model, hw, ReplayConfig())
    assert isinstance(sim, ServingState)
    assert sim.prompt_tokens_of([1]).tolist() == [4] and sim.max_tokens_of([0, 1]).tolist() == [3, 3]


class Queues:
    """The queue moves a hand-written ServingState makes (`running`, `waiting`, `preempted` lists);
    requests arrive in id order."""

    running: list[int]
    waiting: list[int]
    preempted: list[int]

    def admit(self, rid):
        self.waiting.remove(rid)
        self.running.append(rid)

    def preempt(self, rid):
        self.running.remove(rid)
        self.waiting.insert(0, rid)
        self.preempted.append(rid)

    def arrival_of(self, ids):
        return np.asarray(ids, float)


class Script(Queues):
    """A hand-written ServingState: 2-block requests of 4 query tokens in a 5-block pool."""

    def __init__(self, n: int) -> None:
        self.running: list[int] = []
        self.waiting: list[int] = list(range(n))
        self.preempted: list[int] = []

    pool_capacity_blocks = 5

    def next_tokens_and_blocks(self, ids, limit=None):
        q = np.full(len(ids), 4) if limit is None else np.minimum(4, limit)  # every pass a 4-token prefill
        return q, np.where(q > 0, 2, 0)

    def peak_blocks_of(self, ids):
        return np.full(len(ids), 3)

    def prompt_tokens_of(self, ids):
        return self.next_tokens_and_blocks(ids)[0]

    def max_tokens_of(self, ids):
        return self.next_tokens_and_blocks(ids)[0]

    def remaining_passes(self, ids):
        return np.asarray([10 - i for i in ids])


def test_any_state_object_is_scheduled_under_pool_and_caps():
    s = Script(4)
    assert isinstance(s, ServingState)
    fcfs, sjf = get_scheduler("fcfs"), get_scheduler("sjf")
    assert fcfs(max_seqs=8, max_batch_tokens=100).schedule(s) == {0: 4, 1: 4}  # 2 x 2 blocks of 5
    assert fcfs(max_seqs=8, max_batch_tokens=6).schedule(Script(4)) == {0: 4, 1: 2}  # the second a 2-token chunk
    assert fcfs(max_seqs=8, max_batch_tokens=6, chunked_prefill=False).schedule(Script(4)) == {0: 4}
    assert fcfs(max_seqs=1, max_batch_tokens=100).schedule(Script(4)) == {0: 4}
    assert fcfs(max_seqs=8, max_batch_tokens=100, reserve="peak").schedule(Script(4)) == {0: 4}  # 3 + 3 > 5
    assert sjf(max_seqs=8, max_batch_tokens=100, oracle=True).schedule(Script(4)) == {3: 4, 2: 4}  # fewest passes left
    assert sorted(SCHEDULERS) == ["fcfs", "sjf"]


class Table(Queues):
    """A hand-written ServingState from per-request columns: each request's next pass (`q` query
    tokens, a prefill or not: only a prefill is cut to a limit) and the pages it holds after it."""

    def __init__(self, q, prefill, blocks=None, pool=100, running=(), max_tokens=None, prompt=None):
        n = len(q)
        self.q, self.prefill, self.blocks = list(q), list(prefill), list(blocks or [1] * n)
        self.pool_capacity_blocks = pool
        self.max_tokens, self.prompt = list(max_tokens or [1] * n), list(prompt or [1] * n)
        self.running = list(running)
        self.waiting = [i for i in range(n) if i not in self.running]
        self.preempted: list[int] = []

    def next_tokens_and_blocks(self, ids, limit=None):
        q = [self.q[r] if limit is None or not self.prefill[r] else min(self.q[r], limit[i]) for i, r in enumerate(ids)]
        held = [self.blocks[r] if q[i] > 0 or r in self.running else 0 for i, r in enumerate(ids)]
        return np.array(q, np.int64), np.array(held, np.int64)

    def peak_blocks_of(self, ids):
        return np.array([self.blocks[r] for r in ids], np.int64)

    def prompt_tokens_of(self, ids):
        return np.array([self.prompt[r] for r in ids], np.int64)

    def max_tokens_of(self, ids):
        return np.array([self.max_tokens[r] for r in ids], np.int64)

    def remaining_passes(self, ids):
        raise AssertionError("only an oracle policy reads the future")


def test_a_cut_prefill_takes_at_most_its_own_pass():
    """Running prefills of 2 and 20 tokens under a budget of 10: the first runs whole (2), the
    second gets what is left (8), never the first more than its pass."""
    fcfs = get_scheduler("fcfs")
    assert fcfs(max_seqs=8, max_batch_tokens=10).schedule(Table([2, 20], [True, True], running=[0, 1])) == {0: 2, 1: 8}


def test_without_chunked_prefill_running_passes_are_never_cut():
    fcfs = get_scheduler("fcfs")
    state = Table([6, 6], [True, True], running=[0, 1])
    assert fcfs(max_seqs=8, max_batch_tokens=8, chunked_prefill=False).schedule(state) == {0: 6, 1: 6}
    state = Table([6, 6], [True, True], running=[0, 1])
    assert fcfs(max_seqs=8, max_batch_tokens=8).schedule(state) == {0: 6, 1: 2}


def test_a_pass_without_rows_runs_and_a_prefill_cut_to_nothing_sits_out():
    """A running request whose next pass has no rows of its own (a sync) stays in the batch with
    0 tokens; a prefill the budget leaves nothing for is not in it."""
    fcfs = get_scheduler("fcfs")
    state = Table([0, 8, 4], [False, True, True], running=[0, 1, 2])
    assert fcfs(max_seqs=8, max_batch_tokens=8).schedule(state) == {0: 0, 1: 8}


def test_admission_stops_at_the_first_request_that_does_not_fit():
    """No skipping (vLLM): request 1's 5 pages do not fit beside request 0's 2 in a 6-page pool,
    so request 2 (1 page) waits behind it."""
    fcfs = get_scheduler("fcfs")
    state = Table([4, 4, 4], [True] * 3, blocks=[2, 5, 1], pool=6)
    assert fcfs(max_seqs=8, max_batch_tokens=100).schedule(state) == {0: 4}
    assert state.waiting == [1, 2]


def test_an_empty_batch_takes_a_pass_wider_than_the_token_budget():
    """Unchunked, a 10-token pass exceeds the budget of 8: alone it still runs (else it never would);
    nothing joins it."""
    fcfs = get_scheduler("fcfs")
    state = Table([10, 2], [False, False])
    assert fcfs(max_seqs=8, max_batch_tokens=8, chunked_prefill=False).schedule(state) == {0: 10}


def test_sjf_ranks_by_max_tokens_then_prompt_and_preempts_the_longest():
    """SJF's key is (max_tokens, prompt): request 2 (10, 20) before 1 (10, 30) before 0 (50, 1),
    whatever the prompts alone say; `head` is that order's first; under pool pressure the running
    request with the largest max_tokens is the victim (FCFS: the latest admitted)."""
    fcfs, sjf = get_scheduler("fcfs"), get_scheduler("sjf")
    columns = {"max_tokens": [50, 10, 10], "prompt": [1, 30, 20]}
    state = Table([4, 4, 4], [True] * 3, **columns)
    assert sjf(max_seqs=8, max_batch_tokens=100).head(state) == 2
    assert fcfs(max_seqs=8, max_batch_tokens=100).head(state) == 0
    assert list(sjf(max_seqs=8, max_batch_tokens=100).schedule(state)) == [2, 1, 0]
    full = Table([1, 1, 1], [False] * 3, blocks=[3, 3, 3], pool=7, running=[0, 1, 2], **columns)
    assert sjf(max_seqs=8, max_batch_tokens=100).schedule(full) == {1: 1, 2: 1} and full.preempted == [0]
    full = Table([1, 1, 1], [False] * 3, blocks=[3, 3, 3], pool=7, running=[0, 1, 2], **columns)
    assert fcfs(max_seqs=8, max_batch_tokens=100).schedule(full) == {0: 1, 1: 1} and full.preempted == [2]
