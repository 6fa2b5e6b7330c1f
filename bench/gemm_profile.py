"""Time GEMMs on this machine's accelerator and write the CSV `solm calibrate` reads.

What: for every (m, n, k) of a grid, `torch.matmul` of an (m x k) by a (k x n) matrix in the
given dtype on the given device (default: cuda when PyTorch sees one, else cpu): a few warm-up
calls, then `--trials` trials of `--iters` calls; a GEMM's time is the median trial's time / iters.
`--timer` says how a trial is timed:
    graph   (CUDA's default) the iters calls captured once in a CUDA graph, each trial one replay
            between two CUDA events: the kernels' own time, no host launch cost in it (a Python
            loop of launches takes 10-16 us a call, longer than a small GEMM's kernel). The calls
            cycle over copies of the (k x n) matrix, enough that together they are at least twice
            the L2 cache, so the weights come from memory as in a model's forward, where every
            layer's weights differ (one copy when it alone is that large)
    wall    (the CPU's; on CUDA on request) the iters calls back to back on one matrix between two
            device synchronisations, by the host's clock: launch cost and L2 reuse included
The CSV has the columns m, n, k, time_s, dtype, device, trials, timer (one row per GEMM), and
with `--kernels` the kernels one call runs (the library's choice of tile and split-K, by name).
Why: `solm calibrate GEMMS.csv --hardware PART --out CAL.json` fits the simulator's GEMM tile
model to a part's own times; this is the shortest way to get them. It needs only PyTorch, so it
runs on a GPU machine that has nothing else of solm installed (copy this one file there).

    python bench/gemm_profile.py --out h100-gemms.csv                 # the default grid: 160 GEMMs
    python bench/gemm_profile.py --m 1,64,512 --n 4096 --k 4096 --out small.csv
    solm calibrate h100-gemms.csv --hardware h100-sxm --out h100.json

The default grid: m (tokens) 1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192 by the (K, N)
shapes of Llama-3-8B's and Llama-2-70B's projections at TP 1 and 4 (QKV, output, fused gate+up,
down). Its CPU path runs in the tests (no GPU in CI); on an H200 it wrote simulator/data/h200-gemm.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

DEFAULT_M = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# (K, N) of Llama-3-8B (hidden 4096, QKV 6144, MLP 14336) and Llama-2-70B (hidden 8192, QKV 10240,
# MLP 28672) projections at TP 1 and TP 4: QKV, output, fused gate+up, down.
DEFAULT_KN = (
    (4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096),
    (4096, 1536), (1024, 4096), (4096, 7168), (3584, 4096),
    (8192, 10240), (8192, 8192), (8192, 57344), (28672, 8192),
    (8192, 2560), (2048, 8192), (8192, 14336), (7168, 8192),
)  # fmt: skip
DTYPES = ("bfloat16", "float16", "float32")


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SystemExit(f"gemm_profile: error: {flag} takes comma-separated positive integers, got {text!r}")
    return values


def time_gemm(torch, m: int, n: int, k: int, dtype, device: str, iters: int, trials: int, timer: str = "wall") -> float:
    """Seconds per call of an (m x k) @ (k x n) matmul: the median trial's time / iters (module
    docstring: `timer` wall or graph)."""
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    if timer == "graph":
        return _time_graph(torch, a, b, iters, trials)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(3):
        torch.matmul(a, b)
    sync()
    runs = []
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b)
        sync()
        runs.append((time.perf_counter() - start) / iters)
    return statistics.median(runs)


def kernel_names(torch, m: int, n: int, k: int, dtype, device: str) -> str:
    """The kernels one call of the GEMM runs, as the profiler names them, in launch order, joined
    by "+" (on a GPU the library's choice: cuBLAS's nvjet/sm90 and cutlass kernels name their tile
    shape, and a split-K reduction shows as a kernel of its own): what `--kernels` records. On a
    CPU there is no device kernel; the operators run are named instead (aten::mm)."""
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    torch.matmul(a, b)  # the library's choice made and cached before the profiled call
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        torch.matmul(a, b)
        if cuda:
            torch.cuda.synchronize(device)
    return "+".join(device_kernels(prof.events(), cuda))


def device_kernels(events, cuda: bool) -> list[str]:
    """Kernel names from profiler events: on a GPU the events that ran on the device (their
    `device_type` is CUDA), in order, each once; elsewhere the matrix-product operators."""
    names: list[str] = []
    for e in sorted(events, key=lambda e: e.time_range.start):
        on_device = str(getattr(e, "device_type", "")).endswith("CUDA")
        keep = on_device if cuda else e.name in ("aten::mm", "aten::addmm", "aten::bmm")
        if keep and e.name not in names:
            names.append(e.name)
    return names


def weight_copies(b_bytes: int, l2_bytes: int, iters: int) -> int:
    """Copies of the weight matrix to cycle over so that together they are at least twice the L2
    (so no call finds its weights there), at most one per call, at least one."""
    return max(1, min(iters, -(-2 * l2_bytes // max(b_bytes, 1))))


def _time_graph(torch, a, b, iters: int, trials: int) -> float:
    """CUDA only: `iters` matmuls (cycling over weight copies) captured in one CUDA graph; each trial
    is one replay timed by CUDA events."""
    l2 = int(getattr(torch.cuda.get_device_properties(a.device), "L2_cache_size", 0))
    bs = [b] + [torch.randn_like(b) for _ in range(weight_copies(b.numel() * b.element_size(), l2, iters) - 1)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as graph capture wants
        for w in bs:
            torch.matmul(a, w)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iters):
            torch.matmul(a, bs[i % len(bs)])
    graph.replay()
    torch.cuda.synchronize()
    runs = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / 1e3 / iters)
    del graph
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="CSV to write (refused if it exists, unless --force)")
    parser.add_argument("--force", action="store_true", help="overwrite --out")
    parser.add_argument("--m", default=",".join(map(str, DEFAULT_M)), help="token counts (rows of A)")
    parser.add_argument("--n", default=None, help="output widths; with --k, the grid is every m x n x k")
    parser.add_argument("--k", default=None, help="reduction depths (with --n)")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--iters", type=int, default=20, help="calls per trial (default 20)")
    parser.add_argument("--trials", type=int, default=5, help="trials per GEMM; the median is kept (default 5)")
    parser.add_argument(
        "--timer",
        choices=("graph", "wall"),
        default=None,
        help="graph: CUDA-graph replays timed by CUDA events, weights from memory (CUDA's default); "
        "wall: a loop of calls by the host clock (the CPU's; see the module docstring)",
    )
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="also record the kernels one call runs (a `kernels` column: the library's tile and split-K "
        "choice per GEMM, from torch.profiler)",
    )
    args = parser.parse_args(argv)

    import torch

    out = Path(args.out)
    if out.exists() and not args.force:
        raise SystemExit(f"gemm_profile: error: {out} exists (pass --force to overwrite it)")
    if not out.parent.is_dir():
        raise SystemExit(f"gemm_profile: error: no such directory {out.parent}")
    if (args.n is None) != (args.k is None):
        raise SystemExit("gemm_profile: error: give --n and --k together (or neither, for the default grid)")
    if args.iters < 1 or args.trials < 1:
        raise SystemExit("gemm_profile: error: --iters and --trials must be >= 1")
    ms = _ints(args.m, "--m")
    shapes = (
        list(DEFAULT_KN) if args.n is None else [(k, n) for k in _ints(args.k, "--k") for n in _ints(args.n, "--n")]
    )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    timer = args.timer or ("graph" if device.startswith("cuda") else "wall")
    if timer == "graph" and not device.startswith("cuda"):
        raise SystemExit("gemm_profile: error: --timer graph needs a CUDA device (use --timer wall)")
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    print(f"timing {len(ms) * len(shapes)} GEMMs ({args.dtype}) on {device} ({name}), timer {timer}", file=sys.stderr)
    rows = []
    for k, n in shapes:
        for m in ms:
            seconds = time_gemm(torch, m, n, k, dtype, device, args.iters, args.trials, timer)
            rows.append(
                {
                    "m": m,
                    "n": n,
                    "k": k,
                    "time_s": f"{seconds:.6e}",
                    "dtype": args.dtype,
                    "device": name,
                    "trials": args.trials,
                    "timer": timer,
                }
            )
            if args.kernels:
                rows[-1]["kernels"] = kernel_names(torch, m, n, k, dtype, device)
    tmp = out.with_name(f".{out.name}.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(out)
    print(f"wrote {out}: {len(rows)} GEMMs; next: solm calibrate {out} --hardware PART --out CAL.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
