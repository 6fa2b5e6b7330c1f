"""`solm simulate TRACE --hardware H`: replay a trace's structure on another part, model and batch settings.

What: the trace's per-request forward passes (`simulator.workload`) are served by a SimPy model of
one device (`simulator.replay`): continuous batching under `--max-seqs` / `--max-batch-tokens`, a
paged KV pool of the part's memory minus the weights, arrivals from the trace, a Poisson `--rate`
or a closed loop of `--concurrency` clients. Prints `vllm bench serve`-style metrics, then one
JSON line; `--out DIR` also writes the simulated trace (format v1, kind "simulated").

    solm simulate traces/sequential-tiny --hardware h100-sxm --model llama-3-8b --rate 8 --num-requests 200
    solm simulate traces/sequential-tiny --hardware h100-sxm --set hbm_bytes_per_s=6e12 --json
    solm simulate traces/pasta-word_facts --model llama-3-70b --hardware h100-sxm --tp 4 --replicas 2
    solm simulate --workload simulator/data/workloads/splitwise_code.csv --structure-from traces/pasta-word_facts \
        --model llama-3-8b --hardware h100-sxm --disaggregate 1:2 --slo-ttft-ms 500 --price-per-gpu-hour 2.5

The deployment flags (TP, PP, replicas and routers, disaggregation, workload files, SLOs, cost)
are described in docs/cluster.md.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.errors import UsageError, quoted
from profiler.outdir import claim_out_dir
from solm.jsonline import json_line

if TYPE_CHECKING:
    from simulator.simtrace import ReplayResult


def add_batch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-batch-tokens", type=int, default=8192, help="cap on query tokens in one pass (default 8192)")
    p.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="replay this many requests, cycling through the trace's (default: the trace's count)",
    )
    add_scheduling_args(p)
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the Poisson arrivals of --rate (and of --workload's sampled structures; default 0)",
    )
    p.add_argument(
        "--slo-ttft-ms",
        type=float,
        default=None,
        help="goodput objective: time to first token, ms (default: none; goodput needs an SLO)",
    )
    p.add_argument(
        "--slo-tpot-ms",
        type=float,
        default=None,
        help="goodput objective: time per output token after the first, ms (default: none)",
    )


def add_scheduling_args(p: argparse.ArgumentParser, defaults: bool = True) -> None:
    """The shared scheduler's settings (docs/serving.md); `defaults=False`: None = the trace's own."""
    p.add_argument("--scheduler", default="fcfs" if defaults else None, help="batching policy: fcfs (default), sjf")
    p.add_argument(
        "--chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=True if defaults else None,
        help="split prompt prefills to fill --max-batch-tokens (vLLM's default: on)",
    )
    p.add_argument(
        "--reserve",
        choices=("current", "peak"),
        default="current" if defaults else None,
        help="admit by the KV the next pass needs (current, vLLM; default) or reserve each request's "
        "peak KV from the trace (peak: never preempts)",
    )
    p.add_argument(
        "--sjf-oracle",
        action="store_true",
        default=False if defaults else None,
        help="SJF ranks by the passes each request has left (the future; a what-if) instead of "
        "max_tokens and prompt length",
    )


def check_batch_flags(args: argparse.Namespace, rates: bool, paced: bool) -> None:
    """Refuse the batch and scheduling flags that would be accepted and have no effect (was: exit 0,
    the flag ignored). `rates`: a --rate is given; `paced`: a --rate or --concurrency is."""
    if args.seed is not None and not rates and not args.workload:
        raise UsageError("--seed draws the arrivals of --rate (or a --workload's structures): give one of them")
    if args.time_scale != 1.0 and (paced or not args.workload):  # --rate/--concurrency replace the file's arrivals
        raise UsageError(
            "--time-scale paces --workload's own arrivals: give --workload, and no --rate or --concurrency"
        )


def scheduling_kwargs(args: argparse.Namespace) -> dict:
    """ReplayConfig fields from the scheduling flags that were given (None: left to the caller)."""
    names = ("scheduler", "chunked_prefill", "reserve", "sjf_oracle", "slo_ttft_ms", "slo_tpot_ms")
    return {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}


MAX_SET_VALUE = 1e30  # beyond any real part's bytes, FLOP/s or seconds either way; times stay finite


def parse_set(items: list[str] | None) -> dict:
    """`--set FIELD=VALUE` pairs for a hypothetical part: numbers parsed, but a text field's value
    (name, kind, arch, topology, ...) kept as the text given (`name=123` names the part "123")."""
    from simulator.hardware import TEXT_FIELDS

    fields: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects FIELD=VALUE, got {quoted(item)}")
        if key.strip() in fields:  # was: the last one silently won
            raise UsageError(f"--set {key.strip()} is given twice")
        if key.strip() in TEXT_FIELDS:
            fields[key.strip()] = value
            continue
        try:
            number = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            fields[key.strip()] = value
            continue
        if not (number == 0 or 1 / MAX_SET_VALUE <= abs(number) <= MAX_SET_VALUE):  # inf, NaN, 1e400, 1e-300
            raise UsageError(
                f"--set {key.strip()} must be 0 or a finite number of magnitude "
                f"{1 / MAX_SET_VALUE:.0e}..{MAX_SET_VALUE:.0e}, got {value.strip()}"
            )
        fields[key.strip()] = number
    return fields


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a trace on hypothetical hardware, model and batch settings",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "trace",
        nargs="?",
        default=None,
        help="trace directory (measured or simulated); optional with --workload --structure-from",
    )
    p.add_argument("--hardware", required=True, help="catalog part (solm cost --help lists them)")
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="override a field of the part, e.g. hbm_bytes_per_s=6e12 (repeatable)",
    )
    p.add_argument(
        "--gemm-calibration",
        default=None,
        metavar="CAL.json",
        help="GEMM tile-model parameters fitted on --hardware's own measured GEMMs (solm calibrate)",
    )
    p.add_argument("--model", default=None, help="catalog model (default: the trace's own)")
    p.add_argument("--max-seqs", type=int, default=256, help="cap on sequences in one pass (default 256)")
    arrival = p.add_mutually_exclusive_group()
    arrival.add_argument("--rate", type=float, default=None, help="Poisson arrivals, requests/s (inf: all at once)")
    arrival.add_argument("--concurrency", type=int, default=None, help="closed loop of C clients")
    add_batch_args(p)
    p.add_argument("--block-size", type=int, default=16, help="KV page size in tokens (default 16)")
    p.add_argument(
        "--memory-utilization",
        type=float,
        default=0.9,
        help="share of device memory for weights + KV (default 0.9, as vLLM)",
    )
    p.add_argument("--out", default=None, help="write the simulated trace here")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    from simulator.cluster.cli import add_cluster_args

    add_cluster_args(p)


def simulate(args: argparse.Namespace) -> tuple[dict, ReplayResult]:
    """Run `solm simulate`: (the figures its JSON line prints, the replay result)."""
    from simulator.cluster.cli import cluster_config
    from simulator.cluster.run import simulate as simulate_cluster
    from simulator.models import ModelSpec, get_model
    from simulator.simtrace import write_simulated_trace

    check_batch_flags(args, args.rate is not None, args.rate is not None or args.concurrency is not None)
    hardware, calibrated_on = _part(args)
    cluster = cluster_config(args)
    config = _replay_config(args)
    out = Path(args.out) if args.out else None
    inputs = [p for p in (args.trace, args.workload, args.structure_from) if p]
    lock = claim_out_dir(out, inputs, args.force) if out is not None else contextlib.nullcontext()
    with lock:  # held from the check to the last file written: one writer per --out
        from simulator.cluster.cli import load_structure_and_workload

        trace, workload = load_structure_and_workload(args)
        model = get_model(args.model) if args.model else ModelSpec.from_trace_meta(trace.meta)
        result = simulate_cluster(workload, hardware, model, config, cluster)
        figures = {
            "trace": str(trace.path),
            "workload": args.workload,
            "system": trace.system,
            "hardware": hardware.name,
            "gemm_calibration": args.gemm_calibration,
            "gemm_calibration_part": calibrated_on,
            "model": model.name,
            **_settings(args, config),
            **result.metrics,
        }
        if out is not None:
            figures["out"] = str(write_simulated_trace(result, out, source=trace))
    return figures, result


def _part(args: argparse.Namespace) -> tuple:
    """(the part to replay on, the part its GEMM calibration was measured on or None): `--hardware`
    with `--set`, `--topology`, `--price-per-gpu-hour` and `--gemm-calibration` applied."""
    from simulator.cluster.cli import with_links
    from simulator.hardware import get_hardware, override

    fields = parse_set(args.set)
    hardware = with_links(override(args.hardware, **fields) if fields else get_hardware(args.hardware), args)
    if not args.gemm_calibration:
        return hardware, None
    from simulator.gemm_calibration import calibrated_part

    return calibrated_part(hardware, args.gemm_calibration)


def _replay_config(args: argparse.Namespace):
    """The replay's settings from the batch, arrival and scheduling flags."""
    from simulator.replay import ReplayConfig

    return ReplayConfig(
        max_seqs=args.max_seqs,
        max_batch_tokens=args.max_batch_tokens,
        block_size=args.block_size,
        memory_utilization=args.memory_utilization,
        rate=args.rate,
        concurrency=args.concurrency,
        num_requests=args.num_requests,
        seed=args.seed or 0,
        **scheduling_kwargs(args),
    )


