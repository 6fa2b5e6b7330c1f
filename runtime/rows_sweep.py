"""Rows sweep: how the serving runtime's forward pass grows with its rows and its pool, measured.

What: `rows_sweep(model)` times `runtime.server.forward_batch` for batched decode passes of R
requests (one query row each, R in `ROWS`) over a pool of S slots (S in `SLOTS`; each request
holds S // R of them), with the server's attention (`mask`: every row scores the whole pool;
`gather`: each request its own slots). Per shape: rows, keys the attention scored, the median of
`reps` timings. `solm capture --concurrency 1 --rows-sweep` records it in the calibration trace's
meta (`meta["rows_sweep"]`), and `simulator.load_calibration.calibrate_batch1` fits the forward on
it beside the trace's own passes.

Why: a batch-1 trace of a sequential or TIP model has passes of 1 row (decodes) and of 10-40
rows (prompt prefills) over its own KV only, so it cannot show how a pass grows from 1 to 8 rows
(on a CPU the step from 1 to 2 rows costs several times what each later row does) or what a key
costs when a row scores a pool of 512 slots. Under load those are the passes that run. The sweep
shows both, on the same machine and model, without serving more than one request.

The KV slots hold zeros (a pass's time does not depend on the values) and no engine work runs:
what is timed is the forward the server times for a pass, nothing else.

`idle_sweep(model)`: the same forward right after the process slept for 2-200 ms against the
same forward back to back. A server between arrivals sleeps; on this CPU the pass that follows
runs slower the longer it slept (`python -m runtime.rows_sweep --model tip-tiny --idle` printed
1.19-1.30x after 50 ms on the idle machine: the cores clock down and the caches go cold), and a
closed-loop calibration, whose next request arrives as the last one ends, never sleeps. Recorded
beside the sweep (`meta["rows_sweep"]["after_idle"]`).

    from runtime.rows_sweep import rows_sweep
    rows_sweep(model, page_size=16)   # [{"rows": 1, "slots": 80, "keys": 80, "duration_s": ...}, ...]

    .venv/bin/python -m runtime.rows_sweep --model tip-tiny   # the sweep as a table (ms), rows x pool
    .venv/bin/python -m runtime.rows_sweep --model tip-tiny --idle   # a pass after sleeping / back to back

Each shape's first pass is kept beside its median (`first_s`; `first_pass_ratios` sums them up):
on the H200 a serving pass meeting a (rows, key span) pair for the first time took about three
times a seen one (traces/gpu-h200/README.md). `shape_profile` runs a new shape's first and second
pass under torch.profiler and ranks their operators, to say where the extra time goes:

    python -m runtime.rows_sweep --model arch:llama-3-8b --device cuda --json --profile 5x384
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from runtime.engines.base import PassInputs
from runtime.server import forward_batch

ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
SLOTS = (64, 128, 256, 512, 1024)
REPS = 5
WARMUP = 5  # untimed passes before the first shape
IDLE_SHAPES = ((1, 64), (24, 512))  # (rows, slots): a lone decode, and a prefill-sized pass over a full pool
IDLE_SLEEPS_S = (0.002, 0.01, 0.05, 0.2)
IDLE_REPS = 7


def idle_sweep(
    model,
    page_size: int = 16,
    attention: str = "mask",
    shapes: tuple[tuple[int, int], ...] = IDLE_SHAPES,
    sleeps_s: tuple[float, ...] = IDLE_SLEEPS_S,
    reps: int = IDLE_REPS,
) -> list[dict]:
    """Per shape and sleep: rows, slots, the sleep, and the median seconds of the forward back to
    back (`busy_s`: after two passes of the shape) and right after the sleep (`after_idle_s`)."""
    out = []
    for r, s in shapes:
        kv, context = decode_context(model, page_size, r, s)
        for _ in range(WARMUP):
            timed_pass(model, kv, context, attention)
        for idle in sleeps_s:
            busy, after = [], []
            for _ in range(reps):
                timed_pass(model, kv, context, attention)
                busy.append(timed_pass(model, kv, context, attention)[0])
                time.sleep(idle)
                after.append(timed_pass(model, kv, context, attention)[0])
            out.append(
                {
                    "rows": r,
                    "slots": s,
                    "idle_s": idle,
                    "busy_s": statistics.median(busy),
                    "after_idle_s": statistics.median(after),
                }
            )
    return out


def rows_sweep(
    model,
    page_size: int = 16,
    attention: str = "mask",
    rows: tuple[int, ...] = ROWS,
    slots: tuple[int, ...] = SLOTS,
    reps: int = REPS,
) -> list[dict]:
    """Per (rows, slots) shape: rows, the pool's slot span in the pass (at least S; more where R
    requests' own pages need more), keys scored and the median seconds of `reps` passes (after
    one untimed pass of the shape, `WARMUP` before the first), and the seconds of the shape's first
    pass (`first_s`: the first time this process met the shape; for the sweep's first shape, the
    process's first pass too)."""
    out: list[dict] = []
    for s in slots:
        for r in rows:
            kv, context = decode_context(model, page_size, r, s)
            times, keys, span, first = [], 0, 0, 0.0
            warm = 1 if out else WARMUP  # the process's first passes are slower still
            for rep in range(warm + reps):
                dt, keys, span = timed_pass(model, kv, context, attention)
                if rep == 0:
                    first = dt
                if rep >= warm:  # the first pass of a shape warms its buffers
                    times.append(dt)
            out.append(
                {
                    "rows": r,
                    "slots": int(span),
                    "keys": int(keys),
                    "duration_s": statistics.median(times),
                    "first_s": first,
                }
            )
    return out


def first_pass_ratios(sweep: list[dict]) -> dict:
    """How much a shape's first pass costs beyond its median: per shape of the sweep after its
    first (whose first pass is the process's too), first_s / duration_s and first_s - duration_s;
    their medians and the largest ratio. A per-shape cost (a kernel plan, a cudaMalloc of a new
    size) shows as ratios well above 1 on every shape; a CPU gives about 1."""
    later = [p for p in sweep[1:] if p["duration_s"] > 0]
    if not later:
        return {"shapes": 0}
    ratio = [p["first_s"] / p["duration_s"] for p in later]
    extra = [p["first_s"] - p["duration_s"] for p in later]
    return {
        "shapes": len(later),
        "first_over_median_median": statistics.median(ratio),
        "first_over_median_max": max(ratio),
        "first_extra_s_median": statistics.median(extra),
    }


def shape_profile(model, rows: int, slots: int, page_size: int = 16, attention: str = "mask", top: int = 12) -> dict:
    """Where the first pass of a shape this process has not met spends its time, beside the same
    shape's second pass: each pass run under `torch.profiler` (CPU, and CUDA where the model is on
    a GPU), its seconds (with the profiler's overhead) and its `top` operators by self CPU time
    and by self device time (name, calls, self CPU s, self device s). Call it with a shape the
    process has not run yet, or both passes are "seen"."""
    from torch.profiler import ProfilerActivity, profile

    kv, context = decode_context(model, page_size, rows, slots)
    cuda = model.embed.weight.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    out: dict = {"rows": rows, "slots_asked": slots, "attention": attention}
    for name in ("new", "seen"):
        with profile(activities=activities) as prof:
            dt, keys, span = timed_pass(model, kv, context, attention)
        ops = [
            {
                "name": e.key,
                "calls": int(e.count),
                "self_cpu_s": e.self_cpu_time_total * 1e-6,
                "self_device_s": getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) * 1e-6,
            }
            for e in prof.key_averages()
        ]
        by_cpu = sorted(ops, key=lambda o: -o["self_cpu_s"])[:top]
        by_device = sorted(ops, key=lambda o: -o["self_device_s"])[:top] if cuda else []
        out.update(slots=int(span), keys=int(keys))
        out[name] = {"duration_s": dt, "by_self_cpu": by_cpu, "by_self_device": by_device}
    return out


