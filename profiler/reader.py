"""Trace reader. Every way a directory can fail to be a trace ends in one `TraceError` whose
message says what is wrong and where, never a traceback from pyarrow or json.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from profiler.errors import TraceError
from profiler.outdir import PARTS
from profiler.schema import KINDS, META_REQUIRED, SCHEMA_VERSION, TABLES, fill_defaults

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

    @property
    def name(self) -> str:
        return self.path.name

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
        doc = json.loads(file.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{file}: not valid JSON ({e.msg if hasattr(e, 'msg') else e})") from None
    except RecursionError:
        raise TraceError(f"{file}: nested too deeply") from None
    except OSError as e:
        raise TraceError(f"{file}: cannot read it ({e.strerror})") from None
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
    if version != SCHEMA_VERSION:
        raise TraceError(f"{path}: schema version {version!r}, this solm reads version {SCHEMA_VERSION}")
    missing = [k for k in META_REQUIRED if k not in meta]
    if missing:
        raise TraceError(f"{meta_file}: missing keys {', '.join(missing)}")
    check_meta_types(meta, meta_file)
    if meta["kind"] not in KINDS:
        raise TraceError(f"{meta_file}: kind {meta['kind']!r} is not one of {', '.join(KINDS)}")
    return meta


def read_table(file: Path, name: str) -> pa.Table:
    if not file.is_file():
        raise TraceError(f"{file.parent}: missing {file.name}")
    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as e:
        raise TraceError(f"{file}: unreadable Parquet ({str(e).splitlines()[0]})") from None
    expected = TABLES[name]
    table = fill_defaults(name, table)  # columns of later minor revisions
    missing = [f.name for f in expected if f.name not in table.column_names]
    if missing:
        raise TraceError(f"{file}: missing columns {', '.join(missing)}")
    try:
        return table.select(expected.names).cast(expected)
    except (pa.ArrowException, ValueError) as e:
        raise TraceError(
            f"{file}: column types do not match schema v{SCHEMA_VERSION} ({str(e).splitlines()[0]})"
        ) from None


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
        return {int(r): structures[str(int(s))] for r, s in zip(graphs["request_ids"], graphs["structure_of"])}
    return {int(k): v for k, v in graphs.items()}


def read_trace(path: str | Path, tokens: bool = True) -> Trace:
    """Read a trace directory. `tokens=False` skips the per-token table (the largest of a
    simulated trace at scale) for views that need only requests, steps and graphs."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such directory")
    if not p.is_dir():
        raise TraceError(f"{p}: not a directory (a trace is a directory with meta.json and Parquet tables)")
    meta = read_meta(p)
    complete = bool(meta.get("complete", True)) and (p / "requests.parquet").exists()
    if complete:
        tables = {
            name: read_table(p / f"{name}.parquet", name)
            for name in ("requests", "steps", "tokens")
            if tokens or name != "tokens"
        }
        if not tokens:
            tables["tokens"] = TABLES["tokens"].empty_table()
        graphs = _read_json(p / "graph.json")
    elif (p / PARTS).is_dir():
        tables, graphs = read_parts(p)
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
    )
