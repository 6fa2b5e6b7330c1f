"""The shared schedulers (scheduling/base.py, sjf.py) on hand-written serving states, each test
killing mutants a mutation round on them left alive (named in the docstrings)."""

from __future__ import annotations

from scheduling import get_scheduler
from tests.scheduling.test_protocol import Table

FCFS, SJF = get_scheduler("fcfs"), get_scheduler("sjf")


def test_decodes_past_the_budget_run_whole_and_leave_nothing_to_admit():
    """Two running decodes of 6 rows (thread passes, never cut) under a budget of 8 both run whole;
    the budget is spent (8 - 12 < 0), so the waiting prefill gets no chunk, not a negative one.
    (Mutants: every running pass cut to the budget left, {0: 6, 1: 2}; the admission limit not
    floored at 0, request 2 admitted with -4 tokens.)"""
    state = Table([6, 6, 4], [False, False, True], running=[0, 1])
    assert FCFS(max_seqs=8, max_batch_tokens=8).schedule(state) == {0: 6, 1: 6}
    assert state.running == [0, 1] and state.waiting == [2] and state.preempted == []


class Paged(Table):
    """A Table whose pages follow the tokens a pass computes: a 16-token page per 16 tokens of
    its prefill so far (a chunk holds fewer pages than the whole pass)."""

    def next_tokens_and_blocks(self, ids, limit=None):
        q, _ = super().next_tokens_and_blocks(ids, limit)
        return q, -(-q // 16)


def test_a_cut_prefill_is_held_at_its_chunks_pages():
    """A running 20-token prefill under a budget of 16 in a 1-page pool: its 16-token chunk holds
    1 page, which fits; nothing is preempted. (Mutant: the pages of the whole pass kept after the
    cut, 2 > 1: the request preempted and admitted again.)"""
    state = Paged([20], [True], pool=1, running=[0])
    assert FCFS(max_seqs=8, max_batch_tokens=16).schedule(state) == {0: 16}
    assert state.preempted == [] and state.running == [0]


def test_sjf_ties_keep_queue_order():
    """Equal (max_tokens, prompt) keys: SJF admits in queue order, the head is the first waiting.
    (Mutant: ties broken by the latest in the queue first.)"""
    state = Table([4, 4, 4], [True] * 3, max_tokens=[5, 5, 5], prompt=[3, 3, 3])
    assert SJF(max_seqs=8, max_batch_tokens=100).head(state) == 0
    assert list(SJF(max_seqs=8, max_batch_tokens=100).schedule(state)) == [0, 1, 2]


def test_sjf_victim_ties_are_the_latest_admitted():
    """Three running requests of 3 pages in a 7-page pool with equal keys: SJF preempts the latest
    admitted, as FCFS does. (Mutant: ties broken by the earliest admitted, request 0.)"""
    state = Table([1, 1, 1], [False] * 3, blocks=[3, 3, 3], pool=7, running=[0, 1, 2], max_tokens=[5] * 3)
    assert SJF(max_seqs=8, max_batch_tokens=100).schedule(state) == {0: 1, 1: 1}
    assert state.preempted == [2]


def test_a_prefill_ahead_of_a_decode_leaves_the_decode_its_rows():
    """A running 20-token prefill (a later prefill of its own, SoT's expansion) admitted before a
    request decoding 6 thread rows, under a budget of 16: the thread pass runs whole and the
    prefill is cut to the 10 tokens it leaves, so the batch keeps to the budget. (The old code cut
    the prefill to the whole budget first, 16 + 6 = 22 > 16 batched tokens.)"""
    state = Table([20, 6, 4], [True, False, True], running=[0, 1])
    assert FCFS(max_seqs=8, max_batch_tokens=16).schedule(state) == {0: 10, 1: 6}
    assert state.waiting == [2]


def test_prefills_share_the_budget_in_running_order():
    """Two running prefills (20, 20) and a 2-row decode between them under a budget of 16: the
    decode's 2 rows first, then the first prefill takes the 14 left and the second none (it sits
    this pass out)."""
    state = Table([20, 2, 20], [True, False, True], running=[0, 1, 2])
    assert FCFS(max_seqs=8, max_batch_tokens=16).schedule(state) == {0: 14, 1: 2}
