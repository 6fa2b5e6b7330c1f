"""`solm validate TRACE`: how far the simulator is from a measured run.

What: calibrates the cost model on the measured steps of half the requests (even positions) and
replays the other half on the trace's own hardware and model, as they were captured (one at a
time); reports `step_time_mape_percent` and `request_latency_mape_percent` (see
simulator/validation.py). With `--uncalibrated`, nothing is fitted to the trace: the whole trace is
predicted from its structure and the catalog part's default cost model (`cross_check`: what the
simulator would have said before the run, e.g. for a GPU trace against the catalog H200). Human
summary, then one JSON line; `--json` for the JSON only.

    solm validate traces/sequential-tiny
"""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="error of the simulator against a measured trace",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="measured trace directory")
    p.add_argument("--hardware", default=None, help="catalog part (default: the device the trace names)")
    p.add_argument("--uncalibrated", action="store_true",
                   help="predict from the catalog part's default cost model, fitting nothing to the trace")
    p.add_argument("--json", action="store_true", help="print only the JSON line")


def run(args: argparse.Namespace) -> int:
    from simulator.validation import cross_check, validate

    if args.uncalibrated:
        v = cross_check(args.trace, args.hardware)
        if not args.json:
            print(f"{v['trace']}: {v['system']} on {v['hardware']} with {v['model']}, uncalibrated "
                  f"({v['cost_params']}), {v['requests']} requests")
            print(f"  hardware        {v['hardware_source']}")
            print(f"  step time MAPE {v['step_time_mape_percent']:.1f}%, request latency MAPE "
                  f"{v['request_latency_mape_percent']:.1f}%; mean e2e measured {v['measured_e2e_s_mean'] * 1e3:.1f} ms, "
                  f"simulated {v['simulated_e2e_s_mean'] * 1e3:.1f} ms")
        print(json.dumps(v))
        return 0
    v = validate(args.trace, args.hardware)
    if not args.json:
        print(f"{v['trace']}: {v['system']} on {v['hardware']} with {v['model']}; calibrated on "
              f"{v['calibration_requests']} requests ({v['calibration_steps']} passes), checked on "
              f"{v['check_requests']} ({v['check_steps']} passes)")
        print(f"  hardware        {v['hardware_source']}")
        print(f"  step time       MAPE {v['step_time_mape_percent']:.1f}%  (median APE "
              f"{v['step_time_median_ape_percent']:.1f}%)")
        print(f"  request latency MAPE {v['request_latency_mape_percent']:.1f}%  (TTFT {v['ttft_mape_percent']:.1f}%); "
              f"mean e2e measured {v['measured_e2e_s_mean'] * 1e3:.1f} ms, simulated {v['simulated_e2e_s_mean'] * 1e3:.1f} ms")
    print(json.dumps(v))
    return 0
