"""Batch-1 decode bandwidth efficiency: bytes a decode pass must read (every weight once, plus the
K/V of the context) / pass time / the device's peak memory bandwidth, for

    engine        the engines' path: `HFCausalLM.forward` over the paged store (host checks every pass)
    static        `runtime.static_decode.StaticDecoder`, eager (no host sync, static shapes)
    compile       the same step under torch.compile (inductor)
    cuda-graphs   torch.compile mode="reduce-overhead" (inductor + CUDA graphs; GPU only)

Passes are timed with CUDA events on a GPU (perf_counter on the CPU), after `--warmup` untimed
passes (compilation happens there). Each path's greedy tokens are checked against the engine
path's (printed). The peak bandwidth is the catalog's (`simulator/hardware.py`) for a recognised
GPU name, or `--peak-gbps`; on a CPU without it, bytes/s are printed and efficiency is n/a.

Run (GPU):  python bench/decode_efficiency.py --arch llama-3-8b --device cuda
Run (CPU check):  .venv/bin/python bench/decode_efficiency.py --arch tiny-llama --device cpu --modes engine,static,compile
Last line: one JSON object {"bench": "decode_efficiency", ...}. Not part of `make bench`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

MODES = ("engine", "static", "compile", "cuda-graphs")


class Timer:
    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def __call__(self, fn) -> float:
        """Seconds one call of fn takes (CUDA events: device time between two points of the stream)."""
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t


def peak_bytes_per_s(device: str, given_gbps: float) -> tuple[float, str]:
    if given_gbps > 0:
        return given_gbps * 1e9, f"--peak-gbps {given_gbps}"
    if not device.startswith("cuda"):
        return 0.0, "unknown for a CPU (pass --peak-gbps)"
    from simulator.hardware import HARDWARE

    name = torch.cuda.get_device_name(torch.device(device)).lower()
    for key, spec in sorted(HARDWARE.items(), key=lambda kv: -len(kv[0].split("-")[0])):  # h100 before a10
        if spec.kind == "gpu" and key.split("-")[0] in name.replace(" ", ""):
            return spec.hbm_bytes_per_s, f"catalog {key}"
    return 0.0, f"{name!r} not in the catalog (pass --peak-gbps)"


def run_engine_path(model, prompt: list[int], n: int, warmup: int, timer: Timer) -> tuple[list[float], list[int]]:
    """The engines' primitive, batch 1: one query row per pass over the paged store."""
    from runtime.engines.base import visibility_rows

    kv = model.new_kv_store(page_size=16)
    slots = kv.allocate(len(prompt))
    dev = model.device
    vis = visibility_rows([slots[: i + 1] for i in range(len(prompt))], kv.num_slots, dev)

    def t(xs):
        return torch.tensor(xs, device=dev)

    logits = model(t(prompt), t(list(range(len(prompt)))), t(slots), vis, kv)
    tok, times, out = int(logits[-1].argmax()), [], []
    for i in range(warmup + n):
        out.append(tok)
        (s,) = kv.allocate(1)
        slots.append(s)
        pos = len(prompt) + i
        box = {}

        def step(box=box, tok=tok, pos=pos, s=s):
            box["l"] = model(t([tok]), t([pos]), t([s]), visibility_rows([slots], kv.num_slots, dev), kv)

        dt = timer(step)
        tok = int(box["l"][-1].argmax())
        if i >= warmup:
            times.append(dt)
    return times, out


