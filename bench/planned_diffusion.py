"""Planned Diffusion benchmark: quality versus wall-clock latency against AR and plain masked diffusion.

What: on held-out prompts of the parallel task families, run the AR baseline (`sequential` on the
same answers without tags), Planned Diffusion over a grid of steps_ratio x confidence_threshold x
length_scale x block sparsity, and plain masked diffusion (fixed steps, entropy order; and with a
confidence threshold), all on one CPU thread and side by side (each prompt runs every method
before the next prompt, so load on the machine hits all methods alike). Why: the paper's claim is
1.27-1.81x over AR at a small quality cost, with plain diffusion far slower at equal quality; this
measures where our tiny models land. Prints a table with the Pareto front (quality up, speedup
up) and ends with one JSON line {"bench": "planned_diffusion", "rows": [...]}.

    .venv/bin/python bench/planned_diffusion.py --quick      # small grid, under 3 minutes
    .venv/bin/python bench/planned_diffusion.py              # the full grid
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.recorder import Recorder  # noqa: E402
from profiler.stats import geomean, non_dominated  # noqa: E402
from runtime.checkpoint import CHECKPOINTS_DIR, load_model  # noqa: E402
from runtime.engines import GenerationConfig, Request, get_engine  # noqa: E402
from runtime.tasks import get_task  # noqa: E402
from runtime.tokenizer import Tokenizer  # noqa: E402

PARALLEL = ("word_facts", "map_numbers", "list_stats")
AR_PHASES = ("prefill", "decode", "plan", "sync")


def grid(quick: bool) -> list[dict]:
    pd = []
    if quick:
        for r, th in ((1.0, None), (0.5, None), (0.25, None), (1.0, 0.9), (0.5, 0.9)):
            pd.append(dict(steps_ratio=r, confidence_threshold=th, length_scale=10.0, block_sparse=True))
        pd += [dict(steps_ratio=0.5, confidence_threshold=0.9, length_scale=10.0, block_sparse=True, cache_committed=True),
               dict(steps_ratio=0.5, confidence_threshold=None, length_scale=8.0, block_sparse=True),
               dict(steps_ratio=0.5, confidence_threshold=None, length_scale=10.0, block_sparse=False)]
        mdm = [dict(steps=36, confidence_threshold=None), dict(steps=72, confidence_threshold=0.9)]
    else:
        for r, th, ls, bs in itertools.product((1.0, 0.5, 0.25), (None, 0.7, 0.9), (8.0, 10.0, 12.0), (True, False)):
            pd.append(dict(steps_ratio=r, confidence_threshold=th, length_scale=ls, block_sparse=bs))
        pd += [dict(steps_ratio=r, confidence_threshold=th, length_scale=10.0, block_sparse=True, cache_committed=True)
               for r in (1.0, 0.5) for th in (None, 0.9)]
        mdm = [dict(steps=s, confidence_threshold=th) for s in (144, 72, 36) for th in (None, 0.9)]
    rows = [{"method": "ar", "system": "sequential", "knobs": {}}]
    rows += [{"method": "planned_diffusion", "system": "planned_diffusion", "knobs": k} for k in pd]
    rows += [{"method": "masked_diffusion", "system": "masked_diffusion", "knobs": {"length": 144, **k}} for k in mdm]
    return rows


def ar_model_name() -> str:
    """The AR baseline on the same answers without tags: ours (--stage ar), else PASTA's."""
    for name in ("pd-ar", "pasta-sequential"):
        if (CHECKPOINTS_DIR / name).is_dir():
            return name
    raise SystemExit("no AR baseline checkpoint (checkpoints/pasta-sequential or checkpoints/pd-ar); "
                     "train one: solm train --system planned_diffusion --stage ar --threads 1 --out checkpoints/pd-ar")


