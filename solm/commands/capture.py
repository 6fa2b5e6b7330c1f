"""`solm capture`: run a system over a task's held-out prompts and write a trace directory."""

from __future__ import annotations

import argparse
import math
import re
from typing import TYPE_CHECKING

from profiler.errors import UsageError, one_line, parse_json
from profiler.outdir import claim_out_dir
from runtime.options import KEEP, SDPA_STRATEGIES, systems  # the engines and torch load in run(), not for the parser
from runtime.tasks.base import MAX_EXAMPLES
from solm.commands import check_limits
from solm.jsonline import json_line

if TYPE_CHECKING:
    from runtime.capture import CaptureConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capture", help="run a system on a task and record a trace")
    p.add_argument("--system", default="sequential", help=f"one of: {', '.join(systems())}")
    p.add_argument(
        "--model",
        default=None,
        help="checkpoint dir, shipped model name or preset (default: the system's shipped model)",
    )
    p.add_argument("--task", default=None, help="task name (default: the system's default task)")
    p.add_argument("--n", type=int, default=8, help="number of held-out prompts")
    p.add_argument(
        "--split",
        default="test",
        choices=["train", "dev", "test"],
        help="prompt split: test (reported figures), dev (where settings are chosen) or train",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="bound on generated tokens (default: 1.25 x the task's longest answer, runtime/answer_length.py)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling with --temperature > 0 (default 1)")
    p.add_argument("--page-size", type=int, default=16, help="KV page size in slots")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (tiny models run best on 1)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up requests before recording (default 1)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every request this many times in interleaved rounds and record one run of each "
        "(--keep; the spread of the runs goes to meta.json; default 1)",
    )
    p.add_argument(
        "--keep",
        default=None,
        choices=list(KEEP),
        help="with --repeats: record each request's fastest run (a shared machine only ever slows "
        "down, so the fastest is the least disturbed; default) or its median run (of an even number "
        "of runs the faster middle one: a recorded run is one that ran, not an average)",
    )
    p.add_argument("--counters-hz", type=float, default=20.0, help="counter sampling rate")
    p.add_argument(
        "--sdpa",
        default=None,
        choices=list(SDPA_STRATEGIES),
        help="how the masked attention runs (runtime/attention.py; default: $SOLM_SDPA, else `default`: "
        "the memory-efficient kernel on a GPU, PyTorch's own choice elsewhere); recorded in meta.device.sdpa",
    )
    p.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine setting, repeatable (values parsed as JSON when they can be, e.g. --knob max_threads=4)",
    )
    p.add_argument(
        "--structure-from",
        default=None,
        metavar="TRACE",
        help="replay the structure (forks, chunk lengths, register reuse, evictions, plans) recorded in "
        "TRACE, a trace of the same system, with this model's real forward passes; quality is then "
        "not applicable (NaN)",
    )
    load = p.add_argument_group("serving under load (runtime/serve_capture.py): continuous batching over one KV pool")
    load.add_argument("--rate", type=float, default=None, help="Poisson arrivals, requests/s (or --concurrency)")
    load.add_argument("--concurrency", type=int, default=None, help="closed loop of this many clients (or --rate)")
    load.add_argument("--max-seqs", type=int, default=None, help="most requests in one pass (default 64)")
    load.add_argument("--max-batch-tokens", type=int, default=None, help="most query rows in one pass (default 4096)")
    load.add_argument(
        "--kv-budget-mib", type=float, default=None, help="KV pool size in MiB, fractions allowed (default 8)"
    )
    load.add_argument("--scheduler", default=None, help="admission policy: fcfs or sjf (default fcfs)")
    load.add_argument("--chunked-prefill", action="store_true", help="split long prefills over passes (vLLM's default)")
    load.add_argument(
        "--attention",
        default=None,
        choices=["mask", "gather"],
        help="attention over the whole pool with a mask (default), or over each request's gathered slots",
    )
    load.add_argument(
        "--rows-sweep",
        action="store_true",
        help="after serving, time the forward over 1-32 rows x 64-1024 pool slots and keep it in meta.json: "
        "a batch-1 calibration trace (--concurrency 1) then teaches `solm validate --calibrate-from` how a "
        "batched pass grows (runtime/rows_sweep.py)",
    )
    p.add_argument("--out", required=True, help="trace directory to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--json", action="store_true", help="print only the JSON line")


def parse_knobs(items: list[str]) -> dict:
    knobs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--knob expects KEY=VALUE, got {item!r}")
        # a value that is not JSON is the plain word (`--knob mode=greedy`); NaN, Infinity, deep
        # nesting and a 5,000-digit integer are refused (were: exit 0 with "nan", exit 1)
        knobs[key] = parse_json(value, f"--knob {key}", default=value, parse_constant=_no_constant)
    return knobs


def _no_constant(name: str) -> float:
    raise UsageError(f"--knob values must be finite numbers, got {name}")


DEVICE = re.compile(r"cpu|cuda(:\d+)?")
LIMITS = {  # flag: (attribute, lowest, highest) for the integer flags
    "--n": ("n", 1, MAX_EXAMPLES),
    "--threads": ("threads", 1, 1024),
    "--max-tokens": ("max_tokens", 1, 1 << 20),
    "--page-size": ("page_size", 1, 1 << 16),
    "--warmup": ("warmup", 0, 1000),
    "--repeats": ("repeats", 1, 1000),
    "--seed": ("seed", 0, 2**31 - 1),
}


