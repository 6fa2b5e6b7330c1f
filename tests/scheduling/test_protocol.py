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


class Script:
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

    def admit(self, rid):
        self.waiting.remove(rid)
        self.running.append(rid)

    def preempt(self, rid):
        self.running.remove(rid)
        self.waiting.insert(0, rid)
        self.preempted.append(rid)

    def arrival_of(self, ids):
        return np.asarray(ids, float)

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