def pareto(rows: list[dict]) -> None:
    """Mark the rows no other row beats on quality and geomean speedup together."""
    marks = non_dominated(np.array([[r["quality"], r["speedup_geomean"]] for r in rows], dtype=float).reshape(-1, 2))
    for r, m in zip(rows, marks):
        r["pareto"] = bool(m)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small grid, 2 prompts per task (under 3 minutes)")
    ap.add_argument("--n", type=int, default=None, help="prompts per task (default 2 quick, 12 full)")
    ap.add_argument("--pd-model", default="pd-tiny")
    ap.add_argument("--ar-model", default="")
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = args.n or (2 if args.quick else 12)
    tok = Tokenizer()
    pd_model, _ = load_model(args.pd_model)
    ar_model, _ = load_model(args.ar_model or ar_model_name())
    cfg = GenerationConfig(max_tokens=args.max_tokens)
    setups = grid(args.quick)
    engines = [get_engine(s["system"])(ar_model if s["method"] == "ar" else pd_model, tok, cfg, **s["knobs"]) for s in setups]
    prompts = [(t, ex) for t in PARALLEL for ex in get_task(t).examples("test", n, seed=0)]
    res = [{"q": [], "lat": [], "passes": [], "ar_s": 0.0, "dn_s": 0.0, "at_len": []} for _ in setups]
    rec = Recorder()
    t_start = time.perf_counter()
    for pi, (task, ex) in enumerate(prompts):
        for s, eng, r in zip(setups, engines, res):
            run = rec.run(eng.run(Request(pi, ex.prompt)))
            c = run.result
            r["q"].append(get_task(task).score(ex, c.text))
            r["lat"].append(run.end_s - run.start_s)
            r["passes"].append(len(run.step_rows))
            r["ar_s"] += sum(x["duration_s"] for x in run.step_rows if x["phase"] in AR_PHASES)
            r["dn_s"] += sum(x["duration_s"] for x in run.step_rows if x["phase"] == "denoise")
            pd_ev = [e for e in c.events if e.get("event") == "pd"]
            if pd_ev and pd_ev[0]["spans_finish_at_length"] is not None:
                r["at_len"].append(pd_ev[0]["spans_finish_at_length"])
        print(f"  prompt {pi + 1}/{len(prompts)} ({task}) {time.perf_counter() - t_start:.0f} s", file=sys.stderr, flush=True)
    ar_lat = res[0]["lat"]
    rows = []
    for s, r in zip(setups, res):
        k = s["knobs"]
        ratio = k.get("steps_ratio", k["steps"] / k["length"] if "steps" in k else None)
        rows.append({
            "method": s["method"], "steps_ratio": ratio, "confidence_threshold": k.get("confidence_threshold"),
            "length_scale": k.get("length_scale"), "block_sparse": k.get("block_sparse"),
            "cache_committed": k.get("cache_committed", False) if s["method"] == "planned_diffusion" else None,
            "steps": k.get("steps"), "quality": round(sum(r["q"]) / len(r["q"]), 4),
            "speedup_geomean": round(geomean([a / b for a, b in zip(ar_lat, r["lat"])]), 3),
            "latency_s_mean": round(sum(r["lat"]) / len(r["lat"]), 4),
            "passes_mean": round(sum(r["passes"]) / len(r["passes"]), 1),
            "denoise_time_frac": round(r["dn_s"] / max(1e-9, r["ar_s"] + r["dn_s"]), 3),
            "spans_finish_at_length": (all(r["at_len"]) if r["at_len"] else None) if s["method"] == "planned_diffusion" else None,
        })
    pareto(rows)
    print(f"{'method':18} {'ratio':>5} {'thr':>4} {'scale':>5} {'sparse':>6} {'cache':>5} {'quality':>7} {'speedup':>7} "
          f"{'lat_ms':>7} {'passes':>6} {'dn%':>4} {'at_len':>6} pareto")
    for r in rows:
        f = lambda v, w, p="": f"{'-':>{w}}" if v is None else f"{str(v)[0]:>{w}}" if isinstance(v, bool) else f"{v:>{w}{p}}"  # noqa: E731
        print(f"{r['method']:18} {f(r['steps_ratio'], 5, '.2f')} {f(r['confidence_threshold'], 4, '.1f')} "
              f"{f(r['length_scale'], 5, '.0f')} {f(r['block_sparse'], 6)} {f(r['cache_committed'], 5)} {r['quality']:7.3f} {r['speedup_geomean']:7.2f} "
              f"{r['latency_s_mean'] * 1000:7.1f} {r['passes_mean']:6.1f} {100 * r['denoise_time_frac']:4.0f} "
              f"{f(r['spans_finish_at_length'], 6)} {'*' if r['pareto'] else ''}")
    ar_q = rows[0]["quality"]
    ok = [r for r in rows if r["method"] == "planned_diffusion" and r["quality"] >= ar_q - 0.03]
    best = max(ok, key=lambda r: r["speedup_geomean"], default=None)
    print(f"AR quality {ar_q:.3f}; best Planned Diffusion within 3 points: "
          + (f"{best['speedup_geomean']:.2f}x at quality {best['quality']:.3f}" if best else "none"))
    mdm = max((r for r in rows if r["method"] == "masked_diffusion"), key=lambda r: (r["quality"], r["speedup_geomean"]), default=None)
    if mdm:
        print(f"plain diffusion at its best quality {mdm['quality']:.3f}: {mdm['steps']} steps"
              f"{' + threshold' if mdm['confidence_threshold'] else ''}, {1 / max(1e-9, mdm['speedup_geomean']):.1f}x AR's latency")
    print(json.dumps({"bench": "planned_diffusion", "prompts": len(prompts), "ar_model": args.ar_model or ar_model_name(),
                      "pd_model": args.pd_model, "wall_s": round(time.perf_counter() - t_start, 1), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
