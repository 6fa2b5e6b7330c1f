"""profiler.reader at its edges: the bounds of a JSON file's size and depth, each malformed meta.json
field, tables that are not what the schema says, and an unfinished trace's committed parts. Each
bad input is one TraceError naming what is wrong (`solm` prints it as one line, exit 2)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from profiler.reader import MAX_JSON_DEPTH, TraceError, load_json_file, read_trace
from profiler.schema import TABLES
from profiler.writer import TraceWriter
from solm.cli import main
from tests.profiler.test_trace import META, _rows

SHIPPED = Path(__file__).resolve().parents[2] / "traces" / "sequential-reverse_words"


@pytest.fixture
def t(tmp_path) -> Path:
    return Path(shutil.copytree(SHIPPED, tmp_path / "t"))


def _edit_meta(t: Path, drop: tuple[str, ...] = (), **fields) -> None:
    meta = {**json.loads((t / "meta.json").read_text()), **fields}
    (t / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k not in drop}))


def test_a_json_file_of_the_size_limit_reads_one_byte_more_does_not(tmp_path):
    f = tmp_path / "m.json"
    f.write_text('{"a": 1}')  # 8 bytes
    assert load_json_file(f, max_bytes=8) == {"a": 1}
    f.write_text('{"a": 12}')
    with pytest.raises(TraceError, match="9 bytes, more than the 8 a trace's m.json may hold"):
        load_json_file(f, max_bytes=8)


def test_a_json_file_nested_to_the_limit_reads_one_level_more_does_not(tmp_path):
    f = tmp_path / "m.json"
    f.write_text("{" + '"a": {' * (MAX_JSON_DEPTH - 1) + "}" * MAX_JSON_DEPTH)
    load_json_file(f)
    f.write_text("{" + '"a": {' * MAX_JSON_DEPTH + "}" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(TraceError, match=f"nested more than {MAX_JSON_DEPTH} levels deep"):
        load_json_file(f)


@pytest.mark.parametrize("name", ["meta.json", "graph.json"])
def test_an_integer_of_more_digits_than_python_reads_is_one_trace_error(t, name, capsys):
    """Was: Python's ValueError ("Exceeds the limit (4300 digits) for integer string conversion")
    out of json.loads, a traceback and exit 1 from `solm inspect`."""
    doc = json.loads((t / name).read_text())
    doc["x"] = 0
    (t / name).write_text(json.dumps(doc).replace('"x": 0', '"x": ' + "1" * 5000))
    with pytest.raises(TraceError, match=f"{name}: not valid JSON \\(an integer of more than 4300 digits\\)"):
        read_trace(t)
    assert main(["inspect", str(t)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("solm inspect: error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "content,needle",
    [
        (
            b'{"kind": "\xff"}',
            "not valid JSON ('utf-8' codec can't decode byte 0xff in position 10: invalid start byte)",
        ),
        (b"[1, 2]", "expected a JSON object"),
    ],
)
def test_a_meta_json_that_is_no_utf8_object_is_one_trace_error(t, content, needle):
    (t / "meta.json").write_bytes(content)
    with pytest.raises(TraceError, match=re.escape(f"meta.json: {needle}")):
        read_trace(t)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (dict(system=None), "field 'system' must be a JSON string, got null"),
        (dict(schema_version=0), "schema version 0, this solm reads version 1"),
        (dict(schema_version=True), "field 'schema_version' must be a JSON integer, got bool"),
        (dict(n_requests=False), "field 'n_requests' must be a JSON integer, got bool"),
        (dict(drop=("system", "device")), "missing keys system, device"),
        (dict(kind="replayed"), "kind 'replayed' is not one of measured, simulated"),
    ],
)
def test_each_malformed_meta_field_is_named(t, edit, needle):
    _edit_meta(t, **edit)
    with pytest.raises(TraceError, match=needle):
        read_trace(t)


def test_a_table_that_is_a_dangling_link_is_not_a_missing_one(t):
    (t / "steps.parquet").unlink()
    (t / "steps.parquet").symlink_to(t / "gone.parquet")
    with pytest.raises(TraceError, match="steps.parquet: not a regular file"):
        read_trace(t)


def test_columns_are_cast_to_the_schema_and_a_column_that_cannot_be_is_named(t):
    req = pq.read_table(t / "requests.parquet")
    i = req.column_names.index("steps")
    pq.write_table(req.set_column(i, "steps", req.column("steps").cast(pa.int32())), t / "requests.parquet")
    assert read_trace(t).requests["steps"].dtype == TABLES["requests"].field("steps").type.to_pandas_dtype()
    j = req.column_names.index("e2e_s")
    pq.write_table(req.set_column(j, "e2e_s", pa.array(["slow\nand late"] * req.num_rows)), t / "requests.parquet")
    with pytest.raises(TraceError, match="requests.parquet: column types do not match schema v1") as e:
        read_trace(t)
    assert "\n" not in str(e.value)  # pyarrow's message quotes the value, its newline too: one line of it (R28)


@pytest.mark.parametrize(
    "column,values,says",
    [
        ("e2e_s", ["1.5"], "column e2e_s holds string, the schema says double"),  # was: read as 1.5
        ("steps", ["7"], "column steps holds string, the schema says int64"),  # was: read as 7
        ("status", [1], "column status holds int64, the schema says string"),  # was: read as "1"
    ],
)
def test_text_where_the_schema_wants_numbers_or_the_reverse_is_refused(t, column, values, says):
    req = pq.read_table(t / "requests.parquet")
    i = req.column_names.index(column)
    pq.write_table(req.set_column(i, column, pa.array(values * req.num_rows)), t / "requests.parquet")
    with pytest.raises(TraceError, match=f"requests.parquet: column types do not match schema v1 \\({says}\\)"):
        read_trace(t)


def test_a_trace_without_counters_or_a_complete_flag_reads(t):
    """counters.parquet is optional (its table then empty); a meta.json without `complete` is a
    finished trace."""
    full = read_trace(t)
    (t / "counters.parquet").unlink()
    _edit_meta(t, drop=("complete",))
    lean = read_trace(t)
    assert lean.complete and lean.counters.empty and list(lean.counters.columns) == TABLES["counters"].names
    assert lean.requests.equals(full.requests)


@pytest.mark.parametrize(
    "ids,of",
    [
        (None, [0]),
        ([0.5], [0]),  # was: read as request 0
        ([True], [0]),  # was: read as request 1
        ([0], [0.0]),
        ([0, 1], [0]),  # was: request 1 dropped, the lists cut to the shorter
        ([0], [0, 0]),
        ([0, 0], [0, 0]),  # was: the repeated id kept its last structure
    ],
)
def test_a_graph_json_of_the_wrong_shape_is_one_trace_error(t, ids, of):
    shared = {"format": "shared", "structures": {"0": {}}, "request_ids": ids, "structure_of": of}
    (t / "graph.json").write_text(json.dumps(shared))
    with pytest.raises(TraceError, match="graph.json keys must be request ids"):
        read_trace(t)


@pytest.mark.parametrize("key", ["1_0", "01", "+1", " 1", "1.0", "x"])
def test_a_per_request_graph_key_is_a_request_id_as_written(t, key):
    """Keys are str(request id); was int(key): "1_0" read as request 10, "01" and "1" collided."""
    graphs = json.loads((t / "graph.json").read_text())
    first = next(iter(graphs))
    (t / "graph.json").write_text(json.dumps({**graphs, key: graphs[first]}))
    with pytest.raises(TraceError, match="graph.json keys must be request ids"):
        read_trace(t)
    (t / "graph.json").write_text(json.dumps({**graphs, "-3": graphs[first]}))
    assert read_trace(t).graphs[-3] == graphs[first]  # a negative id, as written, reads


ORDER = [4, 0, 7, 2, 9, 1, 8, 3, 6, 5]


def _unfinished(tmp_path, order=ORDER) -> TraceWriter:
    w = TraceWriter(tmp_path / "u", META)
    for rid in order:
        w.add_request(*_rows(rid))
    return w


def test_an_unfinished_trace_reads_its_requests_by_id_each_whole(tmp_path):
    t = read_trace(_unfinished(tmp_path).dir)
    assert not t.complete and t.requests["request_id"].tolist() == sorted(ORDER)
    assert t.steps["request_id"].tolist() == [r for r in sorted(ORDER) for _ in range(2)]
    assert sorted(t.graphs) == sorted(ORDER)


def test_an_unfinished_trace_read_lean_still_has_what_it_read(tmp_path):
    """Its parts are read whole: the tokens are there and loaded, the steps have every column."""
    t = read_trace(_unfinished(tmp_path, [0, 1]).dir, tokens=False, steps_columns=["request_id"])
    assert t.tokens_loaded and len(t.tokens) == 4 and t.token_table(["token_text"]).num_rows == 4
    assert t.steps_columns is None and t.request_steps(1, ["step_index", "live_kv_tokens"]).shape == (2, 2)


def test_a_refined_request_cut_short_reads_its_newest_generation(tmp_path):
    w = _unfinished(tmp_path, [0])
    d, parts = w.dir, w.dir / "parts"
    old = {p.name: p.read_bytes() for p in parts.iterdir()}
    req, steps, toks, graph = _rows(0)
    w.add_request({**req, "output_text": "refined"}, steps, toks, graph, replace=True)
    for name, data in old.items():  # the run died before the old generation was removed
        (parts / name).write_bytes(data)
    assert read_trace(d).requests["output_text"].tolist() == ["refined"]


def test_an_unfinished_trace_without_parts_is_one_trace_error(t):
    _edit_meta(t, complete=False)
    with pytest.raises(TraceError, match="trace is incomplete and has no committed parts"):
        read_trace(t)


def test_a_complete_trace_without_its_tables_or_parts_names_the_missing_table(t):
    (t / "requests.parquet").unlink()
    with pytest.raises(TraceError, match=r"missing requests.parquet \(meta.json says the trace is complete\)"):
        read_trace(t)


@pytest.mark.parametrize("path", ["", "  "])
def test_an_empty_trace_path_is_not_the_current_directory(path, tmp_path, monkeypatch):
    shutil.copytree(SHIPPED, tmp_path, dirs_exist_ok=True)  # '.' would read as a trace
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TraceError, match="the trace path is empty"):
        read_trace(path)


def test_a_column_name_that_is_not_utf8_is_one_trace_error(t, capsys):
    """Was: pyarrow's UnicodeDecodeError out of the Parquet footer, `solm inspect` exit 1 (a bug)."""
    f = t / "requests.parquet"
    f.write_bytes(f.read_bytes().replace(b"peak_kv_bytes", b"\xffeak_kv_bytes"))
    with pytest.raises(TraceError, match="requests.parquet: unreadable Parquet \\('utf-8' codec can't decode"):
        read_trace(t)
    assert main(["inspect", str(t)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("solm inspect: error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("zeroed", ["footer", "pages"])
def test_a_parquet_file_zeroed_in_part_is_one_line(t, zeroed, capsys):
    """Zeroed bytes make pyarrow raise an OSError of several lines ("Couldn't deserialize thrift:
    TProtocolException: Invalid data\\nDeserializing page header failed.\\n"): one TraceError of
    its first line (kills R25, the whole message kept; R43, OSError not caught)."""
    f = t / "steps.parquet"
    b = f.read_bytes()
    footer = len(b) - 8 - int.from_bytes(b[-8:-4], "little")  # the footer's length, then PAR1
    b = (
        b[:footer] + bytes(len(b) - 8 - footer) + b[-8:]
        if zeroed == "footer"
        else b[:4] + bytes(footer - 4) + b[footer:]
    )
    f.write_bytes(b)
    with pytest.raises(TraceError, match="steps.parquet: unreadable Parquet \\(Couldn't deserialize thrift") as e:
        read_trace(t)
    assert "\n" not in str(e.value)
    assert main(["inspect", str(t)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("solm inspect: error: ") and err.count("\n") == 1, err


def test_a_trace_marked_complete_without_its_tables_reads_its_committed_parts(tmp_path):
    """meta.json says complete but requests.parquet is not there (yet): the committed parts are
    the trace (kills R36, the tables' presence left unchecked: "missing requests.parquet")."""
    w = _unfinished(tmp_path, [0, 1])
    meta = json.loads((w.dir / "meta.json").read_text())
    (w.dir / "meta.json").write_text(json.dumps({**meta, "complete": True}))
    t = read_trace(w.dir)
    assert not t.complete and t.requests["request_id"].tolist() == [0, 1]


@pytest.mark.parametrize(("table", "column"), [("requests", "peak_kv_bytes"), ("steps", "streams"), ("tokens", "kind")])
def test_a_null_in_an_integer_or_string_column_is_one_trace_error(t, table, column, capsys):
    """Was: a null peak_kv_bytes read as NaN (the column a float), `solm inspect` exit 1 (int of
    NaN in the summary); a null in streams the dashboard's int('nan'). A float column's null is its
    NaN and reads."""
    f = t / f"{table}.parquet"
    tab = pq.read_table(f)
    i = tab.column_names.index(column)
    values = tab.column(column).to_pylist()
    values[0] = None
    pq.write_table(tab.set_column(i, column, pa.array(values, tab.schema.field(column).type)), f)
    with pytest.raises(TraceError, match=f"{table}.parquet: missing \\(null\\) values in column {column}$"):
        read_trace(t)
    assert main(["inspect", str(t)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("solm inspect: error: ") and err.count("\n") == 1, err


def test_a_null_in_a_float_column_reads_as_nan(t):
    f = t / "requests.parquet"
    tab = pq.read_table(f)
    i = tab.column_names.index("quality_score")
    pq.write_table(tab.set_column(i, "quality_score", pa.nulls(tab.num_rows, pa.float64())), f)
    assert read_trace(t).requests["quality_score"].isna().all()


def test_a_gpu_capture_folder_is_named_with_its_traces(tmp_path):
    """bench/gpu_capture.py's folder is not a trace: reading it says so and names the traces it
    holds (was: "schema version None, this solm reads version 1"); its reference/ is left out."""
    import json

    for name in ("tip", "pasta", "reference"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "meta.json").write_text(json.dumps({"kind": "gpu_capture", "systems": {}}))
    with pytest.raises(
        TraceError, match=r"a GPU capture folder \(bench/gpu_capture.py\), not a trace; .*\(pasta, tip\)$"
    ):
        read_trace(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"kind": "gpu_capture", "schema_version": 7}))
    with pytest.raises(TraceError, match="schema version 7"):  # a versioned meta.json is judged as a trace's
        read_trace(tmp_path)
