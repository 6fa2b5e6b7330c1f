"""`make demo`: what solm does, end to end on this CPU, in a few minutes.

Captures each system that has a shipped model on a handful of held-out prompts, inspects each
trace, and tells you what to run next. Everything goes under out/demo/ (safe to delete).

    .venv/bin/python bench/demo.py [--n 6] [--out out/demo]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def solm(*args: str) -> dict:
    """Run the real command line, show its human output, return its JSON line."""
    print(f"\n$ solm {' '.join(args)}", flush=True)
    r = subprocess.run([sys.executable, "-m", "solm", *args], cwd=ROOT, text=True, capture_output=True)
    lines = r.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(line)
    if r.returncode != 0:
        print(r.stderr.strip(), file=sys.stderr)
        raise SystemExit(f"demo: `solm {args[0]}` failed with exit status {r.returncode}")
    return json.loads(lines[-1])


def print_summary(captured: list, simulated: list, wall_s: float) -> None:
    """What each capture measured, grouped by task: each system runs its own shipped model on its
    own default task, so rows are not a comparison of systems (the benchmarks compare them on
    equal terms: bench/pasta.py, bench/tip.py, bench/planned_diffusion.py)."""
    print(
        f"\ndemo: captured {len(captured)} system(s) in {wall_s:.0f} s, each with its own shipped model on its own "
        f"default task\n(not a comparison of systems: for that, bench/pasta.py, bench/tip.py, bench/planned_diffusion.py):"
    )
    by_task: dict[str, list] = {}
    for system, trace, s in captured:
        by_task.setdefault(s["task"], []).append((system, trace, s))
    for task, rows in sorted(by_task.items()):
        print(f"  task {task}:")
        for system, trace, s in rows:
            print(
                f"    {system:<18} model {s['model']:<14} quality {s['quality_mean']:.3f}  {s['tokens_per_s']:.0f} tokens/s  "
                f"e2e p50 {s['e2e_s_p50'] * 1000:.0f} ms  peak KV {s['peak_kv_bytes'] / 1024:.0f} KiB  -> {trace.relative_to(ROOT)}"
            )
    if simulated:
        print("  each trace's structure replayed as Llama-3-8B on an H100 at 8 req/s (same caveat):")
    for system, sim_out, m in simulated:
        print(
            f"    {system:<18} e2e median {m['median_e2el_ms']:.0f} ms, {m['output_throughput']:.0f} output tokens/s  "
            f"-> {sim_out.relative_to(ROOT)}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=6, help="prompts per system")
    ap.add_argument("--out", default="out/demo")
    args = ap.parse_args()

    from runtime.checkpoint import CHECKPOINTS_DIR
    from runtime.engines import get_engine, systems

    t0 = time.perf_counter()
    out = ROOT / args.out
    captured = []
    for system in systems():
        engine = get_engine(system)
        if not engine.default_model or not (CHECKPOINTS_DIR / engine.default_model).is_dir():
            print(f"\n(skipping {system}: no shipped model)")
            continue
        trace = out / system
        solm("capture", "--system", system, "--n", str(args.n), "--out", str(trace), "--force")
        summary = solm("inspect", str(trace), "--validate")
        captured.append((system, trace, summary))

    simulated = []
    if (ROOT / "solm" / "commands" / "simulate.py").exists():
        for system, trace, _ in captured:
            sim_out = out / f"{system}-on-h100-llama-3-8b"
            m = solm(
                "simulate",
                str(trace),
                "--hardware",
                "h100-sxm",
                "--model",
                "llama-3-8b",
                "--rate",
                "8",
                "--num-requests",
                "200",
                "--out",
                str(sim_out),
                "--force",
            )
            simulated.append((system, sim_out, m))

    print_summary(captured, simulated, time.perf_counter() - t0)
    print("\nnext:")
    first = next((c for c in captured if c[0] == "sequential"), captured[0] if captured else None)
    if first:
        print(f"  solm inspect {first[1].relative_to(ROOT)}      # the summary again, any time")
    print("  Parquet tables are plain files: pandas.read_parquet('out/demo/sequential/steps.parquet')")
    extra = ROOT / "solm" / "commands"
    if (extra / "simulate.py").exists():
        print(f"  solm simulate {args.out}/sequential --hardware h200 --model llama-3-70b --rate 2   # another what-if")
    if (extra / "dashboard.py").exists():
        print(
            f"  solm dashboard {args.out}      # then open http://127.0.0.1:8501 in a browser: measured and simulated side by side"
        )


if __name__ == "__main__":
    main()
