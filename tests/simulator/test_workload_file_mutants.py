"""simulator/cluster/workload_file.py: what the workload-file tests left unpinned (a mutation round:
16 mutants, 9 killed by tests/simulator/test_workload_file.py, test_abuse_sim.py,
test_cluster_replicas_mutants.py and test_abuse_fs.py's huge-file test; 2 equivalent, 1 left,
4 gaps killed here; two survivors led to a bug, fixed in the module, whose tests are the last two).

Equivalent: dropping `np.where(is_bool, nan, ...)` (`frame.where(~is_bool)` has already made
each boolean NaN); `arrival_s[-1] > MAX_ARRIVAL_S` for `not arrival_s[-1] <= MAX_ARRIVAL_S`
(they differ on NaN only, and a span of finite arrivals from a first one >= 0 over a positive
finite --time-scale is never NaN: at most inf, which both refuse).

Left: dropping the clamp `max(live0 - left0, 0)` on a generation pass's generated KV. It binds
only where a generation pass holds less live KV than its prefill left (no shipped policy: window,
streaming and h2o hold their budget, tip evicts only generated steps), where neither version is
the proportional answer.

The bug (found from the survivors that scale a prefill's evictions by O / O0 and drop the clamp
above): a prefill that evicts (a window, streaming or h2o budget under the prompt) left its
stretched generation passes holding the whole prompt again (a window of 8 over a 12-token prompt,
stretched to itself: 12 live tokens a decode, not the 7 measured), and its own evictions were not
scaled with its prompt."""

from __future__ import annotations

import numpy as np
import pytest

from profiler.errors import UsageError
from simulator.cluster.workload_file import RequestLog, read_workload_file, stretch
from simulator.workload import load_workload
from tests.simulator.toy_traces import P, pasta, write_toy_trace

HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _log(prompts: list[int], outputs: list[int]) -> RequestLog:
    return RequestLog(np.zeros(len(prompts)), np.array(prompts), np.array(outputs), "w.csv")


@pytest.mark.parametrize(
    "rows,needle",
    [
        ("inf,8,4\n", "row 1: arrived_at is not a number (inf)"),  # not "the arrivals span nan s"
        ("0,8,4\n1,inf,4\n", "row 2: num_prefill_tokens is not a number (inf)"),
    ],
)
def test_an_infinite_value_is_not_a_number(tmp_path, rows, needle):
    """Kills `isnan` for `~isfinite`: inf is refused as not a number (a first arrival of inf would
    otherwise span inf - inf = NaN seconds, a length of inf be 'not in 1..1048576')."""
    path = tmp_path / "w.csv"
    path.write_text(HEADER + rows)
    with pytest.raises(UsageError) as error:
        read_workload_file(path)
    assert needle in str(error.value)


def test_a_bad_length_names_the_files_own_column(tmp_path):
    """Under --columns, the refusal names the column the user's file calls it (`in`), not ours."""
    path = tmp_path / "w.csv"
    path.write_text("ts,in,out\n0,8,4\n1,0,4\n")
    with pytest.raises(UsageError) as error:
        read_workload_file(path, "arrived_at=ts,num_prefill_tokens=in,num_decode_tokens=out")
    assert "row 2: in must be a whole number in 1..1048576, got 0" in str(error.value)


def test_every_stretched_pass_reads_at_least_its_own_rows(tmp_path):
    """PASTA with a one-token prompt (3 threads reading 9 of 4 live tokens) stretched to a
    two-token answer: the live KV shrinks to 1 token, 9 x 1 / 4 rounds to 2 reads, but the pass's
    3 query rows each read at least themselves (kills dropping `max(..., q)`)."""
    structure = load_workload(write_toy_trace(tmp_path / "s", [pasta(1, 3, 4)], [1]))
    w = stretch(structure, _log([1], [2]))
    assert w.query_tokens.tolist() == [1, 3] and w.live_kv_tokens.tolist() == [1, 1]
    assert w.kv_tokens_read.tolist() == [1, 3]


def _window(prompt: int, budget: int, decodes: int) -> list[P]:
    """The window policy over a prompt longer than its budget (a real capture's shape): the prefill
    evicts down to budget - 1 tokens, each decode adds one token and evicts one."""
    keep = budget - 1
    prefill = P("prefill", prompt, prompt * (prompt + 1) // 2, keep, 1, evicted=prompt - keep)
    return [prefill] + [P("decode", 1, budget, keep, 1, evicted=1) for _ in range(decodes)]


def test_a_stretch_to_the_sources_own_lengths_keeps_a_window(tmp_path):
    """A window of 8 over a 12-token prompt (7 live after the prefill evicts 5, each decode adding
    one and evicting one) stretched to its own lengths is itself. Was: every decode held the whole
    12-token prompt again (12 live, 14 reads) though the prefill had evicted 5 of it."""
    source = _window(12, 8, 11)
    structure = load_workload(write_toy_trace(tmp_path / "s", [source], [12]))
    w = stretch(structure, _log([12], [12]))
    assert w.live_kv_tokens.tolist() == [p.live for p in source]
    assert w.kv_tokens_read.tolist() == [p.kv for p in source]
    assert w.evicted_tokens.tolist() == [p.evicted for p in source]


def test_a_longer_prompt_scales_what_the_prefill_evicts_and_leaves(tmp_path):
    """The same window stretched to a 24-token prompt: the prefill takes in 24 tokens and keeps 14
    (7 x 2), so it evicts 10 (was 5: 24 in, 14 kept and 5 out do not add up); the decodes hold
    the 14 the prefill left, each adding one and evicting one (was: 24, the whole prompt)."""
    structure = load_workload(write_toy_trace(tmp_path / "s", [_window(12, 8, 11)], [12]))
    w = stretch(structure, _log([24], [12]))
    q, live, ev = w.query_tokens, w.live_kv_tokens, w.evicted_tokens
    assert (q[0], live[0], ev[0]) == (24, 14, 10) and q[0] - ev[0] == live[0]
    assert live[1:].tolist() == [14] * 11 and ev[1:].tolist() == [1] * 11
    assert w.kv_tokens_read[1:].tolist() == [16] * 11  # 8 reads of 7 live, scaled to 14 live
