"""Reading part of a trace: only some columns of a table, one request's steps, the per-token rows
later. Each gives the values the full read gives, on a measured capture and on a simulated trace
(minor columns left out of its files, steps cut into several row groups)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from profiler.reader import read_table, read_trace
from profiler.schema import TABLES
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, replay
from simulator.simtrace import write_simulated_trace
from simulator.workload import load_workload
from tests.simulator.toy_traces import MODEL_META, one_second_cost, pasta, seq, toy_part, write_toy_trace

SUBSETS = {
    "requests": [["request_id", "e2e_s"], ["prompt", "queue_s", "recompute_tokens"]],
    # attention_kv_tokens: a copy of kv_tokens_read (left out of a simulated trace's file), host_s a constant
    "steps": [["request_id", "live_kv_tokens"], ["attention_kv_tokens", "phase", "host_s", "batch_query_tokens"]],
    "tokens": [["request_id", "token_index", "token_text"], ["visible_streams", "kind"]],
}


def _same(a: pa.Table, b: pa.Table) -> bool:
    """Equal schemas and values, NaN equal to NaN in the same place."""

    def nan_free(t: pa.Table) -> pa.Table:
        cols = {}
        for name, c in zip(t.column_names, t.columns):
            if pa.types.is_floating(c.type):
                cols[name + " is nan"], c = pc.is_nan(c), pc.if_else(pc.is_nan(c), 0.0, c)
            cols[name] = c
        return pa.table(cols)

    return a.schema == b.schema and nan_free(a).equals(nan_free(b))


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """A 30-request replay of a toy trace, its steps rewritten in row groups of 7 rows."""
    root = tmp_path_factory.mktemp("selective")
    src = write_toy_trace(root / "src", [seq(4, 3), pasta(5, 2, 3)], [4, 5])
    hw, model = toy_part(), ModelSpec.from_trace_meta(MODEL_META)
    res = replay(
        load_workload(src), hw, model, ReplayConfig(num_requests=30, rate=50.0), cost=one_second_cost(hw, model)
    )
    out = write_simulated_trace(res, root / "sim")
    steps = pq.read_table(out / "steps.parquet")
    assert "attention_kv_tokens" not in steps.column_names  # the default a selective read must fill back
    pq.write_table(steps, out / "steps.parquet", row_group_size=7)
    return out


@pytest.fixture(params=["simulated", "measured"])
def trace_dir(request, simulated, small_trace):
    return simulated if request.param == "simulated" else small_trace


@pytest.mark.parametrize("name", ["requests", "steps", "tokens"])
def test_some_columns_read_as_the_full_read_has_them(trace_dir, name):
    full = read_table(trace_dir / f"{name}.parquet", name)
    for cols in SUBSETS[name]:
        part = read_table(trace_dir / f"{name}.parquet", name, cols)
        assert part.schema.names == cols and _same(part, full.select(cols)), cols
    with pytest.raises(KeyError, match="no column"):
        read_table(trace_dir / f"{name}.parquet", name, ["request_id", "no_such_column"])


def test_lean_trace_reads_the_rest_when_asked(trace_dir):
    full = read_trace(trace_dir)
    lean = read_trace(trace_dir, tokens=False, steps_columns=["request_id", "live_kv_tokens"])
    assert lean.steps_columns == ("request_id", "live_kv_tokens") and full.steps_columns is None
    assert lean.steps.equals(full.steps[["request_id", "live_kv_tokens"]])
    assert lean.requests.equals(full.requests) and not lean.tokens_loaded and len(lean.tokens) == 0
    cols = ["request_id", "step_index", "phase", "start_s", "streams", "attention_kv_tokens"]
    for rid in full.requests["request_id"]:
        want = full.steps.loc[full.steps["request_id"] == rid, cols].reset_index(drop=True)
        assert lean.request_steps(rid, cols).equals(want), rid  # read from the file: its row groups only
        assert full.request_steps(rid, cols).equals(want), rid  # from memory
    assert lean.request_steps(10**9, cols).empty
    tok = ["request_id", "token_index", "token_text", "visible_streams"]
    assert lean.token_table(tok).equals(full.token_table(tok))
    assert full.token_table().schema == TABLES["tokens"]
