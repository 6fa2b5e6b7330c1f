"""Trace writer, atomic per request.

Each finished request is committed as its own part files under `parts/` (steps, tokens, graph,
then the request row last: the request part is the commit marker), each written to a temporary
name and renamed into place. A committed request can be refined (a later, faster run of it): its
next generation is committed whole before the previous one is removed. Counters are snapshotted at every commit. A run cut short therefore
keeps every finished request, and `read_trace` can read it. `close()` merges the parts into the
final tables, marks meta.json complete and removes `parts/`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from profiler.errors import UsageError
from profiler.outdir import LOCK_NAME, PARTS, TRACE_KINDS, clear_dir, project_kind
from profiler.schema import BASE_TABLES, MINOR_COLUMNS, SCHEMA_MINOR, SCHEMA_VERSION, TABLES, fill_defaults


class OutputExists(UsageError, FileExistsError):
    """The output folder holds something the writer may not replace (a FileExistsError too)."""


def part_tag(request_id: int, generation: int = 0) -> str:
    """The name tag of a request's part files: `00000003`, refined `00000003.g1`, `.g2`, ..."""
    return f"{request_id:08d}" + (f".g{generation}" if generation else "")


def _atomic_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_json(path: Path, doc: dict) -> None:
    _atomic_bytes(path, (json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n").encode())


def table_from_rows(name: str, rows: list[dict]) -> pa.Table:
    """Rows (dicts) to a table of the schema; missing columns raise with the table's name."""
    schema = BASE_TABLES[name]
    cols = {}
    for field in schema:
        try:
            cols[field.name] = [r[field.name] for r in rows]
        except KeyError:
            raise KeyError(f"{name} row lacks column {field.name!r}") from None
    table = pa.Table.from_pydict(cols, schema=schema)
    for field, _ in MINOR_COLUMNS.get(name, []):  # a later revision's column: given, or its default
        given = sum(field.name in r for r in rows)
        if given and given < len(rows):  # was: the values given dropped for the default, silently
            raise KeyError(f"{name} rows give column {field.name!r} in {given} of {len(rows)} rows")
        if given:
            table = table.append_column(field, pa.array([r[field.name] for r in rows], type=field.type))
    return fill_defaults(name, table).select(TABLES[name].names)


# zstd: a third smaller than the default snappy on simulated steps tables at scale (bench/cluster.py);
# every Parquet reader decodes it.
COMPRESSION = "zstd"
# zstd level 7, not pyarrow's default 1: a 30k-request simulated trace 3.5% smaller for 10% more
# write time (bench/cluster.py at scale; higher levels gain little more and cost far more time)
COMPRESSION_LEVEL = 7


# whole-number counters that mostly rise by one from row to row (a request's steps and tokens, a
# device's passes): delta-encoded they take a few bits a row, not a dictionary index (a simulated
# 10k-request steps.parquet: batch_index 2.4 -> 0.2 MB); every Parquet reader decodes them
DELTA_COLUMNS = ("request_id", "step_index", "batch_index", "token_index")
# rows per row group, and room for the dictionary of a column with a value per pass (start_s,
# duration_s): a 100k-request simulated steps table is 21 million rows; pyarrow's default 1 MiB
# dictionary pages fell back to plain encoding. Made a group at a time (`TableSlices`), a 30k-request
# replay's steps.parquet (zstd 7) is 25.4 MB in groups of 1 Mi rows (the writer's memory +100 MB),
# 24.4 MB in 2 Mi (+450 MB), 26.3 MB in 4 Mi (+680 MB): 1 Mi (bench/cluster.py at scale)
ROW_GROUP_ROWS = 1 << 20
DICTIONARY_PAGE_BYTES = 1 << 23


@dataclass(frozen=True)
class TableSlices:
    """A table too large to hold at once (a 100k-request simulated trace's steps: 21 million rows):
    `num_rows` rows of `schema`, made `ROW_GROUP_ROWS` at a time by `make(columns, lo, hi)`, a
    pa.Table of those columns for rows lo..hi. Written one row group at a time (`write_table`)."""

    schema: pa.Schema
    num_rows: int
    make: Callable[[list[str], int, int], pa.Table]

    def slices(self, columns: list[str]) -> Iterator[pa.Table]:
        for lo in range(0, self.num_rows, ROW_GROUP_ROWS):
            yield self.make(columns, lo, min(lo + ROW_GROUP_ROWS, self.num_rows))


def _parquet_options(schema: pa.Schema) -> dict:
    """How every table is written (zstd, delta-encoded counters, big row groups: the notes above)."""
    delta = [c for c in DELTA_COLUMNS if c in schema.names and pa.types.is_integer(schema.field(c).type)]
    return {
        "compression": COMPRESSION,
        "compression_level": COMPRESSION_LEVEL,
        "dictionary_pagesize_limit": DICTIONARY_PAGE_BYTES,
        "use_dictionary": [c for c in schema.names if c not in delta] if delta else True,
        "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED") or None,
    }


def write_table(path: Path, table: pa.Table | TableSlices) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    if isinstance(table, TableSlices):  # the same row groups as the whole table written at once
        with pq.ParquetWriter(tmp, table.schema, **_parquet_options(table.schema)) as writer:
            for part in table.slices(table.schema.names):
                writer.write_table(part.cast(table.schema), row_group_size=ROW_GROUP_ROWS)
                del part  # before the next is made: one row group's arrays alive at a time
    else:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP_ROWS, **_parquet_options(table.schema))
    os.replace(tmp, path)


