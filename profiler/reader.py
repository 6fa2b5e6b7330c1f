"""Trace reader. Every way a directory can fail to be a trace ends in one `TraceError` whose
message says what is wrong and where, never a traceback from pyarrow or json.
"""

from __future__ import annotations

import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from profiler.errors import TraceError, parse_json
from profiler.outdir import PARTS
from profiler.schema import KINDS, META_REQUIRED, MINOR_COLUMNS, SCHEMA_VERSION, TABLES, fill_defaults

__all__ = ["Trace", "TraceError", "load_json_file", "read_meta", "read_parts", "read_table", "read_trace"]


@dataclass
class Trace:
    path: Path
    meta: dict
    requests: pd.DataFrame
    steps: pd.DataFrame
    tokens: pd.DataFrame
    counters: pd.DataFrame
    graphs: dict[int, dict]
    complete: bool
    tokens_loaded: bool = True  # False: read with tokens=False, `tokens` is empty (not the trace's)
    steps_columns: tuple[str, ...] | None = None  # None: `steps` holds every column; else only these

    @property
    def name(self) -> str:
        return self.path.name

    def request_steps(self, request_id: int, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """One request's rows of the steps table (`columns`, default all): from `steps` when it holds
        those columns, else read from steps.parquet (only the row groups that can hold the request:
        one or two of a simulated trace, whose rows are sorted by request)."""
        cols = list(TABLES["steps"].names) if columns is None else list(columns)
        if self.steps_columns is None or set(cols) <= set(self.steps_columns):
            s = self.steps
            return s.loc[s["request_id"] == request_id, cols].reset_index(drop=True)
        return _frame(read_table(self.path / "steps.parquet", "steps", cols, [("request_id", "=", int(request_id))]))

    def token_table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The per-token rows (`columns`, default all) as an Arrow table: from `tokens` when they were
        read, else read now from tokens.parquet (only those columns)."""
        cols = list(TABLES["tokens"].names) if columns is None else list(columns)
        if self.tokens_loaded:
            schema = pa.schema([TABLES["tokens"].field(c) for c in cols])
            return pa.Table.from_pandas(self.tokens[cols], schema=schema, preserve_index=False)
        return read_table(self.path / "tokens.parquet", "tokens", cols)

    @property
    def kind(self) -> str:
        return self.meta.get("kind", "measured")

    @property
    def system(self) -> str:
        return self.meta.get("system", "?")


MAX_META_BYTES = 16 << 20  # a meta.json is a few KiB; more is not one
MAX_GRAPH_BYTES = 2 << 30
MAX_JSON_DEPTH = 32  # meta.json nests 3-4 levels; graph.json 4
# meta.json fields and the JSON type each must have when present (required ones: META_REQUIRED)
META_TYPES: dict[str, type | tuple[type, ...]] = {
    "schema_version": int,
    "kind": str,
    "system": str,
    "model": dict,
    "device": dict,
    "created_at": str,
    "task": str,
    "knobs": dict,
    "host": dict,
    "complete": bool,
    "split": str,
    "n_requests": int,
    "seed": int,
    "nvml": bool,
    "counters_source": str,
    "simulation": dict,
    "quality_applicable": bool,
}


def _depth(doc: object) -> int:
    """Nesting depth of a parsed JSON document, without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_JSON_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def load_json_file(file: Path, max_bytes: int = MAX_META_BYTES) -> dict:
    """A JSON object from a regular file of sane size (never a FIFO or a device: those would hang
    or fill memory); every failure is one TraceError."""
    try:
        st = file.stat()
    except FileNotFoundError:
        raise TraceError(f"{file.parent}: missing {file.name}") from None
    except OSError as e:
        raise TraceError(f"{file}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise TraceError(f"{file}: not a regular file")
    if st.st_size > max_bytes:
        raise TraceError(f"{file}: {st.st_size} bytes, more than the {max_bytes} a trace's {file.name} may hold")
    try:
        text = file.read_bytes()
    except OSError as e:
        raise TraceError(f"{file}: cannot read it ({e.strerror})") from None
    doc = parse_json(text, str(file), TraceError)
    if not isinstance(doc, dict):
        raise TraceError(f"{file}: expected a JSON object")
    if _depth(doc) > MAX_JSON_DEPTH:
        raise TraceError(f"{file}: nested more than {MAX_JSON_DEPTH} levels deep")
    return doc


def check_meta_types(meta: dict, where: object) -> None:
    for key, kind in META_TYPES.items():
        value = meta.get(key)
        if value is None and key not in META_REQUIRED:
            continue
        bad = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        if bad:
            name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            got = "null" if value is None else type(value).__name__
            raise TraceError(f"{where}: field {key!r} must be a JSON {_JSON_NAMES.get(name, name)}, got {got}")


_JSON_NAMES = {"dict": "object", "str": "string", "int": "integer", "bool": "boolean"}


def read_meta(path: Path) -> dict:
    meta_file = path / "meta.json"
    if not meta_file.exists():
        raise TraceError(f"{path}: no meta.json (not a solm trace directory)")
    meta = load_json_file(meta_file)
    version = meta.get("schema_version")
    if meta.get("kind") == "gpu_capture" and version is None:  # bench/gpu_capture.py's folder of traces
        try:
            inner = sorted(c.name for c in path.iterdir() if (c / "meta.json").is_file() and c.name != "reference")
        except OSError:
            inner = []
        raise TraceError(
            f"{path}: a GPU capture folder (bench/gpu_capture.py), not a trace; its traces are its "
            f"subfolders ({', '.join(inner) or 'none'})"
        )
    if version != SCHEMA_VERSION:
        raise TraceError(f"{path}: schema version {version!r}, this solm reads version {SCHEMA_VERSION}")
    missing = [k for k in META_REQUIRED if k not in meta]
    if missing:
        raise TraceError(f"{meta_file}: missing keys {', '.join(missing)}")
    check_meta_types(meta, meta_file)
    if meta["kind"] not in KINDS:
        raise TraceError(f"{meta_file}: kind {meta['kind']!r} is not one of {', '.join(KINDS)}")
    return meta


def read_table(
    file: Path, name: str, columns: Sequence[str] | None = None, filters: list[tuple] | None = None
) -> pa.Table:
    """Table `name` from `file`, checked against the schema and cast to it, the columns of later
    minor revisions it lacks filled with their defaults. `columns`: only these, in this order, and
    only their data is read (None: every column of the schema); `filters` (pyarrow's, e.g.
    `[("request_id", "=", 3)]`): only the matching rows, and row groups whose statistics rule them
    out are not read."""
    if not file.is_file():
        there = file.exists() or file.is_symlink()  # a folder, a FIFO, a device or a dangling link
        raise TraceError(f"{file}: not a regular file" if there else f"{file.parent}: missing {file.name}")
    expected = TABLES[name]
    want = list(expected.names) if columns is None else list(columns)
    unknown = [c for c in want if c not in expected.names]
    if unknown:
        raise KeyError(f"table {name} has no column {', '.join(unknown)}")
    try:
        present = set(pq.read_schema(file).names)
        # a minor column the file lacks may default to a copy of another one: read that instead
        copied = [v[1] for f, v in MINOR_COLUMNS.get(name, []) if f.name in want and isinstance(v, tuple)]
        read = [c for c in dict.fromkeys(want + copied) if c in present]
        table = pq.read_table(file, columns=read, filters=filters)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:  # a column name not UTF-8: was a traceback
        raise TraceError(f"{file}: unreadable Parquet ({str(e).splitlines()[0]})") from None
    table = fill_defaults(name, table, want)  # columns of later minor revisions
    missing = [c for c in want if c not in table.column_names]
    if missing:
        raise TraceError(f"{file}: missing columns {', '.join(missing)}")
    # Arrow casts text to numbers and numbers to text (a string column "1.5" read as 1.5): a column of
    # text where the schema wants numbers, or the reverse, is another table's (was: read quietly)
    text = [c for c in want if _is_text(table.schema.field(c).type) not in (None, _is_text(expected.field(c).type))]
    if text:
        c = text[0]
        raise TraceError(
            f"{file}: column types do not match schema v{SCHEMA_VERSION} (column {c} holds "
            f"{table.schema.field(c).type}, the schema says {expected.field(c).type})"
        )
    try:
        table = table.select(want).cast(pa.schema([expected.field(c) for c in want]))
    except (pa.ArrowException, ValueError) as e:
        raise TraceError(
            f"{file}: column types do not match schema v{SCHEMA_VERSION} ({str(e).splitlines()[0]})"
        ) from None
    # a null reads as NaN in an integer column (a float then) and as None in a string one: was
    # `solm inspect`'s internal error (int of NaN) on a requests table with a null peak_kv_bytes;
    # no writer leaves one, and a float column's NaN (quality_score) is a value, not a null
    nulls = [c for c in want if not pa.types.is_floating(table.schema.field(c).type) and table[c].null_count]
    if nulls:
        raise TraceError(f"{file}: missing (null) values in column {', '.join(nulls)}")
    return table


def _is_text(t: pa.DataType) -> bool | None:
    """Whether a column of type `t` holds text (a dictionary of text does); None for the null type,
    which casts to either."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_null(t):
        return None
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _frame(table: pa.Table) -> pd.DataFrame:
    """`table` as a DataFrame, its Arrow buffers freed column by column as they are converted (a
    100k-request simulated steps table is 21 million rows: not both copies at once)."""
    return table.to_pandas(self_destruct=True, split_blocks=True)


def read_parts(path: Path) -> tuple[dict[str, pa.Table], dict[str, dict]]:
    """Merge the committed per-request parts of an unfinished (or closing) trace."""
    parts = path / PARTS
    tables: dict[str, list[pa.Table]] = {"requests": [], "steps": [], "tokens": []}
    graphs: dict[str, dict] = {}
    for rid, tag in _newest_parts(parts):
        tables["requests"].append(read_table(parts / f"request-{tag}.parquet", "requests"))
        tables["steps"].append(read_table(parts / f"steps-{tag}.parquet", "steps"))
        tables["tokens"].append(read_table(parts / f"tokens-{tag}.parquet", "tokens"))
        graphs[str(rid)] = _read_json(parts / f"graph-{tag}.json")
    merged = {name: pa.concat_tables(ts) if ts else TABLES[name].empty_table() for name, ts in tables.items()}
    return merged, graphs


def _newest_parts(parts: Path) -> list[tuple[int, str]]:
    """(request id, tag) of each committed request's newest generation, by id: a refined request
    (`capture --repeats`) commits `request-RID.gN` before it removes the generation it replaces."""
    newest: dict[int, tuple[int, str]] = {}
    for req in parts.glob("request-*.parquet"):
        tag = req.stem.split("-", 1)[1]
        rid, _, gen = tag.partition(".g")
        try:
            key = (int(rid), int(gen or 0))
        except ValueError:
            raise TraceError(f"{req}: not a request part name (request-ID[.gN].parquet)") from None
        if key[0] not in newest or key[1] > newest[key[0]][0]:
            newest[key[0]] = (key[1], tag)
    return [(rid, tag) for rid, (_, tag) in sorted(newest.items())]


def _read_json(file: Path) -> dict:
    return load_json_file(file, MAX_GRAPH_BYTES)


def _graphs_by_id(graphs: dict) -> dict[int, dict]:
    """{request id: graph}. Simulated traces may store each distinct structure once (`"format":
    "shared"`, written by simulator/simtrace.py); requests then share the graph objects."""
    if graphs.get("format") == "shared":
        structures = graphs["structures"]
        ids, of = graphs["request_ids"], graphs["structure_of"]
        # whole numbers only, one structure per id (were: a request id 0.5 read as 0, and a list shorter
        # than the other cut the longer one short)
        by_id = {_whole(r): structures[str(_whole(s))] for r, s in zip(ids, of, strict=True)}
        if len(by_id) != len(ids):  # was: a repeated id kept its last structure, silently
            raise ValueError("a request id given twice")
        return by_id
    return {_request_key(k): v for k, v in graphs.items()}


def _request_key(key: str) -> int:
    """A per-request graph.json key: a request id as the writers spell it, str(int) (ValueError
    otherwise; was int(key), which read "1_0" as request 10 and let "01" and "1" overwrite each other)."""
    rid = int(key)
    if str(rid) != key:
        raise ValueError(f"not a request id: {key!r}")
    return rid


def _whole(x: object) -> int:
    """An id of the shared graph form: a JSON integer (TypeError for anything else, a float or a bool)."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"not an integer: {x!r}")
    return x


def read_trace(path: str | Path, tokens: bool = True, steps_columns: Sequence[str] | None = None) -> Trace:
    """Read a trace directory. `tokens=False` skips the per-token table (the largest of a
    simulated trace at scale) for views that need only requests, steps and graphs;
    `steps_columns` reads only those columns of the steps table (21 million rows for a
    100k-request simulated trace); `Trace.request_steps` and `Trace.token_table` read the rest
    when asked. An unfinished trace (committed parts only) is read whole."""
    if isinstance(path, str) and not path.strip():  # was: read as '.' (`solm inspect "$T"` with T unset)
        raise TraceError("the trace path is empty; give a trace directory")
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such directory")
    if not p.is_dir():
        raise TraceError(f"{p}: not a directory (a trace is a directory with meta.json and Parquet tables)")
    meta = read_meta(p)
    complete = bool(meta.get("complete", True)) and (p / "requests.parquet").exists()
    if complete:
        tables = {
            "requests": read_table(p / "requests.parquet", "requests"),
            "steps": read_table(p / "steps.parquet", "steps", steps_columns),
            "tokens": read_table(p / "tokens.parquet", "tokens") if tokens else TABLES["tokens"].empty_table(),
        }
        graphs = _read_json(p / "graph.json")
    elif (p / PARTS).is_dir():
        tables, graphs = read_parts(p)
    elif meta.get("complete", True):  # was: "trace is incomplete", of a trace whose meta says it is not
        raise TraceError(f"{p}: missing requests.parquet (meta.json says the trace is complete) and no committed parts")
    else:
        raise TraceError(f"{p}: trace is incomplete and has no committed parts")
    try:
        graphs_by_id = _graphs_by_id(graphs)
    except (ValueError, KeyError, TypeError):
        raise TraceError(
            f"{p}: graph.json keys must be request ids (or the shared form: structures, request_ids, structure_of)"
        ) from None
    counters_file = p / "counters.parquet"
    counters = read_table(counters_file, "counters") if counters_file.exists() else TABLES["counters"].empty_table()
    return Trace(
        path=p,
        meta=meta,
        requests=_frame(tables.pop("requests")),
        steps=_frame(tables.pop("steps")),
        tokens=_frame(tables.pop("tokens")),
        counters=counters.to_pandas(),
        graphs=graphs_by_id,
        complete=complete,
        tokens_loaded=tokens or not complete,
        steps_columns=tuple(steps_columns) if complete and steps_columns is not None else None,
    )