def run_static(model, prompt: list[int], n: int, warmup: int, timer: Timer, mode: str) -> tuple[list[float], list[int]]:
    from runtime.static_decode import StaticDecoder

    dec = StaticDecoder(model, capacity=len(prompt) + warmup + n + 8, mode=mode)
    tok = dec.prefill(prompt).argmax(-1)
    pos = torch.tensor([len(prompt)], device=model.device)
    times, out = [], []
    for i in range(warmup + n):
        out.append(tok)
        box = {}

        def step(box=box, tok=tok, pos=pos):
            box["l"] = dec.decode(tok, pos)

        dt = timer(step)
        tok = box["l"].argmax(-1).clone()  # (no host copy: the next pass reads it on the device)
        pos = pos + 1
        if i >= warmup:
            times.append(dt)
    return times, [int(x) for x in torch.cat(out).tolist()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The bench's flags (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="llama-3-8b", help="runtime/hf_configs name (random weights)")
    ap.add_argument("--model", default="", help="any load_model spec instead (e.g. smollm2-135m)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="", help="bfloat16 / float16 / float32 (default: bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--context", type=int, default=512, help="prompt tokens before the timed passes")
    ap.add_argument("--passes", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--peak-gbps", type=float, default=0.0)
    ap.add_argument(
        "--coordinate-descent",
        action="store_true",
        help="inductor's coordinate-descent tuning of its kernels' launch settings (as gpt-fast sets it)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        print(f"bench/decode_efficiency.py: error: unknown mode(s) {bad}; valid: {', '.join(MODES)}", file=sys.stderr)
        return 2
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print(
            "bench/decode_efficiency.py: error: --device cuda asked for, but torch sees no CUDA device", file=sys.stderr
        )
        return 2
    if not cuda:
        modes = [m for m in modes if m != "cuda-graphs"]
    if args.coordinate_descent:
        import torch._inductor.config as inductor_config

        inductor_config.coordinate_descent_tuning = True
    model, spec, weight_bytes, prompt = load(args)
    peak, peak_src = peak_bytes_per_s(args.device, args.peak_gbps)
    res = time_modes(model, prompt, modes, args, weight_bytes, peak, Timer(cuda))
    print(
        json.dumps(
            {
                "bench": "decode_efficiency",
                "model": spec,
                "device": args.device,
                "device_name": torch.cuda.get_device_name(torch.device(args.device)) if cuda else "cpu",
                "dtype": str(model.embed.weight.dtype).replace("torch.", ""),
                "weight_bytes": weight_bytes,
                "context": args.context,
                "passes": args.passes,
                "timer": "cuda events" if cuda else "perf_counter",
                "coordinate_descent_tuning": args.coordinate_descent,
                "peak_bytes_per_s": peak,
                "peak_source": peak_src,
                "modes": res,
            }
        )
    )
    return 0 if any("error" not in v for v in res.values()) else 1


def load(args: argparse.Namespace) -> tuple:
    """(model without the logits' vocabulary cap, its spec, weight bytes, a seeded random prompt of
    `--context` tokens)."""
    from runtime.checkpoint import load_model
    from runtime.hf_adapter import _DTYPES, build_arch

    dtype = _DTYPES.get(args.dtype) if args.dtype else None
    model = load_model(args.model, args.device)[0] if args.model else build_arch(args.arch, args.device, dtype=dtype)
    model.logits_vocab = None
    spec = args.model or f"arch:{args.arch}"
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    prompt = [
        int(i)
        for i in torch.randint(
            3, min(model.cfg.vocab_size, 30000), (args.context,), generator=torch.Generator().manual_seed(0)
        )
    ]
    return model, spec, weight_bytes, prompt


def equal_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy continuations share (where low-precision sums tip an
    argmax between near-tied logits, the paths part ways there and differ after)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def time_modes(
    model, prompt: list[int], modes: list[str], args: argparse.Namespace, weight_bytes: int, peak: float, timer: Timer
) -> dict:
    """Each mode's decode passes timed (one line each): median and fastest pass, bytes moved, GB/s,
    share of `peak`, and whether its tokens equal the first mode's; a failing mode is its error."""
    res, ref = {}, None
    for m in modes:
        try:
            if m == "engine":
                times, toks = run_engine_path(model, prompt, args.passes, args.warmup, timer)
            else:
                times, toks = run_static(model, prompt, args.passes, args.warmup, timer, {"static": "eager"}.get(m, m))
        except Exception as e:  # noqa: BLE001 - one failing path (a compiler missing) must not lose the others
            res[m] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            print(f"{m:12s} failed: {res[m]['error']}", flush=True)
            continue
        ref = ref if ref is not None else toks
        ctx = args.context + args.warmup + args.passes / 2  # mean context over the timed passes
        nbytes = weight_bytes + ctx * model.kv_bytes_per_token
        med = statistics.median(times)
        res[m] = {
            "pass_ms_median": med * 1e3,
            "pass_ms_min": min(times) * 1e3,
            "bytes_per_pass": nbytes,
            "gbytes_per_s": nbytes / med / 1e9,
            "efficiency": nbytes / med / peak if peak else None,
            "tokens_equal_engine": toks == ref,
            "tokens_equal_prefix": equal_prefix(toks, ref),
        }
        eff = f"{100 * res[m]['efficiency']:.1f}% of peak" if peak else "efficiency n/a"
        print(
            f"{m:12s} pass {med * 1e3:8.3f} ms median ({min(times) * 1e3:.3f} min)  {nbytes / med / 1e9:8.1f} GB/s  "
            f"{eff}  tokens equal to engine path: {toks == ref} (first {equal_prefix(toks, ref)} of {len(ref)})",
            flush=True,
        )
    return res


if __name__ == "__main__":
    sys.exit(main())
