"""Real workloads: the Splitwise CSV layout validated; structures stretched to each request's lengths."""

from __future__ import annotations

import numpy as np
import pytest

from profiler.errors import UsageError
from simulator.cluster.workload_file import WORKLOADS_DIR, RequestLog, read_workload_file, stretch
from simulator.workload import load_workload
from solm.cli import main
from tests.paths import check_not_a_file
from tests.simulator.toy_traces import P, pasta, seq, tip, write_toy_trace

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
        ("0,8,4\n1,1048577,4\n", "row 2: num_prefill_tokens must be a whole number in 1..1048576, got 1048577"),
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


def _log(prompts: list[int], outputs: list[int]) -> RequestLog:
    return RequestLog(np.zeros(len(prompts)), np.array(prompts), np.array(outputs), "w.csv")


def test_stretch_pass_shapes_follow_the_source(tmp_path):
    """seq(4, 8) stretched to a prompt of 8 and 15 tokens (the generated part doubled: 14 over the
    source's 7): one prefill over the whole prompt, each decode pass twice, each one query row
    reading its live KV, the generated KV twice the source's, pages of 16 tokens."""
    structure = load_workload(write_toy_trace(tmp_path / "s", [seq(4, 8)], [4], quality=[0.9]))
    w = stretch(structure, _log([8], [15]))
    assert w.query_tokens.tolist() == [8] + [1] * 14
    assert w.live_kv_tokens.tolist() == [8] + [8 + 2 * i for i in range(1, 8) for _ in range(2)]
    assert w.live_kv_tokens[-1] == 8 + 14  # the prompt and the generated tokens the last pass reads
    assert w.kv_tokens_read.tolist() == [8 * 9 // 2] + w.live_kv_tokens[1:].tolist()
    assert w.alloc_kv_tokens.tolist() == [-(-x // 16) * 16 for x in w.live_kv_tokens.tolist()]
    assert w.output_tokens.tolist() == [15] and np.isnan(w.quality_score).all()  # not the source's 0.9


@pytest.mark.parametrize("output,passes,emitted", [(1, 1, 1), (2, 2, 4), (5, 3, 7)])
def test_stretch_rounds_the_generation_passes(tmp_path, output, passes, emitted):
    """PASTA (5 generation passes emitting 13 tokens, 3 threads a pass) stretched to 1, 2 and 5
    tokens: round(5 x (O - 1) / 13) generation passes, at least one where O > 1 and none for a
    one-token answer (its prefill alone, without a warning); the output is what those passes emit."""
    import warnings

    structure = load_workload(write_toy_trace(tmp_path / "s", [pasta(6, 3, 4)], [6]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = stretch(structure, _log([6], [output]))
    assert w.n_passes.tolist() == [passes] and w.output_tokens.tolist() == [emitted] == [int(w.emits.sum())]


def test_stretch_scales_each_prefill_chunk(tmp_path):
    """A prompt prefilled in two chunks of 4: stretched to 16 tokens each chunk is 8 query tokens
    and the live KV 8 then 16; stretched to 1 token no pass has 0 query tokens or 0 live KV."""
    chunked = [P("prefill", 4, 10, 4, 0), P("prefill", 4, 26, 8, 1)] + [P("decode", 1, 8 + i, 8 + i, 1) for i in (1, 2)]
    structure = load_workload(write_toy_trace(tmp_path / "s", [chunked], [8]))
    w = stretch(structure, _log([16], [3]))
    assert w.query_tokens[:2].tolist() == [8, 8] and w.live_kv_tokens[:2].tolist() == [8, 16]
    w = stretch(structure, _log([1], [3]))
    assert w.query_tokens.min() >= 1 and w.live_kv_tokens.min() >= 1 and w.live_kv_tokens[1] == 1


def test_stretch_evictions_are_each_requests_own(tmp_path):
    """Two requests from TIP (two evictions of 4 tokens): each evicts round(4 x G / G0) tokens twice,
    the second request's first pass nothing of the first request's."""
    structure = load_workload(write_toy_trace(tmp_path / "s", [tip(4, 4, 4)], [4]))
    w = stretch(structure, _log([4, 4], [7, 31]))  # G / G0: 6 / 15 and 30 / 15
    assert w.evicted_tokens.min() >= 0
    for r, each in enumerate([2, 8]):  # 1.6 and 8 tokens an eviction, rounded
        ev = w.evicted_tokens[w.offsets[r] : w.offsets[r + 1]]
        assert ev[ev > 0].tolist() == [each, each]


def test_stretch_takes_structures_only_from_usable_requests(tmp_path):
    """Not a request without a prefill, with its prefill alone, emitting nothing or in error; the
    source ids are the structure trace's own; none usable is one UsageError."""
    import dataclasses

    unusable = [
        [P("decode", 1, 4, 4, 1), P("decode", 1, 5, 5, 1)],  # no prefill
        [P("prefill", 4, 10, 4, 1)],  # a one-token answer: no generation pass
        [P("prefill", 4, 10, 4, 0), P("decode", 1, 4, 4, 0)],  # emits nothing
        seq(4, 3),  # made an error below
    ]
    structure = load_workload(write_toy_trace(tmp_path / "s", [*unusable, seq(4, 3)], [4] * 5))
    structure = dataclasses.replace(structure, request_ids=np.arange(10, 15), status=("ok", "ok", "ok", "error", "ok"))
    w = stretch(structure, _log([8] * 30, [4] * 30))
    assert set(w.source_request_ids.tolist()) == {14}
    none = dataclasses.replace(structure, status=("ok", "ok", "ok", "error", "error"))
    with pytest.raises(UsageError, match="no request with a prefill and generation passes"):
        stretch(none, _log([8], [4]))


def test_stretch_draws_each_requests_structure_independently(tmp_path):
    """Sources are drawn per request, not in runs: both structures among the first and the last half."""
    structure = load_workload(write_toy_trace(tmp_path / "s", [seq(4, 4), seq(4, 6)], [4, 4]))
    src = stretch(structure, _log([8] * 40, [4] * 40), seed=1).source_request_ids
    assert set(src[:20].tolist()) == set(src[20:].tolist()) == {0, 1}
