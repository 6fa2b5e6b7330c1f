"""Forward time of a serving trace's passes by whether their attention shape is new to the run.

What: for each trace, its passes, their summed time (`total_s`) and how its attention ran (`sdpa`,
runtime/attention.py); every forward pass (one row per batched pass) with its query rows and key
span (the slots its mask attention scored per row: `steps.attention_kv_tokens` / rows), marked
"new" the first time the run meets that (rows, span) pair and "seen" after; printed: the passes of
each kind and their median and p90 forward time (`steps.forward_s`, or the pass's duration where
the trace has no forward column); then the new ones by what was new: the row count, the span
(rows seen before), neither (a new pair of a row count and a span each met before), and one row
against more.

Why: on the H200 (traces/gpu-h200) the serving runtime's passes took either about 21 ms or about
60 ms at the same batch size; a per-shape cost (a kernel choice, plan or allocation made the first
time PyTorch meets a shape) shows as new shapes slow and seen ones not. On a CPU trace both kinds
should look alike.

    .venv/bin/python bench/pass_shapes.py traces/gpu-h200/serving-llama-3-8b/rate-*/

Last line: one JSON object {"bench": "pass_shapes", "traces": {...}}. Not part of `make bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.errors import UsageError  # noqa: E402
from profiler.reader import TraceError, read_trace  # noqa: E402
from profiler.summary import attention_strategy  # noqa: E402


def shape_figures(path: str | Path) -> dict:
    """The figures above for one trace (UsageError for a trace without passes)."""
    trace = read_trace(path)
    steps = trace.steps
    time_col = "forward_s" if "forward_s" in steps and steps["forward_s"].notna().all() else "duration_s"
    passes = (
        steps.groupby("start_s", sort=True)
        .agg(rows=("batch_query_tokens", "first"), keys=("attention_kv_tokens", "first"), time=(time_col, "first"))
        .reset_index()
    )
    passes = passes[passes["rows"] > 0]
    if not len(passes):
        raise UsageError(f"{path}: no forward passes")
    span = np.round(passes["keys"].to_numpy(float) / passes["rows"].to_numpy(float))
    rows = passes["rows"].to_numpy(float)
    seen: set[tuple[float, float]] = set()
    seen_rows: set[float] = set()
    seen_spans: set[float] = set()
    new = np.zeros(len(passes), bool)
    new_rows = np.zeros(len(passes), bool)
    new_span = np.zeros(len(passes), bool)
    for i, key in enumerate(zip(rows, span)):
        new[i], new_rows[i], new_span[i] = key not in seen, key[0] not in seen_rows, key[1] not in seen_spans
        seen.add(key)
        seen_rows.add(key[0])
        seen_spans.add(key[1])
    time = passes["time"].to_numpy(float)

    def kind(mask: np.ndarray) -> dict:
        t = time[mask]
        if not len(t):
            return {"passes": 0}
        return {
            "passes": int(len(t)),
            "median_ms": round(float(np.median(t)) * 1e3, 2),
            "p90_ms": round(float(np.percentile(t, 90)) * 1e3, 2),
        }

    # which dimension is new: a pass with a new pair may have met its rows and its span before, apart
    one_row = rows == 1
    return {
        "time": time_col,
        "passes": int(len(time)),
        "total_s": round(float(time.sum()), 3),  # the run's forward (or pass) time, all passes
        "sdpa": attention_strategy(trace.meta),
        "new": kind(new),
        "seen": kind(~new),
        "by_what_is_new": {
            "rows_new": kind(new_rows),
            "span_new_rows_seen": kind(new_span & ~new_rows),
            "pair_new_rows_and_span_seen": kind(new & ~new_rows & ~new_span),
            "new_pair_one_row": kind(new & one_row),
            "new_pair_more_rows": kind(new & ~one_row),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", help="trace directories (serving runs)")
    args = ap.parse_args(argv)
    out = {}
    for t in args.traces:
        try:
            f = shape_figures(t)
        except (UsageError, TraceError) as e:
            print(f"bench/pass_shapes.py: error: {e}", file=sys.stderr)
            return 2
        out[str(t)] = f
        parts = []
        for which in ("new", "seen"):
            k = f[which]
            parts.append(
                f"{which} {k['passes']:4d} passes"
                + (f" median {k['median_ms']:7.2f} ms, p90 {k['p90_ms']:7.2f} ms" if k["passes"] else "")
            )
        print(
            f"{t} ({f['time']}, attention {f['sdpa']}): {f['passes']} passes, {f['total_s']:.3f} s; " + "; ".join(parts)
        )
        for which, k in f["by_what_is_new"].items():
            if k["passes"]:
                print(
                    f"    {which:28s} {k['passes']:4d} passes median {k['median_ms']:7.2f} ms, p90 {k['p90_ms']:7.2f} ms"
                )
    print(json.dumps({"bench": "pass_shapes", "traces": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
