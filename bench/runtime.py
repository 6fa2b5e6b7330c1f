"""Runtime micro-benchmark: what one forward pass costs as query rows grow (the reason parallel
threads are nearly free on this hardware), how much of that is the model's matmuls (its
`nn.Linear` layers alone, at the same row counts), and what the paged KV store's bookkeeping costs.

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--preset", default="tiny-4l")
    ap.add_argument("--context", type=int, default=128, help="tokens already in the KV store")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: tiny models thrash with more on a shared CPU)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    reps = 30 if args.quick else 200
    rows_list = [1, 2, 3, 4, 8, 16]

    model = TinyLM(ModelConfig.from_name(args.preset)).eval()
    kv = model.new_kv_store(page_size=16)
    ctx = kv.allocate(args.context)
    model(torch.randint(0, 256, (args.context,)), torch.arange(args.context), torch.tensor(ctx),
          visibility_rows([ctx[: i + 1] for i in range(args.context)], kv.num_slots, "cpu"), kv)

    times: dict[int, list[float]] = {r: [] for r in rows_list}
    for _ in range(reps):  # interleave row counts so machine noise hits all of them alike
        for r in rows_list:
            new = kv.allocate(r)
            vis = visibility_rows([ctx + [s] for s in new], kv.num_slots, "cpu")
            t0 = time.perf_counter()
            model(torch.randint(0, 256, (r,)), torch.arange(args.context, args.context + r), torch.tensor(new), vis, kv)
            times[r].append(time.perf_counter() - t0)
            kv.free(new)
    base = statistics.median(times[1])
    print(f"forward pass over {args.context} cached tokens, {args.preset} ({model.num_parameters()} params), "
          f"{torch.get_num_threads()} threads, median of {reps}:")
    print(f"{'query rows':>10} {'ms':>8} {'x one row':>10} {'rows/s gain':>12}")
    ratios = {}
    for r in rows_list:
        m = statistics.median(times[r])
        ratios[r] = m / base
        print(f"{r:>10} {m * 1000:>8.3f} {m / base:>10.2f} {r * base / m:>12.2f}")

    linear_us = linear_layers_us(model, rows_list, reps)
    print(f"the model's {len(linear_layers(model))} matmuls (nn.Linear) alone, median of {reps}: "
          + ", ".join(f"{r} row{'s' if r > 1 else ''} {linear_us[r]:.0f} us" for r in rows_list))

    # KV store bookkeeping: allocate + free a page worth of slots, versus one forward pass
    t0 = time.perf_counter()
    n = 2000 if args.quick else 20000
    for _ in range(n):
        kv.free(kv.allocate(16))
    alloc_free_us = (time.perf_counter() - t0) / n * 1e6
    print(f"allocate+free of one 16-slot page: {alloc_free_us:.1f} us ({alloc_free_us / (base * 1e6) * 100:.1f}% of a 1-row forward)")
    print(json.dumps({"bench": "runtime", "preset": args.preset, "context_tokens": args.context,
                      "forward_ms_1_row": base * 1000,
                      "forward_ratio_by_rows": {str(r): round(v, 3) for r, v in ratios.items()},
                      "forward_ms_by_rows": {str(r): round(statistics.median(times[r]) * 1000, 4) for r in rows_list},
                      "linear_layers_us_by_rows": {str(r): round(v, 1) for r, v in linear_us.items()},
                      "page_alloc_free_us": round(alloc_free_us, 2)}))


if __name__ == "__main__":
    main()
