"""Runtime micro-benchmark: what one forward pass costs as query rows grow (the reason parallel
threads are nearly free on this hardware), how much of that is the model's matmuls (its
`nn.Linear` layers alone, at the same row counts), what the paged KV store's bookkeeping costs, and
what a server's batched pass costs (runtime/server.py): 8 requests' decode rows in one pass over one
shared pool, with the attention as a mask over the whole pool or as per-request gathers of each
request's own slots, against one request's pass alone.

Ratios are measured side by side in one run (interleaved repetitions), never against a stored
wall time. Last line: one JSON object {"bench": "runtime", ...}.

    .venv/bin/python bench/runtime.py [--quick] [--preset tiny-4l]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from runtime.engines.base import visibility_rows  # noqa: E402
from runtime.model import ModelConfig, TinyLM  # noqa: E402
from runtime.rows_sweep import decode_rows  # noqa: E402
from runtime.server import forward_batch  # noqa: E402


def batched_passes(model: TinyLM, context: int, requests: int, reps: int) -> dict:
    """Decode passes, interleaved: one request alone (its own store), and `requests` requests in one
    shared pool, one row each, attention by mask over the pool and by per-request gathers.
    Seconds per pass: (fastest, median) of `reps` for each."""

    def setup(n: int):
        kv = model.new_kv_store(page_size=16)
        ctx = []
        for r in range(n):
            slots = kv.allocate(context, owner=r)
            model(
                torch.randint(0, 256, (context,)),
                torch.arange(context),
                torch.tensor(slots),
                visibility_rows([slots[: i + 1] for i in range(context)], kv.num_slots, "cpu"),
                kv,
            )
            ctx.append(slots)
        return kv, ctx

    alone, shared = setup(1), setup(requests)
    cases = {"alone": (alone, "mask"), "batch_mask": (shared, "mask"), "batch_gather": (shared, "gather")}
    times: dict[str, list[float]] = {k: [] for k in cases}
    scored: dict[str, int] = {}
    for _ in range(reps):
        for name, ((kv, ctx), mode) in cases.items():
            inp = decode_rows(kv, ctx)  # one decode row per request (token ids do not change a pass's time)
            t0 = time.perf_counter()
            _, _, keys = forward_batch(model, kv, inp, mode)
            times[name].append(time.perf_counter() - t0)
            scored[name] = sum(keys)
            kv.free([s for i in inp for s in i.slots])
    return {k: (min(v), statistics.median(v), scored[k]) for k, v in times.items()}


def linear_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


@torch.no_grad()
def linear_layers_us(model: torch.nn.Module, rows_list: list[int], reps: int) -> dict[int, float]:
    """Median time of every `nn.Linear` of the model applied once to `r` rows, r interleaved."""
    layers = linear_layers(model)
    inputs = {r: [torch.randn(r, m.in_features) for m in layers] for r in rows_list}
    times: dict[int, list[float]] = {r: [] for r in rows_list}
    for _ in range(reps):
        for r in rows_list:
            t0 = time.perf_counter()
            for m, x in zip(layers, inputs[r]):
                m(x)
            times[r].append(time.perf_counter() - t0)
    return {r: statistics.median(t) * 1e6 for r, t in times.items()}


def parse_args() -> argparse.Namespace:
    """The bench's flags (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--preset", default="tiny-4l")
    ap.add_argument("--context", type=int, default=128, help="tokens already in the KV store")
    ap.add_argument("--requests", type=int, default=8, help="requests in the batched pass")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: tiny models thrash with more on a shared CPU)"
    )
    return ap.parse_args()


def prefilled(preset: str, context: int) -> tuple[TinyLM, object, list[int]]:
    """(model, KV store, slots): a `preset` model whose store holds one prompt of `context` tokens."""
    model = TinyLM(ModelConfig.from_name(preset)).eval()
    kv = model.new_kv_store(page_size=16)
    ctx = kv.allocate(context)
    model(
        torch.randint(0, 256, (context,)),
        torch.arange(context),
        torch.tensor(ctx),
        visibility_rows([ctx[: i + 1] for i in range(context)], kv.num_slots, "cpu"),
        kv,
    )
    return model, kv, ctx


def forward_times(model: TinyLM, kv, ctx: list[int], rows_list: list[int], reps: int) -> dict[int, list[float]]:
    """Seconds of `reps` forward passes of r query rows over the prompt in `ctx`, for each r of
    `rows_list`, row counts interleaved so machine noise hits all of them alike."""
    context = len(ctx)
    times: dict[int, list[float]] = {r: [] for r in rows_list}
    for _ in range(reps):
        for r in rows_list:
            new = kv.allocate(r)
            vis = visibility_rows([ctx + [s] for s in new], kv.num_slots, "cpu")
            t0 = time.perf_counter()
            model(torch.randint(0, 256, (r,)), torch.arange(context, context + r), torch.tensor(new), vis, kv)
            times[r].append(time.perf_counter() - t0)
            kv.free(new)
    return times


