"""`solm capture`: run a system over a task's held-out prompts and write a trace directory."""

from __future__ import annotations

import argparse
import json

from profiler.errors import UsageError
from runtime.capture import KEEP, CaptureConfig, capture
from runtime.engines import systems


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capture", help="run a system on a task and record a trace")
    p.add_argument("--system", default="sequential", help=f"one of: {', '.join(systems())}")
    p.add_argument("--model", default="", help="checkpoint dir, shipped model name or preset (default: the system's shipped model)")
    p.add_argument("--task", default="", help="task name (default: the system's default task)")
    p.add_argument("--n", type=int, default=8, help="number of held-out prompts")
    p.add_argument("--split", default="test", choices=["train", "dev", "test"],
                   help="prompt split: test (reported figures), dev (where settings are chosen) or train")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="bound on generated tokens (default: 1.25 x the task's longest answer, runtime/answer_length.py)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--page-size", type=int, default=16, help="KV page size in slots")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (tiny models run best on 1)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up requests before recording (default 1)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every request this many times in interleaved rounds and record one run of each "
                        "(--keep; the spread of the runs goes to meta.json; default 1)")
    p.add_argument("--keep", default="min", choices=list(KEEP),
                   help="with --repeats: record each request's fastest run (a shared machine only ever slows "
                        "down, so the fastest is the least disturbed; default) or its median run")
    p.add_argument("--counters-hz", type=float, default=20.0, help="counter sampling rate")
    p.add_argument("--knob", action="append", default=[], metavar="KEY=VALUE",
                   help="engine setting, repeatable (values parsed as JSON when they can be, e.g. --knob max_threads=4)")
    p.add_argument("--structure-from", default="", metavar="TRACE",
                   help="replay the structure (forks, chunk lengths, register reuse, evictions, plans) recorded in "
                        "TRACE, a trace of the same system, with this model's real forward passes; quality is then "
                        "not applicable (NaN)")
    p.add_argument("--out", required=True, help="trace directory to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--json", action="store_true", help="print only the JSON line")


def parse_knobs(items: list[str]) -> dict:
    knobs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--knob expects KEY=VALUE, got {item!r}")
        try:
            knobs[key] = json.loads(value)
        except json.JSONDecodeError:
            knobs[key] = value
    return knobs


def run(args: argparse.Namespace) -> int:
    from profiler.reader import read_trace
    from profiler.summary import summarize

    if args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    import torch

    torch.set_num_threads(args.threads)
    if args.counters_hz <= 0:
        raise UsageError(f"--counters-hz must be > 0, got {args.counters_hz}")
    cfg = CaptureConfig(system=args.system, model=args.model, task=args.task, n=args.n, split=args.split,
                        device=args.device, seed=args.seed, max_tokens=args.max_tokens, temperature=args.temperature,
                        top_p=args.top_p, page_size=args.page_size, counters_interval_s=1.0 / args.counters_hz,
                        knobs=parse_knobs(args.knob), warmup=args.warmup, repeats=args.repeats, keep=args.keep,
                        structure_from=args.structure_from)
    out = capture(cfg, args.out, overwrite=args.force, progress=not args.json)
    s = summarize(read_trace(out))
    if not args.json:
        print(f"captured {s['requests']} requests of {s['task']} with {s['system']} on {s['device']} -> {out}")
        q = "n/a" if s["quality_mean"] is None else f"{s['quality_mean']:.3f}"
        print(f"  quality {q}  {s['tokens_per_s']:.1f} tokens/s  e2e p50 {s['e2e_s_p50']*1000:.1f} ms")
    print(json.dumps(s))
    return 0
