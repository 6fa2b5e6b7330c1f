"""profiler/reader.py and profiler/validate.py: what their tests left unpinned (a mutation round:
45 mutants; 26 killed by tests/profiler/test_trace.py, test_reader_edges.py, test_selective_read.py,
tests/test_abuse_io.py and tests/cli/test_bad_input.py; 4 equivalent, named here; 15 gaps, killed
here). The round found one bug, fixed in validate.py: a re-prefill's chunk rows read as passes by
the back-in-time check (test_trace.py's test_a_re_prefill_chunk_after_a_preemption_is_not_back_in_time).

Equivalent: `_depth` walking on past a node deeper than the limit instead of stopping (the depth it
returns is over the limit either way); `Trace.kind` defaulting to "simulated" (read_meta requires
`kind`); a request with no step or token rows counted as 1 row, not 0 (the count is read only
where the request has rows); the back-in-time check taking rows with equal (request, step) as
already in order (the stable sort it skips would leave them where they are)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from profiler.reader import MAX_META_BYTES, TraceError, read_trace
from profiler.validate import MAX_TIME_S, graph_problems, problems
from profiler.writer import TraceWriter
from tests.profiler.test_reader_edges import SHIPPED
from tests.profiler.test_trace import META, _rows


@pytest.fixture
def t(tmp_path) -> Path:
    return Path(shutil.copytree(SHIPPED, tmp_path / "t"))


def _edit_meta(t: Path, **fields) -> None:
    meta = json.loads((t / "meta.json").read_text())
    (t / "meta.json").write_text(json.dumps({**meta, **fields}))


# ---- reader ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field,value,says",
    [
        ("complete", "no", "field 'complete' must be a JSON boolean, got str"),  # was (mutant): read as complete
        ("simulation", "replay", "field 'simulation' must be a JSON object, got str"),
    ],
)
def test_meta_fields_readers_rely_on_are_typed(t, field, value, says):
    """(mutants: "complete" or "simulation" left out of META_TYPES)"""
    _edit_meta(t, **{field: value})
    with pytest.raises(TraceError, match=says):
        read_trace(t)


def _rewrite_column(t: Path, column: str, array) -> None:
    tab = pq.read_table(t / "requests.parquet")
    pq.write_table(tab.set_column(tab.column_names.index(column), column, array), t / "requests.parquet")


def test_a_float_column_of_the_null_type_reads_as_nan(t):
    """An all-null column written without a type (pyarrow's null type casts to any): NaN, not a
    text-for-numbers refusal (mutant: the null type read as text)."""
    n = pq.read_metadata(t / "requests.parquet").num_rows
    _rewrite_column(t, "quality_score", pa.nulls(n))
    assert read_trace(t).requests["quality_score"].isna().all()


def test_a_dictionary_encoded_text_column_reads_as_text(t):
    """What a pandas categorical writes (mutant: a dictionary of text not read as text: refused)."""
    full = read_trace(t).requests
    _rewrite_column(t, "status", pq.read_table(t / "requests.parquet").column("status").dictionary_encode())
    assert pa.types.is_dictionary(pq.read_schema(t / "requests.parquet").field("status").type)
    assert read_trace(t).requests["status"].tolist() == full["status"].tolist()


def test_a_part_not_named_as_the_writer_names_it_is_one_trace_error(tmp_path):
    """(mutant: the ValueError of int("x") not caught)"""
    w = TraceWriter(tmp_path / "u", META)
    w.add_request(*_rows(0))
    (w.dir / "parts" / "request-x.parquet").write_bytes(b"")
    with pytest.raises(TraceError, match=r"request-x.parquet: not a request part name"):
        read_trace(w.dir)


def test_a_graph_json_may_be_larger_than_a_meta_json(t):
    """graph.json is held to MAX_GRAPH_BYTES, not meta.json's 16 MiB (mutant: the meta limit; a
    simulated trace at scale writes a graph.json larger than that)."""
    graphs = json.loads((t / "graph.json").read_text())
    graphs["0"]["graph"] = {"pad": "x" * MAX_META_BYTES}
    (t / "graph.json").write_text(json.dumps(graphs))
    assert (t / "graph.json").stat().st_size > MAX_META_BYTES
    assert len(read_trace(t).graphs[0]["graph"]["pad"]) == MAX_META_BYTES


@pytest.mark.parametrize(
    "shared",
    [
        {"structures": {"0": {}}, "request_ids": [0], "structure_of": [1]},  # no structure 1
        {"request_ids": [0], "structure_of": [0]},  # no structures
    ],
)
def test_a_shared_graph_json_naming_a_missing_structure_is_one_trace_error(t, shared):
    """(mutants: a missing structure read as an empty graph; the KeyError not caught)"""
    (t / "graph.json").write_text(json.dumps({"format": "shared", **shared}))
    with pytest.raises(TraceError, match="graph.json keys must be request ids"):
        read_trace(t)


def test_a_file_is_not_a_trace_directory(t):
    """(mutant: the directory test dropped: "no meta.json")"""
    with pytest.raises(TraceError, match=r"meta.json: not a directory \(a trace is a directory"):
        read_trace(t / "meta.json")


# ---- validator ------------------------------------------------------------------------------
def _trace(tmp_path):
    w = TraceWriter(tmp_path / "v", META)
    for rid in (0, 1):
        w.add_request(*_rows(rid))
    t = read_trace(w.close())
    assert problems(t) == []
    return t


def test_a_stream_id_beyond_int64_is_a_problem(tmp_path):
    """Stream ids of up to 18 digits fit an int64; 19 may not (mutant: any number of digits)."""
    t = _trace(tmp_path)
    t.steps = t.steps.assign(streams=["9" * 18] * len(t.steps))
    assert problems(t) == []
    t.steps = t.steps.assign(streams=["0", "9" * 19] * (len(t.steps) // 2))
    assert problems(t) == [f"steps: streams must be comma-separated stream ids, got '{'9' * 19}'"]


def test_a_time_of_max_time_s_is_valid_a_later_one_is_not(tmp_path):
    """MAX_TIME_S is the latest time a trace may hold, not the first it may not (mutant: >= for >)."""
    t = _trace(tmp_path)
    base = t.requests
    t.requests = base.assign(arrival_s=[MAX_TIME_S, 0.0])
    assert problems(t) == []
    t.requests = base.assign(arrival_s=[MAX_TIME_S * (1 + 1e-15), 0.0])
    assert problems(t) == ["requests: arrival_s infinite, negative or missing (or over 1e+15 s) for requests [0]"]


def test_an_infinite_counter_time_is_one_problem(tmp_path):
    """t_s has its own check; the infinite-values check reads the other counters (mutant: t_s read
    by both, one fault reported twice)."""
    t = _trace(tmp_path)
    t.counters = pd.DataFrame({"t_s": [0.0, float("inf")], "source": "host", "cpu_percent": [1.0, 2.0]})
    assert problems(t) == ["counters: t_s infinite, negative or NaN"]


# a request's chunk graph (_rows's) with one change each
BAD_GRAPHS = [
    # a link naming an id no node can have (a list): a missing node, not a TypeError in has_cycle
    # (mutant: such a link kept as an edge)
    (
        lambda g: g["links"].append({"source": ["prompt"], "target": "main:0"}),
        ["link ['prompt'] -> 'main:0' names a missing node"],
    ),
    # node ids that cannot be compared are one problem (mutant: read as no ids: duplicates, links
    # to missing nodes)
    (lambda g: g["nodes"][0].update(id=["prompt"]), ["node ids must be strings or numbers"]),
    # node-link 'directed' is JSON true, not something truthy (mutant: `not directed`)
    (lambda g: g.update(directed=1), ["not a directed graph (node-link 'directed' must be true)"]),
    (lambda g: g.update(directed="true"), ["not a directed graph (node-link 'directed' must be true)"]),
]


@pytest.mark.parametrize("damage,found", BAD_GRAPHS)
def test_graph_problems_named(damage, found):
    g = _rows(0)[3]
    assert graph_problems(g) == []
    damage(g)
    assert graph_problems(g) == found
