"""`solm sweep TRACE... --hardware a,b`: every combination of settings, and its Pareto front.

What: trace x hardware x model x max-seqs x arrival (rates and/or concurrencies), each a replay;
a Parquet table (`OUT/sweep.parquet`) with `pareto` marking the rows no other row beats on
quality (from the trace), mean E2E latency, output throughput and peak KV bytes at once. Runs on
a local process pool, or with `--backend ray` on a Ray cluster (`--address`) or a local Ray
bound to loopback. Finished configurations are appended to `OUT/results.jsonl` as they finish:
an interrupted sweep keeps them, and the same command resumes where it stopped. A grid of more than
100,000 configurations (`simulator.sweep.MAX_CONFIGS`) is refused before any runs: split it.

    solm sweep traces/sequential-tiny --hardware a100-80g,h100-sxm,h200 --model llama-3-8b \
        --max-seqs 1,8,32 --rate 1,10,inf --num-requests 200 --out runs/sweep1
    solm sweep traces/pasta-word_facts --hardware h100-sxm --model llama-3-70b --tp 1,2,4,8 --replicas 1,2,4 \
        --workload simulator/data/workloads/splitwise_code.csv --price-per-gpu-hour 2.5 --slo-ttft-ms 2000

Deployment sweeps (`--tp`, `--pp`, `--replicas` lists; docs/cluster.md) add GPU count, GPU-hours,
goodput and cost to each row; when the GPU count varies, `pareto` marks the front on cost per
million output tokens (GPU count without a price) vs p99 TTFT and goodput.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from profiler.errors import UsageError, quoted
from profiler.outdir import check_given_once, claim_out_dir
from profiler.services import terminate_on_signal
from solm.commands import check_listed_once
from solm.commands.simulate import add_batch_args, check_batch_flags, scheduling_kwargs
from solm.jsonline import json_line

if TYPE_CHECKING:
    import pandas as pd


def _list(text: str, flag: str, kind=str) -> list:
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise UsageError(f"{flag} needs a comma-separated list, got {quoted(text)}")
    try:
        values = [kind(x) for x in items]
    except ValueError:  # was: the text echoed whole, 5,000 digits in the error line
        raise UsageError(f"{flag} must be a comma-separated list of {kind.__name__}s, got {quoted(text)}") from None
    check_listed_once(values, flag, text)
    return values


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="simulate every combination of settings; Pareto front", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("traces", nargs="+", help="trace directories")
    p.add_argument("--hardware", required=True, help="comma-separated catalog parts")
    p.add_argument("--model", default=None, help="comma-separated catalog models (default: each trace's own)")
    p.add_argument("--max-seqs", default="256", help="comma-separated sequence caps (default 256)")
    p.add_argument("--rate", default=None, help="comma-separated Poisson rates, requests/s (inf allowed)")
    p.add_argument("--concurrency", default=None, help="comma-separated closed-loop client counts")
    add_batch_args(p)
    g = p.add_argument_group("deployment (simulator/cluster; docs/cluster.md)")
    g.add_argument("--tp", default="1", help="comma-separated tensor-parallel degrees (default 1)")
    g.add_argument("--pp", default="1", help="comma-separated pipeline stages (default 1)")
    g.add_argument("--pp-schedule", default="drain", help="drain (default) or interleave (batches in flight)")
    g.add_argument("--replicas", default="1", help="comma-separated replica counts (default 1)")
    g.add_argument(
        "--router", default=None, help="with --replicas 2+: round_robin (default), least_outstanding, kv_aware"
    )
    g.add_argument(
        "--workload",
        default=None,
        help="a request log (Splitwise CSV layout); each trace gives the structure its requests are stretched from",
    )
    g.add_argument("--time-scale", type=float, default=1.0, help="with --workload: arrivals this many times faster")
    g.add_argument("--price-per-gpu-hour", type=float, default=None, help="USD per GPU-hour: cost per million tokens")
    g.add_argument(
        "--gemm-calibration",
        action="append",
        metavar="CAL.json",
        help="GEMM tile-model parameters fitted on one part's own GEMMs (solm calibrate); applies to that "
        "part of --hardware (repeatable, one per part)",
    )
    p.add_argument("--backend", default="local", choices=("local", "ray"), help="process pool (default) or Ray")
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster: HOST:PORT, ray://HOST:PORT or auto (default, or local: start a local one on loopback)",
    )
    p.add_argument("--workers", type=int, default=None, help="parallel workers (default: one per core)")
    p.add_argument("--out", default=None, help="directory for results.jsonl and sweep.parquet")
    p.add_argument("--json", action="store_true", help="print only the JSON line")


def _gemm_calibrations(paths: list[str] | None) -> dict[str, str]:
    """{part: its fitted GemmParams as JSON} from each --gemm-calibration file (UsageError if bad)."""
    from simulator.gemm_calibration import read_calibration

    found: dict[str, str] = {}
    for path in paths or []:
        part, params = read_calibration(path)
        if part in found:
            raise UsageError(f"--gemm-calibration: two calibrations for {part}; give one per part")
        found[part] = json.dumps(params.to_json(), sort_keys=True)
    return found


def _cluster(args: argparse.Namespace) -> dict:
    from simulator.cluster.cli import check_pipeline, check_router, with_links
    from simulator.hardware import get_hardware
    from simulator.sweep import CLUSTER_DEFAULTS

    for part in _list(args.hardware, "--hardware"):  # the price once, not an error row per configuration
        with_links(get_hardware(part), args)
    calibrations = _gemm_calibrations(args.gemm_calibration)
    replicas = _list(args.replicas, "--replicas", int)
    check_router(args.router, max(replicas) > 1)
    pp = _list(args.pp, "--pp", int)
    check_pipeline(None, args.pp_schedule, max(pp) > 1)
    return {
        **({"gemm_calibrations": calibrations} if calibrations else {}),
        "tp": _list(args.tp, "--tp", int),
        "pp": pp,
        "pp_schedule": args.pp_schedule,
        "replicas": replicas,
        "router": args.router or CLUSTER_DEFAULTS["router"],
        "workload": args.workload,
        "time_scale": args.time_scale,
        "price_per_gpu_hour": args.price_per_gpu_hour,
        "slo_ttft_ms": args.slo_ttft_ms,
        "slo_tpot_ms": args.slo_tpot_ms,
    }


class _ProgressBar:
    """The sweep's tqdm bar on stderr; it appears with the first finished chunk."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(desc="sweep", unit="config", total=total, file=sys.stderr, leave=False)
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _sweep_table(
    args: argparse.Namespace, models: list, rates: list, conc: list, progress: _ProgressBar
) -> pd.DataFrame:
    """Run the grid under the --out lock (the remaining flags are parsed inside it, as before)."""
    from simulator.sweep import sweep

    # one writer per --out; an existing sweep folder is resumed, anything else non-empty refused
    lock = claim_out_dir(args.out, args.traces, None, resume="sweep") if args.out else contextlib.nullcontext()
    with lock, terminate_on_signal():  # SIGTERM/SIGHUP: the pool stops, finished rows stay; exit 143/129
        return sweep(
            args.traces,
            _list(args.hardware, "--hardware"),
            models,
            _list(args.max_seqs, "--max-seqs", int),
            rates or [None],
            conc or [None],
            args.max_batch_tokens,
            args.num_requests,
            args.scheduler,
            args.seed or 0,
            args.backend,
            args.address,
            args.workers,
            args.out,
            None if args.json else progress,
            options={k: v for k, v in scheduling_kwargs(args).items() if k != "scheduler"},
            cluster=_cluster(args),
        )


