"""`solm export TRACE... --perfetto OUT.json`: a trace (or several) as Chrome trace event JSON.

What: one process per request with a track of forward passes (complete events named by phase),
one track per stream, live-KV counter tracks, and the trace's NVML / host counter samples as
counter events; several traces go into one file under separate process ids, so a measured run
and its simulated replays open side by side.
Why: Perfetto (ui.perfetto.dev, "Open trace file") and chrome://tracing are where engineers
already read timelines.

    solm export traces/seq --perfetto seq.json
    solm export traces/seq sim/h100 --perfetto side-by-side.json --json
"""

from __future__ import annotations

import argparse

from profiler.outdir import check_given_once, check_out_file
from solm.jsonline import json_line


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="export traces as Perfetto / chrome://tracing JSON", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace directories (measured or simulated)")
    p.add_argument("--perfetto", required=True, metavar="OUT", help="output JSON file")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--json", action="store_true", help="print only the JSON line")


def run(args: argparse.Namespace) -> int:
    from profiler.perfetto import export_perfetto

    check_given_once(args.traces, "trace")  # was: its requests drawn twice in one file
    out = check_out_file(args.perfetto, args.traces, args.force, "--perfetto")
    s = export_perfetto(args.traces, out)  # the entry checked ('~' expanded as the check did), not the text given
    if not args.json:
        print(
            f"wrote {s['out']}: {s['events']} events ({s['complete_events']} complete, "
            f"{s['counter_events']} counter samples) for {s['requests']} requests of {len(s['traces'])} trace(s), "
            f"{s['bytes'] / 1024:.1f} KiB"
        )
        print("  open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing")
    print(json_line(s))
    return 0
