"""Every timed run of a measured trace's requests (`runs.parquet`), and a trace as one run saw it.

`solm capture --repeats N` runs each request N times in interleaved rounds and records one run
per request in the trace's tables (the fastest by default). It also keeps the timings of every
run here, one row per forward pass of each run (schema `profiler.schema.RUNS`), so that a figure
computed on the recorded runs can be set beside the same figure on the first run alone: what a
plain `--repeats 1` capture would have measured, from the same trace.

    from profiler.runs import read_runs, single_run
    view, info = single_run(read_trace("traces/tip-var_tracking"), run=0)

Traces captured before this table existed, and simulated ones, have no `runs.parquet`:
`read_runs` returns None and `single_run` raises a UsageError saying so.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from profiler.errors import TraceError, UsageError
from profiler.schema import RUNS

RUNS_FILE = "runs.parquet"


def run_rows(
    request_id: int,
    run: int,
    arrival_s: float,
    ttft_s: float,
    e2e_s: float,
    step_rows: list[dict],
    recorded: bool,
    same_output: bool,
) -> list[dict]:
    """The rows of one run (its passes' `start_s` and `duration_s` on the capture's clock)."""
    head = {
        "request_id": request_id,
        "run": run,
        "recorded": recorded,
        "same_output": same_output,
        "arrival_s": arrival_s,
        "ttft_s": ttft_s,
        "e2e_s": e2e_s,
    }
    return [
        {
            **head,
            "step_index": int(s["step_index"]),
            "start_s": float(s["start_s"]),
            "duration_s": float(s["duration_s"]),
        }
        for s in step_rows
    ]


def write_runs(trace_dir: str | Path, rows: list[dict]) -> None:
    """Replace the trace's runs table with `rows` (atomically: a temporary file renamed)."""
    from profiler.writer import write_table

    cols = {f.name: [r[f.name] for r in rows] for f in RUNS}
    write_table(Path(trace_dir) / RUNS_FILE, pa.Table.from_pydict(cols, schema=RUNS))


def read_runs(trace_dir: str | Path) -> pd.DataFrame | None:
    """The runs table, or None when the trace has none (one run per request, or older than it)."""
    file = Path(trace_dir) / RUNS_FILE
    if not file.is_file():
        return None
    try:
        table = pq.read_table(file)
        return table.select(RUNS.names).cast(RUNS).to_pandas()
    except (pa.ArrowException, OSError, KeyError, ValueError) as e:
        raise TraceError(f"{file}: unreadable runs table ({str(e).splitlines()[0]})") from None


def single_run(trace, run: int = 0):
    """`trace` (a `profiler.reader.Trace`) with every request's timings taken from its run `run`
    (0: the first round, as a `--repeats 1` capture would have recorded it). Requests whose run
    `run` produced other tokens or another number of passes than the recorded one are left out.
    Returns (the view, {"run", "requests", "left_out"})."""
    runs = read_runs(trace.path)
    if runs is None:
        raise UsageError(
            f"{trace.path}: no {RUNS_FILE} (captured with one run per request, or before every run's timings were kept)"
        )
    mine = runs[(runs["run"] == run) & runs["same_output"]]
    if mine.empty:
        raise UsageError(f"{trace.path}: no run {run} in {RUNS_FILE} (runs 0..{int(runs['run'].max())})")
    steps = trace.steps.merge(
        mine[["request_id", "step_index", "start_s", "duration_s"]],
        on=["request_id", "step_index"],
        how="left",
        suffixes=("_recorded", ""),
    )
    n_steps = trace.steps.groupby("request_id").size()
    n_run = mine.groupby("request_id").size()
    ok = [int(r) for r in n_steps.index if r in n_run.index and n_run[r] == n_steps[r]]
    steps = steps[steps["request_id"].isin(ok)].drop(columns=["start_s_recorded", "duration_s_recorded"])
    steps = steps[list(trace.steps.columns)].reset_index(drop=True)
    per_req = mine.groupby("request_id")[["arrival_s", "ttft_s", "e2e_s"]].first()
    req = trace.requests[trace.requests["request_id"].isin(ok)].copy()
    offset = req["start_s"] - req["arrival_s"]
    for col in ("arrival_s", "ttft_s", "e2e_s"):
        req[col] = req["request_id"].map(per_req[col]).astype(float)
    req["start_s"] = req["arrival_s"] + offset
    view = dataclasses.replace(
        trace,
        requests=req.reset_index(drop=True),
        steps=steps,
        tokens=trace.tokens[trace.tokens["request_id"].isin(ok)].reset_index(drop=True),
        graphs={k: v for k, v in trace.graphs.items() if k in ok},
    )
    return view, {"run": run, "requests": len(ok), "left_out": int(trace.requests["request_id"].nunique() - len(ok))}
