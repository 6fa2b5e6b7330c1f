"""`make bench`: run every benchmark in bench/ and collect their JSON lines into out/bench.jsonl.

.venv/bin/python bench/run_all.py [--quick]     (make bench QUICK=1)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {
    "run_all.py",
    "demo.py",
    "gpu_capture.py",
    "decode_efficiency.py",
    "gemm_profile.py",
}  # GPU tools: bench/gpu_run.sh


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    results, failed = [], []
    for script in sorted((ROOT / "bench").glob("*.py")):
        if script.name in SKIP:
            continue
        cmd = [sys.executable, str(script)] + (["--quick"] if args.quick else [])
        print(f"\n=== {script.name} {'--quick' if args.quick else ''}", flush=True)
        r = subprocess.run(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE)
        print(r.stdout, end="")
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        try:
            results.append(json.loads(last))
        except json.JSONDecodeError:
            failed.append(script.name)
        if r.returncode != 0:
            failed.append(script.name)
    out = ROOT / "out" / "bench.jsonl"
    out.parent.mkdir(exist_ok=True)
    out.write_text("".join(json.dumps(x) + "\n" for x in results))
    print(
        f"\n{len(results)} benchmark(s) -> {out.relative_to(ROOT)}"
        + (f"; FAILED: {', '.join(sorted(set(failed)))}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
