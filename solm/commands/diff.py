"""`solm diff A B`: what changed between two traces (measured or simulated, any two systems).

What: requests matched by id or prompt; per request and overall, latency, steps, parallelism
(theoretical and attained), live and peak KV and quality as A, B, delta and ratio, the speedup
A/B, a token-level diff of the outputs, a structural diff of the chunk dependence graphs, and
counter summaries both traces have. Human summary, then one JSON line (`--json`: the line only);
`--html OUT` also writes a self-contained report with plotly figures.
Why: "is B faster than A, on which requests, and did the output or the structure change?"

    solm diff traces/seq traces/pasta
    solm diff traces/seq sim/h100 --json | tail -1 | jq .overall.speedup
    solm diff traces/seq traces/pasta --html diff.html
"""

from __future__ import annotations

import argparse

from profiler.outdir import check_out_file, write_file_atomic
from solm.jsonline import json_line

SHOWN = (
    "e2e_s",
    "ttft_s",
    "steps",
    "attained_parallelism",
    "theoretical_speedup",
    "mean_live_kv_tokens",
    "peak_kv_bytes",
    "quality_score",
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="compare two traces (latency, parallelism, KV, quality, text, graphs)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("a", metavar="A", help="trace directory A (the baseline)")
    p.add_argument("b", metavar="B", help="trace directory B (compared against A)")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report here")
    p.add_argument("--force", action="store_true", help="overwrite the --html file if it exists")


def _f(x, spec: str = ".4g") -> str:
    return "n/a" if x is None else format(x, spec)


def print_human(s: dict) -> None:
    a, b, o = s["a"], s["b"], s["overall"]
    print(f"A: {a['trace']} ({a['kind']} {a['system']}, model {a['model']}, {a['requests']} requests)")
    print(f"B: {b['trace']} ({b['kind']} {b['system']}, model {b['model']}, {b['requests']} requests)")
    extra = ""
    if s["unmatched_a"] or s["unmatched_b"]:
        extra = f"; unmatched: {len(s['unmatched_a'])} only in A, {len(s['unmatched_b'])} only in B"
    print(f"matched {s['matched']} requests by {s['matched_by']}{extra}")
    if s["identical"]:  # of the matched requests: the unmatched ones are named on the line above
        which = "the matched requests are identical" if extra else "identical"
        print(f"{which}: zero deltas, same outputs, same dependence graphs")
    print(
        f"speedup A/B  {_f(o['speedup'], '.3f')}x total latency, {_f(o['speedup_geomean'], '.3f')}x geomean per "
        f"request; throughput {_f(o['tokens_per_s_a'], '.1f')} -> {_f(o['tokens_per_s_b'], '.1f')} tokens/s"
    )
    print(f"  {'metric (mean)':24s} {'A':>12s} {'B':>12s} {'delta':>12s} {'ratio':>8s}")
    for m in SHOWN:
        v = o["metrics"][m]
        print(f"  {m:24s} {_f(v['a']):>12s} {_f(v['b']):>12s} {_f(v['delta']):>12s} {_f(v['ratio'], '.3f'):>8s}")
    print(
        f"outputs      {o['text_identical_requests']}/{s['matched']} identical, mean token similarity "
        f"{o['text_similarity_mean']:.3f}"
    )
    changed = [r for r in s["requests"] if not r["graph"]["identical"]]
    print(f"graphs       {o['graph_identical_requests']}/{s['matched']} identical")
    for r in changed[:5]:
        g = r["graph"]
        parts = []
        if g["added"]:
            parts.append(f"+{len(g['added'])} chunks ({', '.join(map(str, g['added'][:4]))})")
        if g["removed"]:
            parts.append(f"-{len(g['removed'])} chunks ({', '.join(map(str, g['removed'][:4]))})")
        if g["changed_length"]:
            parts.append(f"{len(g['changed_length'])} changed length")
        if g["changed_dependence"]:
            parts.append(f"{len(g['changed_dependence'])} changed dependence")
        print(f"  request {r['a_id']}: {', '.join(parts) or 'edges differ'}")
    if len(changed) > 5:
        print(f"  ... {len(changed) - 5} more requests with changed graphs")
    if s["counters"]:
        print("counters (both traces)")
        for name, v in s["counters"].items():
            print(f"  {name:28s} {_f(v['a']):>12s} -> {_f(v['b']):>12s} ({_f(v['ratio'], '.3f')}x)")
    else:
        print("counters     none in common")
    print("per request (e2e ms A -> B, speedup)")
    for r in s["requests"][:10]:
        ea, eb = r["e2e_s"]["a"], r["e2e_s"]["b"]
        print(
            f"  {r['a_id']:>4d}->{r['b_id']:<4d} {_f(ea and ea * 1e3, '.1f'):>9s} -> {_f(eb and eb * 1e3, '.1f'):>9s}"
            f"  {_f(r['speedup'], '.2f')}x  text similarity {r['text']['similarity']:.2f}"
        )
    if len(s["requests"]) > 10:
        print(f"  ... {len(s['requests']) - 10} more")


def run(args: argparse.Namespace) -> int:
    from profiler.diff import diff_paths

    if args.html is not None:  # before the work: a refused output costs nothing (nor an empty one ignored)
        check_out_file(args.html, [args.a, args.b], args.force, "--html")
    d = diff_paths(args.a, args.b)
    s = d.summary()
    if args.html is not None:
        from dashboard.figures import diff_report_html

        out = check_out_file(args.html, [args.a, args.b], args.force, "--html")  # the entry checked is written
        write_file_atomic(out, diff_report_html(d))  # a link given is replaced, not the file it points to
        s["html"] = str(out)
    if not args.json:
        print_human(s)
        if args.html is not None:
            print(f"report       {s['html']}")
    print(json_line(s))
    return 0