def print_forward(times: dict[int, list[float]]) -> tuple[float, dict[int, float]]:
    """Print each row count's median pass against one row's; (one row's median s, ratio by rows)."""
    base = statistics.median(times[1])
    print(f"{'query rows':>10} {'ms':>8} {'x one row':>10} {'rows/s gain':>12}")
    ratios = {}
    for r in times:
        m = statistics.median(times[r])
        ratios[r] = m / base
        print(f"{r:>10} {m * 1000:>8.3f} {m / base:>10.2f} {r * base / m:>12.2f}")
    return base, ratios


def page_alloc_free_us(kv, n: int) -> float:
    """Microseconds to allocate and free one 16-slot page, over `n` rounds."""
    t0 = time.perf_counter()
    for _ in range(n):
        kv.free(kv.allocate(16))
    return (time.perf_counter() - t0) / n * 1e6


def print_batched(b: dict, requests: int, context: int, reps: int) -> tuple[str, float, float]:
    """Print the batched passes against the one-request pass; (faster batched case, its fastest and
    median ratio to the one-request pass)."""
    print(
        f"decode pass of {requests} requests x {context} cached tokens in one pool vs one request alone "
        f"(fastest of {reps} interleaved; median beside it):"
    )
    print(f"{'pass':>14} {'fastest ms':>11} {'median ms':>10} {'x alone':>8} {'keys scored':>12}")
    for name, (fast, med, keys) in b.items():
        print(f"{name:>14} {fast * 1000:>11.3f} {med * 1000:>10.3f} {fast / b['alone'][0]:>8.2f} {keys:>12}")
    best = min(("batch_mask", "batch_gather"), key=lambda k: b[k][0])
    ratio, ratio_med = b[best][0] / b["alone"][0], b[best][1] / b["alone"][1]
    print(
        f"faster attention for a batched pass: {best.split('_')[1]}; a batched pass of {requests} requests costs "
        f"{ratio:.2f}x a one-request pass (median {ratio_med:.2f}x): "
        f"{'less' if ratio < 2 else 'NOT less'} than 2x"
    )
    return best, ratio, ratio_med


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    reps = 30 if args.quick else 200
    rows_list = [1, 2, 3, 4, 8, 16]
    model, kv, ctx = prefilled(args.preset, args.context)
    times = forward_times(model, kv, ctx, rows_list, reps)
    print(
        f"forward pass over {args.context} cached tokens, {args.preset} ({model.num_parameters()} params), "
        f"{torch.get_num_threads()} threads, median of {reps}:"
    )
    base, ratios = print_forward(times)
    linear_us = linear_layers_us(model, rows_list, reps)
    print(
        f"the model's {len(linear_layers(model))} matmuls (nn.Linear) alone, median of {reps}: "
        + ", ".join(f"{r} row{'s' if r > 1 else ''} {linear_us[r]:.0f} us" for r in rows_list)
    )
    # KV store bookkeeping: allocate + free a page worth of slots, versus one forward pass
    alloc_free_us = page_alloc_free_us(kv, 2000 if args.quick else 20000)
    print(
        f"allocate+free of one 16-slot page: {alloc_free_us:.1f} us ({alloc_free_us / (base * 1e6) * 100:.1f}% of a 1-row forward)"
    )
    # a server's batched pass: 8 requests' decode rows in one pass, mask over the pool vs gathers
    b = batched_passes(model, args.context, args.requests, reps)
    best, ratio, ratio_med = print_batched(b, args.requests, args.context, reps)
    print(
        json.dumps(
            {
                "bench": "runtime",
                "preset": args.preset,
                "context_tokens": args.context,
                "forward_ms_1_row": base * 1000,
                "forward_ratio_by_rows": {str(r): round(v, 3) for r, v in ratios.items()},
                "forward_ms_by_rows": {str(r): round(statistics.median(times[r]) * 1000, 4) for r in rows_list},
                "linear_layers_us_by_rows": {str(r): round(v, 1) for r, v in linear_us.items()},
                "page_alloc_free_us": round(alloc_free_us, 2),
                "batched_requests": args.requests,
                "batched_pass_ms": {
                    k: {"fastest": round(v[0] * 1000, 4), "median": round(v[1] * 1000, 4), "keys_scored": v[2]}
                    for k, v in b.items()
                },
                "faster_batched_attention": best.split("_")[1],
                "batched_over_alone_fastest": round(ratio, 3),
                "batched_over_alone_median": round(ratio_med, 3),
                "batched_under_2x": bool(ratio < 2),
            }
        )
    )


if __name__ == "__main__":
    main()
