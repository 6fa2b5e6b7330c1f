"""Planned Diffusion benchmark: quality versus wall-clock latency against AR and plain masked diffusion.

What: the AR baseline (`sequential` on the same answers without tags), Planned Diffusion over a
grid of steps_ratio x confidence_threshold x block sparsity (at the length scale the model was
trained with; `--all-scales` adds 8 and 12) and cached commits, and plain masked
diffusion (fixed steps, entropy order; and with a confidence threshold), all on one CPU thread.
Settings are chosen on the **dev** prompts and reported on the **test** prompts (two disjoint
hash splits of the held-out bucket, `runtime.tasks.base.split_of`): the whole grid runs on dev;
the fastest Planned Diffusion setting within 3 quality points of AR there, the best plain
diffusion setting there, and the engine's shipped defaults run again on test, and the headline
is their test figure (the dev figure of the chosen setting, the best of the grid on the prompts
it was chosen on, is printed beside it as the optimistic one). Every method is warmed up on a
training prompt of each task first; on each prompt every method runs once, in an order rotated
per prompt, so load on the machine hits all methods alike. Why: the paper's claim is 1.27-1.81x
over AR at a small quality cost, with plain diffusion far slower at equal quality; this measures
where our tiny models land. Prints the dev table (with its Pareto front: quality up, speedup up),
the test table and one JSON line {"bench": "planned_diffusion", "dev_rows": [...], "test_rows": [...], ...}.

`--write-operating-point` records the dev choice in `runtime/engines/operating_points.json`,
the shipped defaults of the `planned_diffusion` engine (tests check they agree).

    .venv/bin/python bench/planned_diffusion.py --quick      # small grid, 2 prompts per task and split
    .venv/bin/python bench/planned_diffusion.py              # the full grid, 12 per task and split
    .venv/bin/python bench/planned_diffusion.py --n 6        # what docs/planned_diffusion.md quotes
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.recorder import Recorder  # noqa: E402
from profiler.stats import geomean, non_dominated  # noqa: E402
from runtime.checkpoint import CHECKPOINTS_DIR, load_model  # noqa: E402
from runtime.engines import GenerationConfig, Request, get_engine  # noqa: E402
from runtime.engines.operating_points import (  # noqa: E402
    OPERATING_POINTS_FILE,
    engine_defaults,
    write_operating_point,
)
from runtime.lang.planned_diffusion import UNIT  # noqa: E402
from runtime.tasks import get_task  # noqa: E402
from runtime.tokenizer import Tokenizer  # noqa: E402

PARALLEL = ("word_facts", "map_numbers", "list_stats")
AR_PHASES = ("prefill", "decode", "plan", "sync")
PD_KNOBS = ("steps_ratio", "confidence_threshold", "length_scale", "block_sparse", "cache_committed")
QUALITY_MARGIN = 0.03  # the operating point: the fastest setting within 3 quality points of AR


def grid(quick: bool, scales: tuple[float, ...] = (UNIT,)) -> list[dict]:
    """AR, then the Planned Diffusion and plain diffusion settings. `scales`: length scales tried
    (default the one the model was trained with, `UNIT`; `--all-scales` adds 8 and 12)."""
    pd = []
    if quick:
        for r, th in ((1.0, None), (0.5, None), (0.25, None), (1.0, 0.9), (0.5, 0.9)):
            pd.append(dict(steps_ratio=r, confidence_threshold=th, length_scale=10.0, block_sparse=True))
        pd += [
            dict(steps_ratio=0.5, confidence_threshold=0.9, length_scale=10.0, block_sparse=True, cache_committed=True),
            dict(steps_ratio=0.5, confidence_threshold=None, length_scale=8.0, block_sparse=True),
            dict(steps_ratio=0.5, confidence_threshold=None, length_scale=10.0, block_sparse=False),
        ]
        mdm = [dict(steps=36, confidence_threshold=None), dict(steps=72, confidence_threshold=0.9)]
    else:
        for r, th, ls, bs in itertools.product((1.0, 0.5, 0.25), (None, 0.7, 0.9), scales, (True, False)):
            pd.append(dict(steps_ratio=r, confidence_threshold=th, length_scale=ls, block_sparse=bs))
        pd += [
            dict(steps_ratio=r, confidence_threshold=th, length_scale=10.0, block_sparse=True, cache_committed=True)
            for r in (1.0, 0.5)
            for th in (None, 0.9)
        ]
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
    raise SystemExit(
        "no AR baseline checkpoint (checkpoints/pasta-sequential or checkpoints/pd-ar); "
        "train one: solm train --system planned_diffusion --stage ar --threads 1 --out checkpoints/pd-ar"
    )


def pareto(rows: list[dict]) -> None:
    """Mark the rows no other row beats on quality and geomean speedup together."""
    marks = non_dominated(np.array([[r["quality"], r["speedup_geomean"]] for r in rows], dtype=float).reshape(-1, 2))
    for r, m in zip(rows, marks):
        r["pareto"] = bool(m)


def warm_up(engines: list, tok: Tokenizer) -> None:
    """One untimed run of every engine on a training prompt of each task (first-seen pass shapes)."""
    for eng in engines:
        for t in PARALLEL:
            for _ in eng.run(Request(-1, get_task(t).examples("train", 1, seed=0)[0].prompt)):
                pass


def measure(setups: list[dict], engines: list, prompts: list, label: str) -> list[dict]:
    """Every setup on every prompt, the order rotated per prompt; per setup its raw results."""
    res = [{"q": [], "lat": [], "passes": [], "ar_s": 0.0, "dn_s": 0.0, "at_len": []} for _ in setups]
    rec, t_start = Recorder(), time.perf_counter()
    for pi, (task, ex) in enumerate(prompts):
        first = pi % len(setups)
        for j in [*range(first, len(setups)), *range(first)]:
            run, r = rec.run(engines[j].run(Request(pi, ex.prompt))), res[j]
            c = run.result
            r["q"].append(get_task(task).score(ex, c.text))
            r["lat"].append(run.end_s - run.start_s)
            r["passes"].append(len(run.step_rows))
            r["ar_s"] += sum(x["duration_s"] for x in run.step_rows if x["phase"] in AR_PHASES)
            r["dn_s"] += sum(x["duration_s"] for x in run.step_rows if x["phase"] == "denoise")
            pd_ev = [e for e in c.events if e.get("event") == "pd"]
            if pd_ev and pd_ev[0]["spans_finish_at_length"] is not None:
                r["at_len"].append(pd_ev[0]["spans_finish_at_length"])
        print(
            f"  {label} prompt {pi + 1}/{len(prompts)} ({task}) {time.perf_counter() - t_start:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return res


def summarize(setups: list[dict], res: list[dict]) -> list[dict]:
    """One row per setup; speedups against the first setup (AR) on the same prompts."""
    ar_lat, rows = res[0]["lat"], []
    for s, r in zip(setups, res):
        k = s["knobs"]
        ratio = k.get("steps_ratio", k["steps"] / k["length"] if "steps" in k else None)
        rows.append(
            {
                "method": s["method"],
                "label": s.get("label", ""),
                "steps_ratio": ratio,
                "confidence_threshold": k.get("confidence_threshold"),
                "length_scale": k.get("length_scale"),
                "block_sparse": k.get("block_sparse"),
                "cache_committed": k.get("cache_committed", False) if s["method"] == "planned_diffusion" else None,
                "steps": k.get("steps"),
                "knobs": k,
                "quality": round(sum(r["q"]) / len(r["q"]), 4),
                "speedup_geomean": round(geomean([a / b for a, b in zip(ar_lat, r["lat"])]), 3),
                "latency_s_mean": round(sum(r["lat"]) / len(r["lat"]), 4),
                "passes_mean": round(sum(r["passes"]) / len(r["passes"]), 1),
                "denoise_time_frac": round(r["dn_s"] / max(1e-9, r["ar_s"] + r["dn_s"]), 3),
                "spans_finish_at_length": (all(r["at_len"]) if r["at_len"] else None)
                if s["method"] == "planned_diffusion"
                else None,
            }
        )
    pareto(rows)
    return rows


def print_table(title: str, rows: list[dict]) -> None:
    print(title)
    print(
        f"{'method':18} {'ratio':>5} {'thr':>4} {'scale':>5} {'sparse':>6} {'cache':>5} {'quality':>7} {'speedup':>7} "
        f"{'lat_ms':>7} {'passes':>6} {'dn%':>4} {'at_len':>6} pareto"
    )
    for r in rows:

        def f(v, w, p=""):
            return f"{'-':>{w}}" if v is None else f"{str(v)[0]:>{w}}" if isinstance(v, bool) else f"{v:>{w}{p}}"  # noqa: E731

        print(
            f"{r['method']:18} {f(r['steps_ratio'], 5, '.2f')} {f(r['confidence_threshold'], 4, '.1f')} "
            f"{f(r['length_scale'], 5, '.0f')} {f(r['block_sparse'], 6)} {f(r['cache_committed'], 5)} {r['quality']:7.3f} {r['speedup_geomean']:7.2f} "
            f"{r['latency_s_mean'] * 1000:7.1f} {r['passes_mean']:6.1f} {100 * r['denoise_time_frac']:4.0f} "
            f"{f(r['spans_finish_at_length'], 6)} {'*' if r['pareto'] else ''} {r['label']}"
        )


def choose(dev_rows: list[dict]) -> tuple[dict | None, dict | None]:
    """On dev: the fastest Planned Diffusion setting within QUALITY_MARGIN of AR, and plain
    diffusion's best-quality setting (ties: the faster)."""
    ar_q = dev_rows[0]["quality"]
    ok = [r for r in dev_rows if r["method"] == "planned_diffusion" and r["quality"] >= ar_q - QUALITY_MARGIN]
    best = max(ok, key=lambda r: r["speedup_geomean"], default=None)
    mdm = max(
        (r for r in dev_rows if r["method"] == "masked_diffusion"),
        key=lambda r: (r["quality"], r["speedup_geomean"]),
        default=None,
    )
    return best, mdm


