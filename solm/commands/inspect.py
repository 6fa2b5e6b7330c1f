"""`solm inspect DIR`: a human summary of a trace, then one JSON line of its figures."""

from __future__ import annotations

import argparse

from solm.jsonline import json_line


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="summarise a trace")
    p.add_argument("trace", help="trace directory")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.add_argument(
        "--validate",
        action="store_true",
        help="summarise a trace even when the validator finds problems, and list them; exit 2 on problems "
        "(without it a trace with problems is refused, as diff and export refuse it)",
    )


def _fmt(x, spec: str, scale: float = 1.0) -> str:
    return "n/a" if x is None else format(x * scale, spec)


def run(args: argparse.Namespace) -> int:
    import sys

    import numpy as np

    from profiler.errors import TraceError, one_line, shorten_words
    from profiler.reader import read_trace
    from profiler.summary import summarize
    from profiler.validate import not_valid, problems

    trace = read_trace(args.trace)
    issues = problems(trace)
    if issues and not args.validate:  # figures from a broken trace (an infinite e2e_s) would be numbers of nothing
        raise TraceError(
            f"{not_valid(args.trace, issues)}; solm inspect --validate summarises it anyway, with every problem"
        )
    with np.errstate(invalid="ignore", over="ignore"):  # --validate: percentiles over inf are n/a, not warnings
        s = summarize(trace)
    s["valid"] = not issues if args.validate else None
    if args.validate:
        s["problems"] = issues
    if issues and args.json:  # the JSON line lists them; stderr names the first, as any refusal does
        line = not_valid(args.trace, issues, " in the JSON line's problems")
        print(f"solm inspect: error: {shorten_words(one_line(line))}", file=sys.stderr)
    if not args.json:
        state = "complete" if s["complete"] else "INCOMPLETE (run cut short; finished requests only)"
        print(
            f"{s['trace']}: {s['kind']} trace of {s['system']} on {s['task']}, model {s['model']}, device {s['device']} [{state}]"
        )
        print(
            f"  requests        {s['requests']} ({s['errors']} errors), {s['output_tokens']} output tokens, {s['steps']} forward passes"
        )
        print(f"  quality mean    {_fmt(s['quality_mean'], '.3f')}")
        print(f"  throughput      {_fmt(s['tokens_per_s'], '.1f')} tokens/s")
        print(f"  ttft p50        {_fmt(s['ttft_s_p50'], '.2f', 1000)} ms")
        print(
            f"  e2e mean/p50/p99 {_fmt(s['e2e_s_mean'], '.1f', 1000)} / {_fmt(s['e2e_s_p50'], '.1f', 1000)} / {_fmt(s['e2e_s_p99'], '.1f', 1000)} ms"
        )
        print(f"  theoretical speedup (geomean) {_fmt(s['theoretical_speedup_geomean'], '.2f')}x")
        print(
            f"  peak KV         {s['peak_kv_tokens']} tokens, {s['peak_kv_bytes']} bytes; mean live {_fmt(s['mean_live_kv_tokens'], '.1f')} tokens"
        )
        print(
            f"  counters        {'NVML' if s['nvml'] else 'host (no NVML: ' + str(trace.meta.get('nvml_reason', '')) + ')'}"
        )
        for line in issues:
            print(f"  problem: {line}")
    print(json_line(s))
    return 2 if issues else 0