def _figures(table: pd.DataFrame, wall: float, args: argparse.Namespace) -> dict:
    """The JSON line: how many configurations ran, failed and are on the front."""
    ok = table[table["status"] == "ok"] if len(table) else table
    front = table[table["pareto"]] if len(table) else table
    return {
        "configs": int(len(table)),
        "ok": int(len(ok)),
        "errors": int(len(table) - len(ok)),
        "pareto": int(len(front)),
        "wall_s": wall,
        "backend": args.backend,
        "out": f"{args.out}/sweep.parquet" if args.out else None,
    }


def _front_columns(table: pd.DataFrame) -> list[str]:
    """The columns printed for the Pareto front (a deployment sweep's when the GPU count varies)."""
    if len(table) and "gpus" in table and table["gpus"].nunique() > 1:  # a deployment sweep
        return [
            "hardware",
            "model",
            "tp",
            "pp",
            "replicas",
            "gpus",
            "p99_ttft_ms",
            "request_goodput",
            "output_throughput",
            "gpu_hours",
            "cost_per_million_output_tokens",
        ]
    return [
        "trace",
        "hardware",
        "model",
        "max_seqs",
        "rate",
        "concurrency",
        "mean_e2el_ms",
        "output_throughput",
        "peak_kv_bytes",
        "quality_mean",
        "request_goodput",
    ]


def _print_summary(table: pd.DataFrame, figures: dict, args: argparse.Namespace) -> None:
    """The human-readable lines: counts, the front (at most 20 rows), the first distinct errors."""
    print(
        f"sweep: {figures['configs']} configurations ({figures['errors']} errors) in {figures['wall_s']:.1f} s on "
        f"{args.backend}; {figures['pareto']} Pareto-optimal"
    )
    front = table[table["pareto"]] if len(table) else table
    cols = _front_columns(table)
    if len(front):
        print(front[[c for c in cols if c in front]].to_string(index=False, max_rows=20))
    for err in table.loc[table["status"] == "error", "error"].drop_duplicates().head(3) if len(table) else []:
        print(f"  error: {err}")
    if args.out:
        print(f"  table: {figures['out']}")


def run(args: argparse.Namespace) -> int:
    check_given_once(args.traces, "trace")
    models = _list(args.model, "--model") if args.model else [""]
    rates = _list(args.rate, "--rate", float) if args.rate else []
    conc = _list(args.concurrency, "--concurrency", int) if args.concurrency else []
    check_batch_flags(args, bool(rates), bool(rates or conc))
    progress = _ProgressBar()
    t0 = time.perf_counter()
    try:
        table = _sweep_table(args, models, rates, conc, progress)
    finally:
        progress.close()
    figures = _figures(table, time.perf_counter() - t0, args)
    if not args.json:
        _print_summary(table, figures, args)
    print(json_line(figures))
    return 0