def check_args(args: argparse.Namespace) -> None:
    """Every flag in range before anything is loaded, built or written (UsageError, one line)."""
    check_limits(args, LIMITS)  # --max-tokens None: the default chosen later
    # None: not given (an empty value is refused in solm.cli); the capture config takes "" for that
    args.model, args.task, args.structure_from = (v or "" for v in (args.model, args.task, args.structure_from))
    if not 0 < args.counters_hz <= 1000:  # also refuses NaN: a sampler at NaN Hz spins
        raise UsageError(f"--counters-hz must be a number in (0, 1000], got {args.counters_hz}")
    if 1.0 / args.counters_hz == math.inf:  # 1e-320: was a thread traceback, exit 0, interval inf in meta.json
        raise UsageError(f"--counters-hz {args.counters_hz} is too small: its sampling interval overflows")
    if not 0 <= args.temperature < math.inf:
        raise UsageError(f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")
    if not DEVICE.fullmatch(args.device):
        raise UsageError(f"--device must be cpu or cuda[:i], got {args.device!r}")
    _check_unused(args)


SERVING_FLAGS = ("max_seqs", "max_batch_tokens", "kv_budget_mib", "scheduler", "chunked_prefill", "attention")


def _check_unused(args: argparse.Namespace) -> None:
    """Refuse a flag the capture would accept and ignore (was: exit 0, the trace as without it)."""
    if args.rate is None and args.concurrency is None:
        if args.rows_sweep:
            raise UsageError("--rows-sweep times the serving runtime's forward: give it with --rate or --concurrency")
        given = [f"--{name.replace('_', '-')}" for name in SERVING_FLAGS if getattr(args, name) not in (None, False)]
        if given:
            raise UsageError(f"{', '.join(given)}: serving settings apply under load: give --rate or --concurrency")
    if args.keep is not None and args.repeats == 1:
        raise UsageError("--keep picks one of the runs of --repeats: give --repeats 2 or more")
    if args.top_p is not None and args.temperature == 0:
        raise UsageError("--top-p applies to sampling: give --temperature > 0 (0 is greedy)")


def run(args: argparse.Namespace) -> int:
    """Check the flags, capture (request by request, or served under load), print the summary."""
    from profiler.reader import read_trace
    from profiler.summary import summarize

    check_args(args)
    import torch

    from runtime.attention import set_sdpa_strategy

    set_sdpa_strategy(args.sdpa)  # None: SOLM_SDPA, else default (a bad SOLM_SDPA is a usage error here)
    torch.set_num_threads(args.threads)
    cfg = _capture_config(args)
    from runtime.checkpoint import model_path

    inputs = [args.structure_from, model_path(args.model) or ""]
    with claim_out_dir(args.out, inputs, args.force):  # held while capturing: one writer per --out
        if args.rate is not None or args.concurrency is not None:
            from runtime.serve_capture import capture_load

            out = capture_load(cfg, _load_config(args), args.out, overwrite=args.force)
        else:
            from runtime.capture import capture

            out = capture(cfg, args.out, overwrite=args.force, progress=not args.json)
    trace = read_trace(out)
    s = summarize(trace)
    if s["requests"] and s["errors"] == s["requests"]:  # was: exit 0, "captured N requests", figures all n/a
        first = one_line(str(trace.requests["error"].iloc[0]))
        raise UsageError(f"every request failed ({first}); the trace in {out} records the errors")
    if not args.json:
        print(f"captured {s['requests']} requests of {s['task']} with {s['system']} on {s['device']} -> {out}")
        q = "n/a" if s["quality_mean"] is None else f"{s['quality_mean']:.3f}"
        if s.get("tokens_per_s") is not None and s.get("e2e_s_p50") is not None:
            print(f"  quality {q}  {s['tokens_per_s']:.1f} tokens/s  e2e p50 {s['e2e_s_p50'] * 1000:.1f} ms")
    print(json_line(s))
    return 0


def _capture_config(args: argparse.Namespace) -> CaptureConfig:
    """The capture's settings from the flags (knobs parsed: UsageError on a malformed one)."""
    from runtime.capture import CaptureConfig

    return CaptureConfig(
        system=args.system,
        model=args.model,
        task=args.task,
        n=args.n,
        split=args.split,
        device=args.device,
        seed=args.seed,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=CaptureConfig.top_p if args.top_p is None else args.top_p,
        page_size=args.page_size,
        counters_interval_s=1.0 / args.counters_hz,
        knobs=parse_knobs(args.knob),
        warmup=args.warmup,
        repeats=args.repeats,
        keep=args.keep or CaptureConfig.keep,
        structure_from=args.structure_from,
    )


def _load_config(args: argparse.Namespace):
    """The serving-under-load settings (`--rate` or `--concurrency` and the pool flags)."""
    from runtime.serve_capture import LoadConfig

    given = {name: getattr(args, name) for name in SERVING_FLAGS if getattr(args, name) is not None}
    return LoadConfig(rate=args.rate, concurrency=args.concurrency, rows_sweep=args.rows_sweep, **given)