def test_setups(best: dict | None, mdm: dict | None) -> list[dict]:
    """AR, the dev choices and the engine's shipped defaults (once, when they equal the choice)."""
    shipped = {k: v for k, v in engine_defaults("planned_diffusion").items() if k in PD_KNOBS}
    setups = [{"method": "ar", "system": "sequential", "knobs": {}}]
    if best:
        chosen = {k: best["knobs"][k] for k in PD_KNOBS if k in best["knobs"]}
        same = all(chosen.get(k, shipped[k]) == shipped[k] for k in shipped)
        setups.append(
            {
                "method": "planned_diffusion",
                "system": "planned_diffusion",
                "knobs": best["knobs"],
                "label": "chosen on dev" + (" = shipped defaults" if same else ""),
            }
        )
    if not best or not same:
        setups.append(
            {
                "method": "planned_diffusion",
                "system": "planned_diffusion",
                "knobs": shipped,
                "label": "shipped defaults",
            }
        )
    if mdm:
        setups.append(
            {"method": "masked_diffusion", "system": "masked_diffusion", "knobs": mdm["knobs"], "label": "best on dev"}
        )
    return setups


def run_split(
    setups: list[dict], models: dict, tok: Tokenizer, cfg: GenerationConfig, prompts: list, label: str
) -> list[dict]:
    engines = [
        get_engine(s["system"])(models["ar" if s["method"] == "ar" else "pd"], tok, cfg, **s["knobs"]) for s in setups
    ]
    warm_up(engines, tok)
    return summarize(setups, measure(setups, engines, prompts, label))