def _settings(args: argparse.Namespace, config) -> dict:
    """The arrival, batch and scheduling settings as the JSON line reports them."""
    return {
        "arrival": config.arrival,
        "rate": args.rate,
        "concurrency": args.concurrency,
        "max_seqs": config.max_seqs,
        "max_batch_tokens": config.max_batch_tokens,
        "scheduler": config.scheduler,
        "chunked_prefill": config.chunked_prefill,
        "reserve": config.reserve,
        "sjf_oracle": config.sjf_oracle,
    }


def _ms(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def run(args: argparse.Namespace) -> int:
    figures, result = simulate(args)
    if not args.json:
        f = figures
        print(
            f"{f['trace']}: {f['system']} replayed on {f['hardware']} with {f['model']} "
            f"({f['arrival']} arrivals, max-seqs {f['max_seqs']}, max-batch-tokens {f['max_batch_tokens']}, "
            f"{f['scheduler']}{' (oracle)' if f['sjf_oracle'] else ''}, chunked prefill "
            f"{'on' if f['chunked_prefill'] else 'off'}, reserve {f['reserve']})"
        )
        if f["gemm_calibration"]:
            print(
                f"  GEMMs           the tile model fitted on GEMMs measured on {f['gemm_calibration_part']}: "
                f"{f['gemm_calibration']}"
            )
        print(
            f"  requests        {f['completed']} completed, {f['failed']} failed; {f['passes']} passes, "
            f"{f['preemptions']} preemptions ({f['recomputed_tokens']} tokens recomputed), "
            f"{f['prefill_chunks']} prefill chunks; duration {f['duration_s']:.3f} s"
        )
        for row in result.requests[result.requests["status"] == "error"].head(3).itertuples():
            print(f"  error           request {row.request_id}: {row.error}")
        print(f"  throughput      {_ms(f['request_throughput'])} req/s, {_ms(f['output_throughput'])} output tokens/s")
        for name in ("ttft", "tpot", "itl", "e2el"):
            print(
                f"  {name + ' ms':15s} mean {_ms(f[f'mean_{name}_ms'])}  median {_ms(f[f'median_{name}_ms'])}  "
                f"p99 {_ms(f[f'p99_{name}_ms'])}"
            )
        print(
            f"  peak KV         {f['peak_kv_bytes'] / 2**20:.2f} MiB of {f['kv_capacity_bytes'] / 2**30:.2f} GiB pool"
            f"{' (one replica, its GPUs together)' if f['gpus'] > 1 else ''}"
        )
        from simulator.cluster.summary import deployment_lines

        for line in deployment_lines(f):
            print(line)
        print(f"  quality mean    {_ms(f['quality_mean'])} (from the source trace)")
        if "out" in f:
            print(f"  simulated trace {f['out']}")
    print(json_line(figures))
    return 0
