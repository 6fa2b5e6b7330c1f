"""Simulated traces store each distinct structure's graph once; readers expand it; old traces read."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

import profiler.writer
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
    from profiler.reader import read_table

    src = write_toy_trace(tmp_path / "src", [seq(4, 3), seq(6, 2)], [4, 6])
    hw, model = toy_part(), ModelSpec.from_trace_meta(MODEL_META)
    res = replay(
        load_workload(src), hw, model, ReplayConfig(num_requests=20, rate=100.0), cost=one_second_cost(hw, model)
    )
    out = write_simulated_trace(res, tmp_path / "sim")
    stored = pq.read_table(out / "steps.parquet")
    assert "attention_kv_tokens" not in stored.column_names  # a copy of kv_tokens_read
    assert "host_s" not in stored.column_names and "forward_s" not in stored.column_names  # NaN: not recorded
    assert "batch_query_tokens" in stored.column_names  # differs from query_tokens when requests share a pass
    encodings = pq.ParquetFile(out / "steps.parquet").metadata.row_group(0).column(1).encodings
    assert "DELTA_BINARY_PACKED" in encodings  # step_index
    trace = read_trace(out)
    assert (trace.steps["attention_kv_tokens"] == trace.steps["kv_tokens_read"]).all()
    assert (trace.steps["recompute_tokens"] == 0).all() and (trace.steps["preempted_requests"] == 0).all()
    assert trace.steps["host_s"].isna().all() and trace.steps["forward_s"].isna().all()
    full = read_trace(out)  # rewritten the old way: every column, default encodings
    for name in ("steps", "tokens", "requests"):
        pq.write_table(read_table(out / f"{name}.parquet", name), out / f"{name}.parquet")
    assert "attention_kv_tokens" in pq.read_schema(out / "steps.parquet").names
    old = read_trace(out)
    assert old.steps.equals(full.steps) and old.tokens.equals(full.tokens) and old.requests.equals(full.requests)
    assert problems(trace) == []


def test_cycled_passes_and_sliced_writes_change_nothing(tmp_path, monkeypatch):
    """A workload cycled with shared passes (`Workload.cycle`, what --num-requests does) replays and
    writes exactly what the copied one (`take`) does, prefill chunks and preemptions included; and
    steps/tokens written a few rows at a time (`TableSlices`, row groups of 7 rows) read back the same."""
    src = write_toy_trace(tmp_path / "src", [seq(4, 3), seq(19, 9), seq(6, 2)], [4, 19, 6])
    w = load_workload(src)
    hw, model = toy_part(), ModelSpec.from_trace_meta(MODEL_META)
    config = ReplayConfig(rate=2.0, max_batch_tokens=8, block_size=4, kv_capacity_bytes=16 * 4 * 512)
    pos = np.arange(24) % 3
    copied, shared = w.take(pos), w.cycle(pos)
    assert shared.query_tokens is w.query_tokens and len(copied.query_tokens) == shared.total_passes()
    assert all(copied.passes(r) == shared.passes(r) for r in range(len(pos)))
    a, b = (replay(x, hw, model, config, cost=one_second_cost(hw, model)) for x in (copied, shared))
    assert a.metrics["preemptions"] > 0 and a.metrics["prefill_chunks"] > 0  # rows of a pass's own demand
    assert json.dumps(a.metrics, sort_keys=True) == json.dumps(b.metrics, sort_keys=True)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert all(np.array_equal(a.rows[k], b.rows[k]) for k in a.rows if k != "flat")  # flat: where each pass is kept
    whole = read_trace(write_simulated_trace(a, tmp_path / "whole"))
    monkeypatch.setattr(profiler.writer, "ROW_GROUP_ROWS", 7)
    sliced = read_trace(write_simulated_trace(b, tmp_path / "sliced"))
    for name in ("requests", "steps", "tokens"):
        pd.testing.assert_frame_equal(getattr(whole, name), getattr(sliced, name))
    assert pq.ParquetFile(tmp_path / "sliced" / "steps.parquet").metadata.num_row_groups == -(-len(whole.steps) // 7)


def test_step_index_counts_each_requests_passes_from_zero(tmp_path):
    """steps.step_index is within the request (profiler.schema): 0, 1, ... for each request's passes
    in order, whatever the other requests did (a request's rows are not numbered by their global position)."""
    src = write_toy_trace(tmp_path / "src", [seq(4, 3), seq(6, 2)], [4, 6])
    hw, model = toy_part(), ModelSpec.from_trace_meta(MODEL_META)
    res = replay(
        load_workload(src), hw, model, ReplayConfig(num_requests=6, rate=100.0), cost=one_second_cost(hw, model)
    )
    rows = res.rows
    for r in range(6):
        mine = rows["request"] == r
        assert rows["step_index"][mine].tolist() == list(range(int(mine.sum())))
    steps = read_trace(write_simulated_trace(res, tmp_path / "sim")).steps
    for _, own in steps[steps["query_tokens"] > 0].groupby("request_id"):
        assert own.sort_values("batch_index")["step_index"].tolist() == list(range(len(own)))
