"""Flag fuzz: every value-taking flag of every `solm` command, given hostile values, as a user would.

What: the flags are read from solm's own parser (`solm.cli.build_parser`), so a flag added later is
fuzzed without editing this file (`train` only with `--command train`: slow). Each (command, flag, value) runs `python -m solm COMMAND BASE...
FLAG VALUE` in a fresh temp folder, where BASE is a small valid invocation of that command (a shipped
trace, a catalog part, a tiny model), and is classified:
  ok          exit 0, or exit 2 with one stderr line `solm <command>: error: ...` of at most 400
              characters (a refusal that names the value without echoing 3,000 characters of it;
              bench/abuse.py's `refusal` rule, and its `run_solm` runs each case)
  bug         exit 1 ("internal error (a bug)"), a traceback, or any other exit status
  multi_line  exit 2 with more than one stderr line
  long_line   exit 2 with a line over 400 characters
  hang        still running at the timeout (killed with its process group)
Values: a 3,000-character word, NaN, +/-inf, -1, 0, 1e400, 1e-400, hex, an underscore number,
padded numbers, an Arabic-Indic digit; `--quick`: the first four.

Why: bench/abuse.py replays the misuses found so far, case by case; this sweeps every flag with
the values that broke some flag before (a NaN rate, a 5,000-digit value echoed whole), so the next
flag added is checked too. `dashboard` (a server) is left out.

    python bench/flag_fuzz.py [--quick] [--command simulate]

Output: one line per case that is not ok, then {"bench": "flag_fuzz", "cases", "ok", "bugs",
"multi_lines", "long_lines", "hangs", "seconds"}; exit 1 if any case is not ok.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# last on the path, so that bench/simulator.py and bench/runtime.py never shadow solm's packages
sys.path.append(str(ROOT / "bench"))

from abuse import refusal, run_solm  # noqa: E402  (the abuse bench's runner and its one-line rule)

from solm.cli import build_parser  # noqa: E402

TRACE = str(ROOT / "traces" / "pasta-smollm2")
VALUES = ("v" * 3000, "nan", "inf", "-1", "-inf", "0", "1e400", "1e-400", "0x10", "1_000", " 5", "5 ", "٣")
QUICK_VALUES = VALUES[:4]
# A small valid invocation of each command; "OUT" becomes a path in the case's own folder. `train`
# runs only when asked for (`--command train`): each value it accepts trains and evaluates a model
# (about 90 s on the 2-core machine).
BASE: dict[str, list[str]] = {
    "capture": ["--model", "tiny-2l", "--n", "1", "--max-tokens", "4", "--out", "OUT"],
    "inspect": [TRACE],
    "train": ["--system", "sequential", "--steps", "1", "--out", "OUT"],  # only with --command train
    "cost": ["--model", "llama-3-8b", "--hardware", "h100-sxm"],
    "calibrate": [
        str(ROOT / "simulator" / "data" / "xla-gemm" / "h100-sxm.csv"),
        "--hardware",
        "h100-sxm",
        "--out",
        "OUT",
    ],
    "diff": [str(ROOT / "traces" / "pasta-word_facts"), str(ROOT / "traces" / "planned_diffusion-word_facts")],
    "export": [TRACE, "--perfetto", "OUT"],
    "simulate": [TRACE, "--hardware", "h100-sxm", "--num-requests", "3"],
    "validate": [TRACE],
    "sweep": [TRACE, "--hardware", "h100-sxm", "--num-requests", "3", "--out", "OUT"],
}


def flag_cases(commands: list[str] | None = None) -> list[tuple[str, str]]:
    """(command, flag) for every flag of BASE's commands that takes a value without fixed choices."""
    parser, _ = build_parser()
    cases = []
    for name, sub in parser.commands.items():
        if name not in BASE or (commands and name not in commands) or (not commands and name == "train"):
            continue
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0 or action.choices:
                continue
            cases.append((name, max(action.option_strings, key=len)))
    return cases


def argv_of(command: str, flag: str, value: str, folder: Path) -> list[str]:
    """The case's solm arguments: BASE (without its own value for `flag`) and `flag value`."""
    base, out = [], str(folder / "out")
    it = iter(BASE[command])
    for arg in it:
        if arg == flag:  # the fuzzed flag replaces BASE's value for it
            next(it, None)
            continue
        base.append(out if arg == "OUT" else arg)
    return [command, *base, flag, value]


def classify(command: str, proc: subprocess.CompletedProcess | None) -> str:
    if proc is None:
        return "hang"
    if "Traceback" in proc.stderr or proc.returncode not in (0, 2):
        return "bug"
    if proc.returncode == 0:
        return "ok"
    return {"one_line": "ok", "long_line": "long_line"}.get(refusal(command, proc.stderr), "multi_line")


def run_case(command: str, flag: str, value: str, timeout_s: float) -> tuple[str, str]:
    """(outcome, the last stderr line cut to 160 characters)."""
    with tempfile.TemporaryDirectory(prefix="solm-fuzz-") as tmp:
        proc = run_solm(argv_of(command, flag, value, Path(tmp)), Path(tmp), timeout_s)
    last = (proc.stderr.strip().splitlines() or [""])[-1][:160] if proc is not None else "timeout"
    return classify(command, proc), last


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"the first {len(QUICK_VALUES)} values only")
    ap.add_argument("--command", action="append", choices=sorted(BASE), help="only this command (repeatable)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a case may run (default 120)")
    ap.add_argument("--workers", type=int, default=2, help="cases run at once (default 2)")
    args = ap.parse_args(argv)
    values = QUICK_VALUES if args.quick else VALUES
    jobs = [(c, f, v) for c, f in flag_cases(args.command) for v in values]
    t0 = time.perf_counter()
    counts: Counter = Counter()
    with ThreadPoolExecutor(max(1, args.workers)) as pool:
        for (command, flag, value), (outcome, last) in zip(
            jobs, pool.map(lambda job: run_case(*job, args.timeout), jobs)
        ):
            counts[outcome] += 1
            if outcome != "ok":
                shown = value if len(value) <= 20 else f"<{len(value)} characters>"
                print(f"{outcome:10s} solm {command} {flag} {shown!r}: {last}", flush=True)
    figures = {
        "bench": "flag_fuzz",
        "quick": args.quick,
        "cases": len(jobs),
        "ok": counts["ok"],
        "bugs": counts["bug"],
        "multi_lines": counts["multi_line"],
        "long_lines": counts["long_line"],
        "hangs": counts["hang"],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(figures))
    return 0 if counts["ok"] == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