def prepare_out(out: Path, overwrite: bool) -> None:
    """Create `out`, or empty it when `overwrite` and it is a folder solm wrote (never anything
    else: `profiler.outdir`; the command has checked it against its inputs and holds its lock)."""
    if out.exists() and out.is_dir() and any(c.name != LOCK_NAME for c in out.iterdir()):
        if not overwrite:
            raise OutputExists(f"{out} exists and is not empty (choose another --out or pass --force)")
        if project_kind(out) not in TRACE_KINDS:
            raise OutputExists(f"{out} is not a trace solm wrote; refusing to replace it")
        clear_dir(out)
    out.mkdir(parents=True, exist_ok=True)


class TraceWriter:
    def __init__(self, out_dir: str | Path, meta: dict, overwrite: bool = False) -> None:
        self.dir = Path(out_dir)
        prepare_out(self.dir, overwrite)
        (self.dir / PARTS).mkdir(parents=True, exist_ok=True)
        self.meta = {**meta, "schema_version": SCHEMA_VERSION, "schema_minor": SCHEMA_MINOR, "complete": False}
        write_json(self.dir / "meta.json", self.meta)
        self.n_committed = 0
        self._gen: dict[int, int] = {}  # request id -> its committed generation

    def add_request(
        self, request_row: dict, step_rows: list[dict], token_rows: list[dict], graph: dict, replace: bool = False
    ) -> None:
        """Commit one request. `replace=True` refines a committed one (`capture --repeats`): the new
        generation is committed (`request-RID.gN`, readers take the newest) before the old one is
        removed, so a run cut short at any point keeps one whole version of every committed request."""
        rid = int(request_row["request_id"])
        if rid in self._gen and not replace:
            raise ValueError(f"request {rid} already written")
        gen = self._gen[rid] + 1 if rid in self._gen else 0
        parts = self.dir / PARTS
        tag = part_tag(rid, gen)
        write_table(parts / f"steps-{tag}.parquet", table_from_rows("steps", step_rows))
        write_table(parts / f"tokens-{tag}.parquet", table_from_rows("tokens", token_rows))
        write_json(parts / f"graph-{tag}.json", graph)
        write_table(parts / f"request-{tag}.parquet", table_from_rows("requests", [request_row]))
        if gen:
            old = part_tag(rid, gen - 1)  # uncommit the old generation first (its request part), then the rest
            for name in (
                f"request-{old}.parquet",
                f"steps-{old}.parquet",
                f"tokens-{old}.parquet",
                f"graph-{old}.json",
            ):
                (parts / name).unlink(missing_ok=True)
        else:
            self.n_committed += 1
        self._gen[rid] = gen

    def set_counters(self, rows: list[dict]) -> None:
        write_table(self.dir / "counters.parquet", table_from_rows("counters", rows))

    def close(self, extra_meta: dict | None = None) -> Path:
        from profiler.reader import read_parts  # the reader owns merging parts

        tables, graphs = read_parts(self.dir)
        for name in ("requests", "steps", "tokens"):
            write_table(self.dir / f"{name}.parquet", tables[name])
        if not (self.dir / "counters.parquet").exists():
            self.set_counters([])
        write_json(self.dir / "graph.json", graphs)
        self.meta.update(extra_meta or {})
        self.meta.update({"complete": True, "n_requests": self.n_committed})
        write_json(self.dir / "meta.json", self.meta)
        shutil.rmtree(self.dir / PARTS, ignore_errors=True)
        return self.dir