def parse_args() -> argparse.Namespace:
    """The bench's flags (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small grid, 2 prompts per task and split")
    ap.add_argument(
        "--n", type=int, default=None, help="prompts per task in each of dev and test (default 2 quick, 12 full)"
    )
    ap.add_argument("--pd-model", default="pd-tiny")
    ap.add_argument("--ar-model", default="")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument(
        "--all-scales",
        action="store_true",
        help="also try length_scale 8 and 12 (the model was trained with 10) in the full grid",
    )
    ap.add_argument(
        "--write-operating-point",
        action="store_true",
        help=f"record the dev choice as the engine's shipped defaults ({OPERATING_POINTS_FILE.name})",
    )
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    n = args.n or (2 if args.quick else 12)
    tok, ar_name = Tokenizer(), args.ar_model or ar_model_name()
    models = {"pd": load_model(args.pd_model)[0], "ar": load_model(ar_name)[0]}
    cfg = GenerationConfig(max_tokens=args.max_tokens)
    split = {s: [(t, ex) for t in PARALLEL for ex in get_task(t).examples(s, n, seed=0)] for s in ("dev", "test")}
    t_start = time.perf_counter()
    dev_rows = run_split(
        grid(args.quick, (8.0, UNIT, 12.0) if args.all_scales else (UNIT,)), models, tok, cfg, split["dev"], "dev"
    )
    print_table(f"dev: {len(split['dev'])} prompts ({n} per task), every setting (choose here)", dev_rows)
    best, mdm = choose(dev_rows)
    test_rows = run_split(test_setups(best, mdm), models, tok, cfg, split["test"], "test")
    print_table(f"test: {len(split['test'])} prompts ({n} per task), the dev choices (report these)", test_rows)
    report(dev_rows, test_rows, best)
    if args.write_operating_point and best:
        record_choice(args.pd_model, best, len(split["dev"]), dev_rows[0]["quality"])
    print(
        json.dumps(
            {
                "bench": "planned_diffusion",
                "dev_prompts": len(split["dev"]),
                "test_prompts": len(split["test"]),
                "ar_model": ar_name,
                "pd_model": args.pd_model,
                "wall_s": round(time.perf_counter() - t_start, 1),
                "chosen_on_dev": best and best["knobs"],
                "test_rows": test_rows,
                "dev_rows": dev_rows,
            }
        )
    )
    return 0


def record_choice(pd_model: str, best: dict, dev_prompts: int, ar_dev_quality: float) -> None:
    """Record the dev choice `best` as the engine's shipped defaults (--write-operating-point), with
    the rule, the command and the dev figures it was chosen on."""
    write_operating_point(
        "planned_diffusion",
        {
            "model": pd_model,
            "knobs": {k: best["knobs"][k] for k in PD_KNOBS if k in best["knobs"]},
            "rule": f"fastest planned_diffusion setting within {QUALITY_MARGIN:.2f} quality of AR on the dev split",
            "command": " ".join(["python", "bench/planned_diffusion.py", *sys.argv[1:]]),
            "dev_prompts": dev_prompts,
            "dev_quality": best["quality"],
            "dev_speedup_geomean": best["speedup_geomean"],
            "ar_dev_quality": ar_dev_quality,
            "chosen_at": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    )


def report(dev_rows: list[dict], test_rows: list[dict], best: dict | None) -> None:
    """The headline: the dev choice's test figure, its dev figure beside it."""
    ar_q = test_rows[0]["quality"]
    pd = next((r for r in test_rows if r["method"] == "planned_diffusion" and r["label"].startswith("chosen")), None)
    if pd and best:
        print(
            f"test: AR quality {ar_q:.3f}; Planned Diffusion (chosen on dev) {pd['speedup_geomean']:.2f}x at quality "
            f"{pd['quality']:.3f} (on dev, where it was the best of {sum(r['method'] == 'planned_diffusion' for r in dev_rows)} "
            f"settings: {best['speedup_geomean']:.2f}x at {best['quality']:.3f}, AR {dev_rows[0]['quality']:.3f})"
        )
    else:
        print(f"test: AR quality {ar_q:.3f}; no Planned Diffusion setting within {QUALITY_MARGIN:.2f} of AR on dev")
    shipped = next((r for r in test_rows if r["label"] == "shipped defaults"), None)
    if shipped:
        print(f"test: shipped defaults {shipped['speedup_geomean']:.2f}x at quality {shipped['quality']:.3f}")
    mdm = next((r for r in test_rows if r["method"] == "masked_diffusion"), None)
    if mdm:
        print(
            f"test: plain diffusion (its best quality on dev: {mdm['steps']} steps"
            f"{' + threshold' if mdm['confidence_threshold'] else ''}) quality {mdm['quality']:.3f} at "
            f"{1 / max(1e-9, mdm['speedup_geomean']):.1f}x AR's latency"
        )


if __name__ == "__main__":
    raise SystemExit(main())