def decode_context(model, page_size: int, rows: int, slots: int):
    """A fresh KV store and `rows` requests' contexts in it, each holding `slots // rows` slots."""
    kv = model.new_kv_store(page_size=page_size)
    return kv, [kv.allocate(max(slots // rows, 1), owner=i) for i in range(rows)]


def timed_pass(model, kv, context: list[list[int]], attention: str) -> tuple[float, int, int]:
    """One batched decode pass (a row per request of `context`), its new slots freed after:
    (forward seconds, keys scored, the pool's slot span)."""
    inputs = decode_rows(kv, context)
    t0 = time.perf_counter()
    logits, _, scored = forward_batch(model, kv, inputs, attention)
    if logits.device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    keys, span = sum(scored), kv.num_slots
    kv.free([slot for inp in inputs for slot in inp.slots])
    return dt, keys, span


def decode_rows(kv, context: list[list[int]]) -> list[PassInputs]:
    """One decode row per request: a new slot after its context, seeing its context and itself."""
    inputs = []
    for owner, held in enumerate(context):
        (new,) = kv.allocate(1, owner=owner)
        cols = np.asarray([*held, new], dtype=np.int64)
        inputs.append(PassInputs([1], [len(held)], [new], cols, np.ones((1, len(cols)), dtype=bool), "decode"))
    return inputs


def profile_shape_arg(text: str) -> tuple[int, int]:
    """`--profile RxS`: a shape of R rows over a pool of S slots, both positive."""
    import argparse

    try:
        r, s = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not ROWSxSLOTS (e.g. 5x384)") from None
    if r < 1 or s < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: rows and slots must be at least 1")
    return r, s


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    from runtime.attention import strategy_in_force
    from runtime.checkpoint import load_model

    ap = argparse.ArgumentParser(description="time the serving forward over rows x pool sizes (median ms)")
    ap.add_argument("--model", default="tip-tiny", help="a shipped model, preset or arch:NAME (default tip-tiny)")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument("--attention", default="mask", choices=("mask", "gather"))
    ap.add_argument("--reps", type=int, default=REPS, help=f"timings per shape, the median kept (default {REPS})")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, as solm capture)")
    ap.add_argument("--idle", action="store_true", help="the idle sweep instead: a pass after sleeping / back to back")
    ap.add_argument(
        "--profile",
        type=profile_shape_arg,
        action="append",
        default=[],
        metavar="RxS",
        help="after the sweep, profile the first and second pass of a shape it did not run (repeatable)",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the tables")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_model(args.model, args.device)
    if args.idle:
        print(
            f"{args.model}, {args.attention} attention: forward after sleeping / back to back (median of {IDLE_REPS})"
        )
        print("rows slots " + "".join(f"{s * 1e3:>8g}ms" for s in IDLE_SLEEPS_S))
        idle = idle_sweep(model, attention=args.attention)
        for r, s in IDLE_SHAPES:
            cells = [p["after_idle_s"] / p["busy_s"] for p in idle if p["rows"] == r and p["slots"] == s]
            print(f"{r:4d} {s:5d} " + "".join(f"{c:10.3f}" for c in cells))
        return
    out = rows_sweep(model, attention=args.attention, reps=args.reps)
    profiles = [shape_profile(model, r, s, attention=args.attention) for r, s in args.profile]
    if args.json:
        where = model.embed.weight.device
        cuda = where.type == "cuda"
        device = torch.cuda.get_device_name(where) if cuda else str(where)
        report = {"model": args.model, "device": device, "attention": args.attention, "reps": args.reps}
        report["sdpa"] = strategy_in_force(cuda)  # how the masked attention ran (runtime/attention.py)
        report.update(sweep=out, first_pass=first_pass_ratios(out), profiles=profiles)
        print(json.dumps(report))
        return
    print(f"{args.model}, {args.attention} attention: forward ms (median of {args.reps}) by rows x pool slots asked")
    print("rows " + "".join(f"{s:>8d}" for s in SLOTS))
    for r in ROWS:
        cells = [p["duration_s"] * 1e3 for p in out if p["rows"] == r]
        print(f"{r:4d} " + "".join(f"{c:8.3f}" for c in cells))
    print("first pass of each shape / its median (the first shape's is the process's first pass)")
    for r in ROWS:
        cells = [p["first_s"] / p["duration_s"] for p in out if p["rows"] == r]
        print(f"{r:4d} " + "".join(f"{c:8.2f}" for c in cells))
    for prof in profiles:
        print(
            f"profile {prof['rows']} rows x {prof['slots']} slots: first pass {prof['new']['duration_s'] * 1e3:.2f} ms, "
            f"second {prof['seen']['duration_s'] * 1e3:.2f} ms (under the profiler)"
        )
        for name in ("new", "seen"):
            for o in prof[name]["by_self_cpu"][:5]:
                print(
                    f"  {name:4s} {o['self_cpu_s'] * 1e3:9.3f} ms cpu {o['self_device_s'] * 1e3:9.3f} ms dev  {o['name']}"
                )


if __name__ == "__main__":
    main()
