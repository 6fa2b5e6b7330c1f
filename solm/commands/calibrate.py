"""`solm calibrate GEMMS.csv... --hardware H --out CAL.json`: fit the GEMM tile model to GEMM times
measured on one part.

What: reads a CSV of measured GEMMs (columns m, n, k and time_s, time_ms or time_us, or an
achieved FLOP/s column; `bench/gemm_profile.py` writes one on a GPU) or a vidur per-op profile
(`<model>.mlp.csv`: the GEMMs of its projections), several of them pooled, scores a fit on half of its
(K, N) shapes against the other half beside the A100 fit the simulator would carry to the part,
refits on every GEMM and writes the parameters. `solm cost`, `solm simulate` and `solm sweep` take
the file with `--gemm-calibration CAL.json`, and every GEMM the simulator costs on that part then
uses them.
Why: a part nobody measured gets the A100 fit carried by physics (docs/cost_model.md); a part
you can time a few dozen GEMMs on gets its own kernels' efficiencies, and the held-out figures
say how much that buys.

    solm calibrate simulator/data/xla-gemm/h100-sxm.csv --hardware h100-sxm --out h100.json
    solm cost --model llama-3-8b --hardware h100-sxm --gemm-calibration h100.json --explain
"""

from __future__ import annotations

import argparse
import json

from profiler.outdir import check_given_once, check_out_file, write_file_atomic
from solm.jsonline import json_line


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the GEMM tile model to GEMM times measured on one part",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "tables",
        nargs="+",
        metavar="GEMMS.csv",
        help="measured GEMMs (m, n, k and time_s / time_ms / time_us) or vidur mlp.csv profiles, all from one part",
    )
    p.add_argument("--hardware", required=True, help="catalog part the GEMMs were measured on")
    p.add_argument("--out", required=True, metavar="CAL.json", help="write the calibration here")
    p.add_argument("--force", action="store_true", help="overwrite CAL.json if it exists")
    p.add_argument("--json", action="store_true", help="print only the JSON line")


def _pct(stats: dict) -> str:
    return f"median {stats['median']:.1f}%  p90 {stats['p90']:.1f}%"


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from simulator.gemm_calibration import calibrate, read_gemm_table
    from solm.commands.cost import _lookup

    out = check_out_file(args.out, args.tables, args.force)
    check_given_once(args.tables, "GEMM table")
    hardware = _lookup("hardware", args.hardware)
    rows = pd.concat([read_gemm_table(table) for table in args.tables], ignore_index=True)
    source = ", ".join(map(str, args.tables))
    result = calibrate(rows, hardware, source=source)
    summary = {**result.to_json(), "out": str(out)}
    write_file_atomic(out, json.dumps(result.to_json(), indent=1) + "\n")
    if not args.json:
        held = result.heldout
        print(
            f"calibrated the GEMM tile model for {result.hardware} on {result.rows} GEMMs "
            f"({result.shapes} (K, N) shapes) from {source} -> {out}"
        )
        print(f"  held out ({held['split']}), APE:")
        print(f"    fitted on this part          {_pct(held['fitted'])}")
        print(f"    the default (shipped A100 fit) {_pct(held['carried'])}")
        print(f"  in sample (the refit on every GEMM, written): {_pct(result.in_sample)}")
        params = ", ".join(f"{k} {v:.3g}" for k, v in result.params.to_json().items())
        print(f"  params: {params}")
        print(f"  use it: solm cost --hardware {result.hardware} --gemm-calibration {out} --model MODEL")
    print(json_line(summary))
    return 0