def at_default(name: str, table: pa.Table | TableSlices) -> list[str]:
    """Minor-revision columns of `table` that hold exactly their default (a constant, or a copy of
    another column): left out of a written table, `profiler.reader` fills them back the same (a
    simulated trace's `attention_kv_tokens` is its `kv_tokens_read`: 0.8 MB per 10k requests).
    A `TableSlices` is checked slice by slice, making only those columns."""
    minor = [(field, value) for field, value in MINOR_COLUMNS.get(name, []) if field.name in table.schema.names]
    if isinstance(table, pa.Table):
        return [field.name for field, value in minor if _holds_default(table, field, value)]
    out = {field.name for field, _ in minor}
    for field, value in minor:
        needs = [field.name] + ([value[1]] if isinstance(value, tuple) and value[1] in table.schema.names else [])
        if not all(_holds_default(part, field, value) for part in table.slices(needs)):
            out.discard(field.name)
    return [field.name for field, _ in minor if field.name in out]


def _holds_default(table: pa.Table, field: pa.Field, value) -> bool:
    col = table.column(field.name)
    if isinstance(value, tuple):
        return value[1] in table.column_names and col.equals(table.column(value[1]).cast(field.type))
    if table.num_rows == 0:
        return True
    if isinstance(value, float) and math.isnan(value):  # NaN never equals itself: "not recorded" throughout
        return col.null_count == 0 and pc.all(pc.is_nan(col)).as_py()
    return col.null_count == 0 and pc.all(pc.equal(col, pa.scalar(value, field.type))).as_py()


def _complete(name: str, table: pa.Table | TableSlices) -> pa.Table | TableSlices:
    """`table` in its schema's columns and types, minus the minor columns at their default."""
    schema = TABLES[name]
    if isinstance(table, TableSlices):
        drop = set(at_default(name, table))
        keep = pa.schema([f for f in schema if f.name not in drop])
        return TableSlices(keep, table.num_rows, table.make)
    t = fill_defaults(name, table).select(schema.names)
    t = t.cast(schema) if t.schema != schema else t
    return t.drop_columns(at_default(name, t))


def write_trace(
    out_dir: str | Path, meta: dict, tables: dict[str, pa.Table | TableSlices], graphs: dict, overwrite: bool = True
) -> Path:
    """Write a whole trace at once (the simulator's output). Same layout, complete from the start.
    A table given as `TableSlices` holds every column of its schema, minor ones included."""
    out = Path(out_dir)
    prepare_out(out, overwrite)
    for name, schema in TABLES.items():
        write_table(out / f"{name}.parquet", _complete(name, tables.get(name, schema.empty_table())))
    write_json(out / "graph.json", {str(k): v for k, v in graphs.items()})
    n = tables["requests"].num_rows if "requests" in tables else 0
    write_json(
        out / "meta.json",
        {**meta, "schema_version": SCHEMA_VERSION, "schema_minor": SCHEMA_MINOR, "complete": True, "n_requests": n},
    )
    return out
