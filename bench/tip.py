"""TIP benchmark: accuracy against live KV for learned eviction (thought registers) versus a dense
cache and the StreamingLLM, H2O and rolling-window baselines at TIP's own budgets, on one model
(checkpoints/tip-tiny) and one engine; logical versus physical eviction at two page sizes; and
memory-limited serving (one fixed KV pool in bytes: concurrent requests and tokens/s, dense vs TIP).

Why: the thesis (arXiv 2609.14850, ch. 4) claims a much smaller live KV at equal accuracy, and a
throughput gain that comes from fitting more requests into the same memory. This measures both.

Run:  .venv/bin/python bench/tip.py [--quick] [--n 64] [--model tip-tiny]
Prints a table; the last line is one JSON object {"bench": "tip", "rows": [...], "serving": [...]}.
Targets are measured, not asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from runtime.checkpoint import load_model  # noqa: E402
from runtime.engines import GenerationConfig, Request, drain  # noqa: E402
from runtime.engines.tip import TipEngine  # noqa: E402
from runtime.server import serve  # noqa: E402
from runtime.tasks import get_task  # noqa: E402
from runtime.tokenizer import Tokenizer  # noqa: E402

BASELINES = ("streaming", "h2o", "window")


def run_method(
    model, tok, task, examples, method: str, policy: str, budget: int | None, page_size: int, max_tokens: int
) -> dict:
    eng = TipEngine(
        model, tok, GenerationConfig(max_tokens=max_tokens, page_size=page_size), policy=policy, budget_tokens=budget
    )
    live, peaks, scores = [], [], []
    evicted = freed = out_tokens = 0
    t0 = time.perf_counter()
    for i, ex in enumerate(examples):
        steps, c = drain(eng.run(Request(i, ex.prompt)))
        for s in steps:
            live.append(s.live_kv_tokens)
            evicted += s.evicted_tokens
            freed += s.freed_kv_bytes
        peaks.append(c.peak_live_kv_tokens)
        scores.append(task.score(ex, c.text))
        out_tokens += len(c.output_ids)
    wall = time.perf_counter() - t0
    logical = evicted * model.kv_bytes_per_token
    return {
        "task": task.name,
        "method": method,
        "budget_tokens": budget,
        "page_size": page_size,
        "quality": sum(scores) / len(scores),
        "mean_live_kv_tokens": sum(live) / len(live),
        "peak_live_kv_tokens": max(peaks),
        "logical_evicted_bytes": logical,
        "physical_freed_bytes": freed,
        "physical_over_logical": (freed / logical) if logical else None,
        "tokens_per_s": out_tokens / wall,
        "requests": len(examples),
        "passes": len(live),
    }


def bench_task(model, tok, name: str, n: int, max_tokens: int) -> list[dict]:
    task = get_task(name)
    exs = task.examples("test", n, seed=0)
    rows = [
        run_method(model, tok, task, exs, "dense", "full", None, 16, max_tokens),
        run_method(model, tok, task, exs, "tip", "tip", None, 16, max_tokens),
        run_method(model, tok, task, exs, "tip", "tip", None, 1, max_tokens),
    ]
    tip = rows[1]
    budgets = sorted({math.ceil(tip["mean_live_kv_tokens"]), tip["peak_live_kv_tokens"]})
    for b in budgets:
        for policy in BASELINES:
            rows.append(run_method(model, tok, task, exs, policy, policy, b, 16, max_tokens))
    return rows


def bench_serving(model, tok, name: str, n: int, pool_tokens: int, max_tokens: int) -> list[dict]:
    task = get_task(name)
    exs = task.examples("test", n, seed=1)
    out = []
    for method, policy in (("dense", "full"), ("tip", "tip")):
        eng = TipEngine(model, tok, GenerationConfig(max_tokens=max_tokens, page_size=16), policy=policy)
        r = serve(eng, [e.prompt for e in exs], pool_bytes=pool_tokens * model.kv_bytes_per_token)
        quality = sum(task.score(e, c.text) for e, c in zip(exs, r.pop("completions"))) / len(exs)
        out.append({"task": name, "method": method, "pool_kv_tokens": pool_tokens, "quality": quality, **r})
    return out


def held_out_summary(rows: list[dict], tasks: list[str]) -> dict:
    """Dense and TIP (page 16) over `tasks` (one task, or the whole held-out set): live KV averaged
    over every pass of every request of every task, accuracy over every request."""
    out: dict = {}
    for m in ("dense", "tip"):
        rs = [r for r in rows if r["method"] == m and r["page_size"] == 16 and r["task"] in tasks]
        out[f"{m}_mean_live_kv_tokens"] = sum(r["mean_live_kv_tokens"] * r["passes"] for r in rs) / sum(
            r["passes"] for r in rs
        )
        out[f"{m}_quality"] = sum(r["quality"] * r["requests"] for r in rs) / sum(r["requests"] for r in rs)
    out["live_kv_reduction_percent"] = 100 * (1 - out["tip_mean_live_kv_tokens"] / out["dense_mean_live_kv_tokens"])
    tip = [r for r in rows if r["method"] == "tip" and r["page_size"] == 16 and r["task"] in tasks]
    logical = sum(r["logical_evicted_bytes"] for r in tip)
    out["tip_physical_over_logical"] = sum(r["physical_freed_bytes"] for r in tip) / logical if logical else None
    return out


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def parse_args() -> argparse.Namespace:
    """The bench's flags (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sample (under 3 minutes)")
    ap.add_argument("--n", type=int, default=0, help="held-out prompts per task (default 64, quick 12)")
    ap.add_argument("--model", default="tip-tiny")
    ap.add_argument("--tasks", default="var_tracking,nested_arith,tree_reduce")
    ap.add_argument("--pool-kv-tokens", type=int, default=768, help="serving pool size in tokens (48 pages of 16)")
    ap.add_argument("--serve-n", type=int, default=0, help="requests served (default 48, quick 24)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=256)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    n = args.n or (12 if args.quick else 64)
    serve_n = args.serve_n or (24 if args.quick else 48)
    tok = Tokenizer()
    model, info = load_model(args.model)
    t0 = time.perf_counter()
    rows = [r for name in args.tasks.split(",") for r in bench_task(model, tok, name, n, args.max_tokens)]
    serving = bench_serving(model, tok, args.tasks.split(",")[0], serve_n, args.pool_kv_tokens, args.max_tokens)

    print(
        f"TIP benchmark: model {args.model} ({model.num_parameters()} parameters), {n} held-out prompts per task, "
        f"{model.kv_bytes_per_token} KV bytes/token"
    )
    print_rows(rows)
    summary = print_held_out(rows, args.tasks.split(","))
    print(
        f"\nmemory-limited serving ({serving[0]['task']}, pool {args.pool_kv_tokens} KV tokens = "
        f"{serving[0]['pool_bytes']} bytes, {serve_n} requests)"
    )
    print_serving(serving)
    print(f"(bench wall {time.perf_counter() - t0:.0f} s)")
    print(
        json.dumps({"bench": "tip", "model": args.model, "n": n, "summary": summary, "rows": rows, "serving": serving})
    )
    return 0


def print_rows(rows: list[dict]) -> None:
    """One line per (task, method, budget): quality, live KV, physical over logical pages, tokens/s."""
    head = (
        f"{'task':<13}{'method':<10}{'budget':>7}{'page':>5}{'quality':>9}{'mean live':>10}{'peak live':>10}"
        f"{'phys/logical':>13}{'tok/s':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['task']:<13}{r['method']:<10}{fmt(r['budget_tokens'], 'd'):>7}{r['page_size']:>5}"
            f"{r['quality']:>9.3f}{r['mean_live_kv_tokens']:>10.1f}{r['peak_live_kv_tokens']:>10d}"
            f"{fmt(r['physical_over_logical'], '.3f'):>13}{r['tokens_per_s']:>8.0f}"
        )


def print_held_out(rows: list[dict], tasks: list[str]) -> dict:
    """TIP against dense per task and over the whole held-out set (printed); the whole set's summary."""
    for name in tasks:
        s = held_out_summary(rows, [name])
        print(
            f"{name}: TIP mean live KV {s['live_kv_reduction_percent']:.0f}% below dense; accuracy "
            f"{100 * (s['tip_quality'] - s['dense_quality']):+.1f} points"
        )
    summary = held_out_summary(rows, tasks)
    print(
        f"held-out set ({', '.join(tasks)}, every pass of every request): TIP mean live KV "
        f"{summary['tip_mean_live_kv_tokens']:.1f} vs dense {summary['dense_mean_live_kv_tokens']:.1f} tokens, "
        f"{summary['live_kv_reduction_percent']:.0f}% below; accuracy {summary['tip_quality']:.3f} vs "
        f"{summary['dense_quality']:.3f} ({100 * (summary['tip_quality'] - summary['dense_quality']):+.1f} points); "
        f"TIP frees {fmt(summary['tip_physical_over_logical'], '.2f')} of the bytes it evicts logically (page 16)"
    )
    return summary


def print_serving(serving: list[dict]) -> None:
    """One line per method of the memory-limited serving run."""
    print(f"{'method':<8}{'mean conc':>10}{'max conc':>9}{'preempt':>8}{'tok/s':>8}{'wall s':>8}{'quality':>9}")
    for s in serving:
        print(
            f"{s['method']:<8}{s['mean_concurrency']:>10.2f}{s['max_concurrency']:>9d}{s['preemptions']:>8d}"
            f"{s['tokens_per_s']:>8.0f}{s['wall_s']:>8.2f}{s['quality']:>9.3f}"
        )
    by = {s["method"]: s for s in serving}
    print(f"tip / dense tokens/s in the same pool: {by['tip']['tokens_per_s'] / by['dense']['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
