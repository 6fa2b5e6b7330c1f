"""Simulated traces store each distinct structure's graph once; readers expand it; old traces read."""

from __future__ import annotations

import json

from profiler.reader import read_trace
from profiler.validate import problems
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, replay
from simulator.simtrace import write_simulated_trace
from simulator.workload import load_workload
from tests.simulator.toy_traces import (
    MODEL_META,
    one_second_cost,
    seq,
    toy_part,
    write_toy_trace,
)


def test_graphs_once_per_structure(tmp_path):
    src = write_toy_trace(tmp_path / "src", [seq(4, 3), seq(6, 2)], [4, 6])
    hw, model = toy_part(), ModelSpec.from_trace_meta(MODEL_META)
    res = replay(
        load_workload(src), hw, model, ReplayConfig(num_requests=50, rate=100.0), cost=one_second_cost(hw, model)
    )
    out = write_simulated_trace(res, tmp_path / "sim")
    doc = json.loads((out / "graph.json").read_text())
    assert doc["format"] == "shared" and len(doc["structures"]) == 2 and len(doc["request_ids"]) == 50
    trace = read_trace(out)
    assert len(trace.graphs) == 50 and trace.graphs[0] is trace.graphs[2]  # shared, not copied
    assert trace.graphs[1] == read_trace(src).graphs[1]
    assert problems(trace) == []
    assert len(read_trace(src).graphs) == 2  # the per-request form (measured traces, old traces) still reads


def test_read_without_tokens(tmp_path):
    src = write_toy_trace(tmp_path / "src", [seq(4, 3)], [4])
    lean = read_trace(src, tokens=False)
    assert (
        not lean.tokens_loaded
        and len(lean.tokens) == 0
        and list(lean.tokens.columns) == list(read_trace(src).tokens.columns)
    )
    assert len(lean.steps) == 3 and read_trace(src).tokens_loaded


def test_default_columns_left_out_and_read_back(tmp_path):
    """A minor column that holds its default is not written; the reader fills it back the same.
    Counters are delta-encoded; a table written the old way (every column, dictionaries) reads equal."""
    import pyarrow.parquet as pq

    from profiler.reader import read_table

    src = write_toy_trace(tmp_path / "src", [seq(4, 3), seq(6, 2)], [4, 6])
    hw, model = toy_part(), ModelSpec.from_trace_meta(MODEL_META)
    res = replay(
        load_workload(src), hw, model, ReplayConfig(num_requests=20, rate=100.0), cost=one_second_cost(hw, model)
    )
    out = write_simulated_trace(res, tmp_path / "sim")
    stored = pq.read_table(out / "steps.parquet")
    assert "attention_kv_tokens" not in stored.column_names  # a copy of kv_tokens_read
    assert "batch_query_tokens" in stored.column_names  # differs from query_tokens when requests share a pass
    encodings = pq.ParquetFile(out / "steps.parquet").metadata.row_group(0).column(1).encodings
    assert "DELTA_BINARY_PACKED" in encodings  # step_index
    trace = read_trace(out)
    assert (trace.steps["attention_kv_tokens"] == trace.steps["kv_tokens_read"]).all()
    assert (trace.steps["recompute_tokens"] == 0).all() and (trace.steps["preempted_requests"] == 0).all()
    full = read_trace(out)  # rewritten the old way: every column, default encodings
    for name in ("steps", "tokens", "requests"):
        pq.write_table(read_table(out / f"{name}.parquet", name), out / f"{name}.parquet")
    assert "attention_kv_tokens" in pq.read_schema(out / "steps.parquet").names
    old = read_trace(out)
    assert old.steps.equals(full.steps) and old.tokens.equals(full.tokens) and old.requests.equals(full.requests)
    assert problems(trace) == []
