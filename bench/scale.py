"""The trace tools at scale: wall time and peak memory of `solm inspect`, `solm diff`, `solm export
--perfetto` on a simulated trace of many requests, and of a command's start (`solm inspect --help`).

    .venv/bin/python bench/scale.py [--quick] [--requests N] [--repeats R]

A simulated trace of N requests (default 100,000; --quick 10,000) is written once by `solm
simulate` into a temporary folder, deleted at the end. Each command then runs R times (default 2),
the commands interleaved round by round (this machine's speed drifts); each figure is printed as
the fastest run with every run beside it. Peak memory is the command's own maximum resident set
(os.wait4). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOLM = [sys.executable, "-m", "solm"]


def timed(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident MB) of one command; raises if it fails."""
    t0 = time.perf_counter()
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode() if p.stderr else ""
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args[2:])}: exit {p.returncode}: {err.strip()[-300:]}")
    return wall, usage.ru_maxrss / 1024  # Linux: kilobytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10,000 requests")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    n = a.requests or (10_000 if a.quick else 100_000)
    with tempfile.TemporaryDirectory(prefix="solm-scale-") as tmp:
        trace = str(Path(tmp) / "trace")
        sim = [*SOLM, "simulate", "traces/sequential-reverse_words", "--hardware", "h100-sxm"]
        sim += ["--model", "llama-3-8b", "--num-requests", str(n), "--rate", "200", "--out", trace, "--json"]
        build_s, _ = timed(sim)
        commands = {
            "start": [*SOLM, "inspect", "--help"],
            "inspect": [*SOLM, "inspect", trace, "--json"],
            "diff": [*SOLM, "diff", trace, trace, "--json"],
            "export": [*SOLM, "export", trace, "--perfetto", str(Path(tmp) / "t.json"), "--force", "--json"],
        }
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}
        for _ in range(a.repeats):
            for name, cmd in commands.items():
                runs[name].append(timed(cmd))
        size = (Path(tmp) / "t.json").stat().st_size
    print(f"simulated trace of {n} requests written in {build_s:.1f} s; each command {a.repeats} times, interleaved")
    out: dict = {"bench": "scale", "requests": n, "repeats": a.repeats, "perfetto_bytes": size}
    for name, rs in runs.items():
        walls, peaks = [w for w, _ in rs], [m for _, m in rs]
        every = ", ".join(f"{w:.1f}" for w in walls)
        print(f"  {name:8s} fastest {min(walls):7.1f} s (every run: {every})   peak {max(peaks):7.0f} MB")
        out[f"{name}_s_fastest"] = round(min(walls), 2)
        out[f"{name}_s_runs"] = [round(w, 2) for w in walls]
        out[f"{name}_peak_mb"] = round(max(peaks))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
