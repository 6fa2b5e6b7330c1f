"""Real workloads: the Splitwise CSV layout validated; structures stretched to each request's lengths."""

from __future__ import annotations

import numpy as np
import pytest

from profiler.errors import UsageError
from simulator.cluster.workload_file import WORKLOADS_DIR, read_workload_file, stretch
from simulator.workload import load_workload
from solm.cli import main
from tests.paths import check_not_a_file
from tests.simulator.toy_traces import pasta, seq, tip, write_toy_trace

GOOD = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,8,4\n0.5,16,2\n2.0,4,8\n"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,8,4\n0.5,-3,2\n", "row 2: num_prefill_tokens"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1.0,8,4\n0.5,3,2\n", "row 2: arrival 0.5 before"),
        ("time,num_prefill_tokens,num_decode_tokens\n0.0,8,4\n", "missing column arrived_at"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,8,x\n", "not a number"),
    ],
)
def test_bad_workload_files_are_one_line_exit_2(tmp_path, small_trace, capsys, text, needle):
    path = tmp_path / "w.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=needle.split(":")[0]):
        read_workload_file(path)
    code = main(
        [
            "simulate",
            "--workload",
            str(path),
            "--structure-from",
            str(small_trace),
            "--hardware",
            "h100-sxm",
            "--model",
            "llama-3-8b",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("solm simulate: error:") and needle in err[0]


def test_columns_mapping_and_time_scale(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("ts,in,out\n10.0,8,4\n12.0,16,2\n")
    log = read_workload_file(path, "arrived_at=ts,num_prefill_tokens=in,num_decode_tokens=out", time_scale=2.0)
    assert log.arrival_s.tolist() == [0.0, 1.0] and log.prompt_tokens.tolist() == [8, 16]


@pytest.mark.parametrize(
    "columns,needle",
    [
        (",,,", "--columns names no EXPECTED=FILE_COLUMN pair"),  # was: read as no mapping
        ("", "--columns names no EXPECTED=FILE_COLUMN pair"),
        ("arrived_at=ts,arrived_at=time", "--columns maps arrived_at twice"),  # was: the last one won
        ("arrived_at", "--columns takes EXPECTED=FILE_COLUMN pairs"),
        ("arrived_at=ts,num_prefill_tokens=ts", "reads arrived_at and num_prefill_tokens both from the column 'ts'"),
        ("x" * 5000 + "=ts", "... (5005 characters)"),
        ("arrived_at=", "--columns takes EXPECTED=FILE_COLUMN pairs"),  # not 'missing column arrived_at (as '')'
    ],
)
def test_bad_columns_mappings_are_refused(tmp_path, columns, needle):
    path = tmp_path / "w.csv"
    path.write_text("ts,in,out\n10.0,8,4\n")
    with pytest.raises(UsageError) as error:
        read_workload_file(path, columns)
    assert needle in str(error.value) and len(str(error.value)) < 300


HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


@pytest.mark.parametrize(
    "rows,needle",
    [
        ("", ": no requests"),  # the header alone
        ("0,0,4\n", "row 1: num_prefill_tokens must be a whole number in 1..1048576, got 0"),
        ("0,8,2.5\n", "row 1: num_decode_tokens must be a whole number in 1..1048576, got 2.5"),
        ("0,8,4\n1,1048577,4\n", "row 2: num_prefill_tokens must be a whole number in 1..1048576, got 1.04858e+06"),
        ("-1,8,4\n0,8,4\n", "row 1: negative arrival -1"),
    ],
)
def test_edge_workload_files_are_refused(tmp_path, rows, needle):
    path = tmp_path / "w.csv"
    path.write_text(HEADER + rows)
    with pytest.raises(UsageError) as error:
        read_workload_file(path)
    assert needle in str(error.value)


@pytest.mark.parametrize("time_scale", [0.0, -1.0, float("inf"), float("nan")])
def test_time_scale_must_be_positive_and_finite(tmp_path, time_scale):
    """Was never tested: 0 is refused up front (not 'the arrivals span inf s'), and inf is refused
    rather than putting every arrival at 0 s."""
    path = tmp_path / "w.csv"
    path.write_text(GOOD)
    with pytest.raises(UsageError, match="--time-scale must be a positive number"):
        read_workload_file(path, time_scale=time_scale)


def test_workload_limits_are_inclusive(tmp_path, monkeypatch):
    """The largest lengths, a burst of equal arrivals, arrivals spanning exactly MAX_ARRIVAL_S and
    exactly MAX_REQUESTS rows are all read."""
    from simulator.cluster import workload_file

    path = tmp_path / "w.csv"
    span = workload_file.MAX_ARRIVAL_S
    path.write_text(HEADER + f"0,1048576,1048576\n0,8,4\n{span!r},8,4\n")
    monkeypatch.setattr(workload_file, "MAX_REQUESTS", 3)
    log = read_workload_file(path)
    assert log.arrival_s.tolist() == [0.0, 0.0, span]
    assert log.prompt_tokens.tolist() == [1 << 20, 8, 8] and log.output_tokens.tolist() == [1 << 20, 4, 4]


def test_shipped_workloads_read():
    for name, rows in (("splitwise_code.csv", 8819), ("splitwise_conv.csv", 19366)):
        log = read_workload_file(WORKLOADS_DIR / name)
        assert len(log.prompt_tokens) == rows and log.arrival_s[0] == 0.0


def test_stretch_scales_prompt_and_output(tmp_path):
    structure = load_workload(write_toy_trace(tmp_path / "s", [seq(4, 8)], [4]))
    path = tmp_path / "w.csv"
    path.write_text(GOOD)
    w = stretch(structure, read_workload_file(path))
    assert w.prompt_tokens.tolist() == [8, 16, 4] and w.output_tokens.tolist() == [4, 2, 8]
    assert w.n_passes.tolist() == [1 + 3, 1 + 1, 1 + 7]  # prefill (first token) + one decode per other token
    first = w.offsets[:-1]
    assert w.query_tokens[first].tolist() == [8, 16, 4]  # the prefill carries the whole prompt
    assert w.kv_tokens_read[first[1]] == 16 * 17 // 2  # causal over the 16-token prompt
    assert np.all(w.alloc_kv_tokens >= w.live_kv_tokens)


def test_stretch_keeps_threads_and_live_fraction(tmp_path):
    structure = load_workload(write_toy_trace(tmp_path / "s", [pasta(6, 3, 4), tip(4, 4, 4)], [6, 4]))
    path = tmp_path / "w.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(f"{i}.0,12,30\n" for i in range(40)))
    w = stretch(structure, read_workload_file(path), seed=1)
    src = w.source_request_ids
    assert set(src.tolist()) == {0, 1}
    for r in range(w.n_requests):
        lo, hi = w.offsets[r], w.offsets[r + 1]
        if src[r] == 0:  # PASTA: three threads a pass, as measured
            assert 3 in w.query_groups[lo:hi].tolist()
        else:  # TIP: the generated part stays bounded by the evictions, not the whole output
            assert w.live_kv_tokens[hi - 1] < 12 + 30
    assert abs(int(w.output_tokens.mean()) - 30) <= 3


def test_workload_path_that_is_not_a_file(tmp_path):
    check_not_a_file(read_workload_file, tmp_path)


@pytest.mark.parametrize("output", [31, 7, 16])
def test_stretch_counts_each_eviction_once_where_the_live_kv_falls(tmp_path, output):
    """TIP's 8 evicted tokens (two steps of 4) scale with the output and land on the passes where the
    stretched live KV falls: a source pass repeated by a longer output is not counted twice, one
    skipped by a shorter output not lost."""
    structure = load_workload(write_toy_trace(tmp_path / "s", [tip(4, 4, 4)], [4]))
    path = tmp_path / "w.csv"
    path.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,4,{output}\n")
    w = stretch(structure, read_workload_file(path))
    ev, live = w.evicted_tokens, w.live_kv_tokens
    scale = (output - 1) / 15  # generation tokens wanted over the source's
    assert abs(int(ev.sum()) - 8 * scale) <= 2  # one token of rounding per eviction
    falls = np.flatnonzero(np.diff(live) < 0) + 1
    evicting = np.flatnonzero(ev)
    assert set(falls.tolist()) <= set(evicting.tolist())  # the live KV falls only by evicting
    if output >= 16:  # every source pass has a copy: the KV falls on each evicting pass
        assert evicting.tolist() == falls.tolist()
    assert np.all(live[:-1] - live[1:] <= ev[1:] + 1)  # never more than it evicts (one token of rounding)
