"""`solm validate TRACE`: how far the simulator is from a measured run.

What: calibrates the cost model on the measured steps of half the requests (even positions) and
replays the other half on the trace's own hardware and model, as they were captured (one at a
time); reports `step_time_mape_percent` and `request_latency_mape_percent` (see
simulator/validation.py). With `--uncalibrated`, nothing is fitted to the trace: the whole trace is
predicted from its structure and the catalog part's default cost model (`cross_check`: what the
simulator would have said before the run, e.g. for a GPU trace against the catalog H200). Human
summary, then one JSON line; `--json` for the JSON only.

Under load (docs/serving.md): `solm validate SERVING... --calibrate-from BATCH1` predicts each
serving trace (a `solm capture --rate/--concurrency` run) from a cost model calibrated only on the
batch-1 trace of the same system and model, replaying the serving trace's own arrivals and batch
settings; prints the errors of TTFT, TPOT, E2E and throughput per load level.

    solm validate traces/sequential-tiny
    solm validate runs/seq-r2 runs/seq-r6 --calibrate-from traces/sequential-reverse_words
"""

from __future__ import annotations

import argparse
import sys

from profiler.errors import UsageError
from profiler.outdir import check_given_once
from solm.jsonline import json_line


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate", help="error of the simulator against a measured trace", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("trace", nargs="+", help="measured trace directory (several serving traces with --calibrate-from)")
    p.add_argument(
        "--calibrate-from",
        default=None,
        metavar="BATCH1_TRACE",
        help="calibrate only on this batch-1 trace and predict the serving traces under load",
    )
    from solm.commands.simulate import add_scheduling_args

    add_scheduling_args(p, defaults=False)
    p.add_argument("--hardware", default=None, help="catalog part (default: the device the trace names)")
    p.add_argument(
        "--forward-fit",
        choices=("auto", "sweep", "line", "roofline"),
        default="auto",
        help="with --calibrate-from: how the forward is costed (auto: on the part the trace ran on, a CPU's or a "
        "GPU's, as measured: the rows sweep's grid, or a line through its passes without one; on another part "
        "the cost model's roofline rescaled to it)",
    )
    p.add_argument(
        "--uncalibrated",
        action="store_true",
        help="predict from the catalog part's default cost model, fitting nothing to the trace",
    )
    p.add_argument(
        "--run",
        type=int,
        default=None,
        metavar="K",
        help="a --repeats capture: validate the trace as its run K alone saw it (0: the first round, what "
        "a --repeats 1 capture would have recorded; from runs.parquet)",
    )
    p.add_argument("--json", action="store_true", help="print only the JSON line")


def _pct(x) -> str:
    return "  n/a" if x is None or x != x else f"{x:5.1f}"


def run_load(args: argparse.Namespace) -> int:
    from simulator.load_validation import validate_load
    from solm.commands.simulate import scheduling_kwargs

    v = validate_load(
        args.trace, args.calibrate_from, args.hardware, forward_fit=args.forward_fit, **scheduling_kwargs(args)
    )
    if not args.json:
        print(
            f"{v['system']} with {v['model']} on {v['hardware']}: calibrated on {v['calibrate_from']} only "
            f"({v['calibration_passes']} batch-1 passes; host {v['host_per_pass_s'] * 1e3:.2f} ms/pass + "
            f"{v['host_per_stream_s'] * 1e3:.2f} ms/stream + {v['host_per_request_s'] * 1e3:.2f} ms/request + "
            f"{v['host_per_row_s'] * 1e6:.1f} us/row; {v['rows_sweep_passes']} rows-sweep passes)"
        )
        print(f"  forward: {v['cost_params']}")
        print(
            f"  {'load':>12s} {'reqs':>5s} {'batch m/s':>10s} {'preempt m/s':>11s}   "
            f"APE %: {'TTFT50':>6s} {'TPOT50':>6s} {'E2E50':>6s} {'E2E99':>6s} {'tput':>6s}   MAPE %: TTFT  E2E"
        )
        for lv in v["levels"]:
            e = lv["errors"]
            load = (
                f"rate {lv['rate']:g}"
                if lv["rate"] is not None
                else (f"conc {lv['concurrency']}" if lv["concurrency"] is not None else "trace")
            )
            print(
                f"  {load:>12s} {lv['requests']:5d} {lv['mean_batch_measured'] or 0:4.1f}/{lv['mean_batch_simulated'] or 0:<4.1f}"
                f" {lv['preemptions_measured']:5d}/{lv['preemptions_simulated']:<5d}          "
                f"{_pct(e.get('ttft_p50_ape_percent'))}  {_pct(e.get('tpot_p50_ape_percent'))}  "
                f"{_pct(e.get('e2e_p50_ape_percent'))}  {_pct(e.get('e2e_p99_ape_percent'))}  "
                f"{_pct(e.get('throughput_ape_percent'))}          {_pct(e.get('ttft_mape_percent'))} "
                f"{_pct(e.get('e2e_mape_percent'))}"
            )
    for w in v["warnings"]:
        print(f"solm validate: warning: {w}", file=sys.stderr)
    print(json_line(v))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.calibrate_from is not None:
        if args.uncalibrated or args.run is not None:  # was: silently ignored under load
            raise UsageError("--uncalibrated and --run apply to one trace's validation, not with --calibrate-from")
        check_given_once(args.trace, "trace")  # was: its load level validated, printed and averaged twice
        return run_load(args)
    _check_one_trace_flags(args)
    args.trace = args.trace[0]
    if args.uncalibrated and args.run is not None:
        raise UsageError("--run applies to the calibrated validation, not --uncalibrated")
    return run_uncalibrated(args) if args.uncalibrated else run_calibrated(args)


