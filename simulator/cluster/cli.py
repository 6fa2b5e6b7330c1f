"""The deployment flags `solm simulate` (and `solm sweep`) share, and their parsing."""

from __future__ import annotations

import argparse
import dataclasses

from profiler.errors import UsageError, quoted


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("deployment (simulator/cluster; docs/cluster.md)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per replica (default 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline stages per replica (default 1)")
    g.add_argument(
        "--micro-batches",
        type=int,
        default=None,
        help="drain: micro-batches a pass is cut into; interleave: batches in flight (default --pp)",
    )
    g.add_argument(
        "--pp-schedule",
        default="drain",
        help="drain (default: each pass's micro-batches leave the pipeline before the next pass) or "
        "interleave (vLLM's virtual engines: --micro-batches independent batches in flight)",
    )
    g.add_argument(
        "--topology", default=None, help="node topology: nvswitch, nvlink_pairs, pcie, mesh (default: the part's)"
    )
    g.add_argument("--price-per-gpu-hour", type=float, default=None, help="USD per GPU-hour: cost figures")
    g.add_argument("--replicas", type=int, default=1, help="replicas behind the router (default 1)")
    g.add_argument(
        "--router",
        default=None,
        help="with --replicas 2+ or --disaggregate: round_robin (default), least_outstanding, kv_aware",
    )
    g.add_argument(
        "--disaggregate",
        default=None,
        metavar="P:D",
        help="P prefill and D decode replicas, KV sent between them over the interconnect",
    )
    g.add_argument("--decode-hardware", default=None, help="with --disaggregate: the decode replicas' part")
    g.add_argument(
        "--workload",
        default=None,
        metavar="FILE.csv",
        help="a request log (arrived_at,num_prefill_tokens,num_decode_tokens), e.g. "
        "simulator/data/workloads/splitwise_code.csv; structure from --structure-from",
    )
    g.add_argument(
        "--structure-from",
        default=None,
        metavar="TRACE",
        help="with --workload: the trace whose requests' structures are stretched to its lengths",
    )
    g.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="with --workload: arrivals come this many times faster (default 1)",
    )
    g.add_argument("--columns", default=None, help="with --workload: EXPECTED=YOURS,... for other column names")


def parse_disaggregate(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    left, sep, right = str(text).partition(":")
    try:
        pd = (int(left), int(right))
    except ValueError:
        pd = None
    if not sep or pd is None or min(pd) < 1:
        # the value cut to 60 characters (was: a 5,000-digit value echoed whole, one 5,000-character line)
        raise UsageError(f"--disaggregate takes P:D (prefill and decode replicas, each >= 1), got {quoted(text)}")
    return pd


def with_links(hardware, args: argparse.Namespace):
    """The part with `--topology` and `--price-per-gpu-hour` applied (validated)."""
    fields = {}
    if getattr(args, "topology", None):
        fields["topology"] = args.topology
    if getattr(args, "price_per_gpu_hour", None) is not None:
        fields["price_per_gpu_hour"] = args.price_per_gpu_hour
    try:
        return dataclasses.replace(hardware, **fields) if fields else hardware
    except ValueError as error:  # the catalog's own validation
        raise UsageError(str(error)) from None


def cluster_config(args: argparse.Namespace):
    from simulator.cluster.parallel import Parallelism
    from simulator.cluster.run import ClusterConfig
    from simulator.hardware import get_hardware

    decode = None
    if getattr(args, "decode_hardware", None):
        if not args.disaggregate:
            raise UsageError("--decode-hardware needs --disaggregate P:D")
        decode = with_links(get_hardware(args.decode_hardware), args)
        prefill = get_hardware(args.hardware)
        if decode.kind != prefill.kind:  # was: a GPU's KV "sent" to a CPU over NVLink in 0.02 ms, "2 GPUs"
            raise UsageError(
                f"--decode-hardware {decode.name} is a {decode.kind.upper()} and --hardware {prefill.name} a "
                f"{prefill.kind.upper()}: the KV between them is timed over one kind's links; give two of one kind"
            )
    schedule = getattr(args, "pp_schedule", "drain")
    check_pipeline(args.micro_batches, schedule, args.pp > 1)
    check_router(args.router, args.replicas > 1 or bool(args.disaggregate))
    if args.topology and args.tp == args.pp == 1 and not args.disaggregate:  # was: silently ignored
        raise UsageError("--topology applies to links between GPUs: give --tp or --pp 2 or more, or --disaggregate")
    return ClusterConfig(
        Parallelism(args.tp, args.pp, args.micro_batches, schedule),
        replicas=args.replicas,
        router=args.router or ClusterConfig.router,
        disaggregate=parse_disaggregate(args.disaggregate),
        decode_hardware=decode,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
    )


def check_pipeline(micro_batches: int | None, schedule: str, pipelined: bool) -> None:
    """Pipeline settings with one stage schedule nothing (was: silently ignored)."""
    if not pipelined and (micro_batches is not None or schedule == "interleave"):
        raise UsageError("--micro-batches and --pp-schedule apply to a pipeline: give --pp 2 or more")


def check_router(router: str | None, routed: bool) -> None:
    """A --router with one replica routes nothing (was: accepted and ignored)."""
    if router is not None and not routed:
        raise UsageError("--router picks among replicas: give --replicas 2 or more (or --disaggregate)")


def load_structure_and_workload(args: argparse.Namespace):
    """(source trace, workload): the positional trace's own, or a workload file stretched over a
    structure trace (`--workload FILE --structure-from TRACE`)."""
    from profiler.validate import read_valid_trace
    from simulator.workload import from_trace

    structure_path = args.structure_from or args.trace
    if args.workload is None:
        if args.structure_from or args.columns:  # (--time-scale: solm.commands.simulate.check_batch_flags)
            raise UsageError("--structure-from and --columns go with --workload FILE")
        if not args.trace:
            raise UsageError("give a trace directory, or --workload FILE --structure-from TRACE")
        trace = read_valid_trace(args.trace)
        return trace, from_trace(trace)
    from simulator.cluster.workload_file import read_workload_file, stretch

    if not structure_path:
        raise UsageError("--workload needs --structure-from TRACE (whose request structures it stretches)")
    if args.trace and args.structure_from:  # one would be silently ignored
        raise UsageError(
            f"with --workload, give the structure trace once: {args.trace} or --structure-from {args.structure_from}"
        )
    log = read_workload_file(args.workload, args.columns, args.time_scale)
    trace = read_valid_trace(structure_path)
    return trace, stretch(from_trace(trace), log, seed=args.seed or 0)