def _check_one_trace_flags(args: argparse.Namespace) -> None:
    """One trace's validation replays it as captured: refuse the flags that only validation under
    load reads, and more than one trace."""
    if args.forward_fit != "auto":
        raise UsageError("--forward-fit applies to validation under load (--calibrate-from BATCH1_TRACE)")
    from solm.commands.simulate import scheduling_kwargs

    given = scheduling_kwargs(args)  # the replay of one trace runs it as captured: these would be ignored
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise UsageError(f"{flags}: scheduling settings apply to validation under load (--calibrate-from BATCH1_TRACE)")
    if len(args.trace) > 1:
        raise UsageError("several traces need --calibrate-from (validation under load)")


def run_uncalibrated(args: argparse.Namespace) -> int:
    """`solm validate TRACE --uncalibrated`: the trace predicted from the catalog part alone."""
    from simulator.validation import cross_check

    v = cross_check(args.trace, args.hardware)
    if not args.json:
        print(
            f"{v['trace']}: {v['system']} on {v['hardware']} with {v['model']}, uncalibrated "
            f"({v['cost_params']}), {v['requests']} requests"
        )
        print(f"  hardware        {v['hardware_source']}")
        print(
            f"  step time MAPE {v['step_time_mape_percent']:.1f}%, request latency MAPE "
            f"{v['request_latency_mape_percent']:.1f}%; mean e2e measured {v['measured_e2e_s_mean'] * 1e3:.1f} ms, "
            f"simulated {v['simulated_e2e_s_mean'] * 1e3:.1f} ms"
        )
    print(json_line(v))
    return 0


def run_calibrated(args: argparse.Namespace) -> int:
    """`solm validate TRACE [--run N]`: calibrated on half the trace's requests, checked on the rest."""
    from simulator.validation import validate

    source, note = args.trace, ""
    if args.run is not None:
        from profiler.runs import single_run
        from profiler.validate import read_valid_trace

        source, info = single_run(read_valid_trace(args.trace), args.run)
        note = f" [run {args.run} alone: {info['requests']} requests, {info['left_out']} left out]"
    v = validate(source, args.hardware)
    if args.run is not None:
        v["run"] = args.run
    if not args.json:
        print(
            f"{v['trace']}: {v['system']} on {v['hardware']} with {v['model']}; calibrated on "
            f"{v['calibration_requests']} requests ({v['calibration_steps']} passes), checked on "
            f"{v['check_requests']} ({v['check_steps']} passes){note}"
        )
        print(f"  hardware        {v['hardware_source']}")
        print(
            f"  step time       MAPE {v['step_time_mape_percent']:.1f}%  (median APE "
            f"{v['step_time_median_ape_percent']:.1f}%)"
        )
        print(
            f"  request latency MAPE {v['request_latency_mape_percent']:.1f}%  (TTFT {v['ttft_mape_percent']:.1f}%); "
            f"mean e2e measured {v['measured_e2e_s_mean'] * 1e3:.1f} ms, simulated {v['simulated_e2e_s_mean'] * 1e3:.1f} ms"
        )
    print(json_line(v))
    return 0
