"""One-shot GPU capture: every engine on one real-scale architecture, one output folder.

What: loads one model once (by default a randomly initialised `arch:llama-3-8b`, bf16 on CUDA),
then captures a trace per system (sequential, pasta, tip, planned_diffusion: whichever engines
exist) on each system's default task, with CUDA-event timing per forward pass and NVML counters
(memory, utilisation, power, energy, SM clock, temperature) sampled at `--counters-hz`. Writes

    OUT/meta.json        the device, the model, versions, and per system: status, wall time, error
    OUT/<system>/        a trace (format v1) per system

Why: the cost of a forward pass does not depend on what the weights say, so a random 8B model
measures the real cost of each orchestration pattern's passes, KV and memory. Quality is not
applicable for random weights (or an HF model that does not speak the project's tokenizer): it is
written as NaN and `meta.json` says why, never invented.

Structure (`--structure-from`): a random model left to itself emits random tags, so by default
(`shipped`) each system first captures a small reference with its shipped tiny checkpoint
(OUT/reference/<system>) and the real-scale model then replays that structure token by token
(`runtime.structure_replay`: same forks, chunk lengths, register reuse, evictions, plans) while
every forward pass is its own. `--structure-from DIR` replays DIR/<system> traces instead;
`none` lets the model choose.

Run (CUDA machine):  python bench/gpu_capture.py --arch llama-3-8b --out out/gpu-h200
Run (CPU check):     .venv/bin/python bench/gpu_capture.py --device cpu --arch tiny-llama --n 1 --max-tokens 8 --out /tmp/g
Prints one line per system; the last line is one JSON object. Not part of `make bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from profiler.counters import CounterSampler  # noqa: E402
from profiler.provenance import git_commit, solm_version  # noqa: E402
from profiler.reader import read_trace  # noqa: E402
from profiler.writer import write_json  # noqa: E402
from runtime.capture import (  # noqa: E402
    NOT_APPLICABLE,
    CaptureConfig,
    capture,
    device_meta,
    model_meta,
    quality_applicable,
)
from runtime.checkpoint import CHECKPOINTS_DIR, load_model  # noqa: E402
from runtime.engines import GenerationConfig, Request, get_engine, systems  # noqa: E402
from runtime.structure_replay import REPLAYABLE  # noqa: E402
from runtime.tokenizer import Tokenizer  # noqa: E402

WANTED = ("sequential", "pasta", "tip", "planned_diffusion")


def reference_dir(system: str, args, out: Path) -> Path | None:
    """Where this system's structure comes from: a given folder, a fresh shipped-model capture, or none."""
    if args.structure_from == "none" or system not in REPLAYABLE:
        return None
    if args.structure_from != "shipped":
        ref = Path(args.structure_from) / system
        if not (ref / "tokens.parquet").is_file():
            raise FileNotFoundError(f"--structure-from: no trace at {ref}")
        return ref
    engine_cls = get_engine(system)
    if not (CHECKPOINTS_DIR / engine_cls.default_model).is_dir():
        return None
    ref = out / "reference" / system
    capture(
        CaptureConfig(
            system=system,
            n=args.n,
            max_tokens=args.max_tokens,
            page_size=args.page_size,
            device=args.device,
            seed=args.seed,
        ),
        ref,
        overwrite=args.force,
        progress=False,
    )
    return ref


def capture_system(system: str, model, info: dict, spec: str, args, out: Path, ref: Path | None) -> dict:
    """One trace through `runtime.capture.capture` (the model is shared across systems, loaded once)."""
    cfg = CaptureConfig(
        system=system,
        model=spec,
        n=args.n,
        device=args.device,
        seed=args.seed,
        max_tokens=args.max_tokens,
        page_size=args.page_size,
        counters_interval_s=1.0 / args.counters_hz,
        warmup=1,
        structure_from=str(ref) if ref else "",
    )
    path = capture(cfg, out, overwrite=args.force, progress=False, loaded=(model, info))
    t = read_trace(path)
    return {
        "requests": len(t.requests),
        "counter_samples": len(t.counters),
        "counters_source": t.meta.get("counters_source", ""),
        "structure_source": str(ref) if ref else "own",
    }


def warm_up(model, tok: Tokenizer) -> None:
    """One short unrecorded request: CUDA context, cuBLAS handles and allocator warm before timing."""
    eng = get_engine("sequential")(model, tok, GenerationConfig(max_tokens=2))
    eng.generate(Request(0, "warm up"))
    if torch.cuda.is_available() and model.embed.weight.is_cuda:
        torch.cuda.synchronize()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The script's flags (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--arch", default="llama-3-8b", help="architecture in runtime/hf_configs (random weights)")
    src.add_argument("--model", default="", help="any load_model spec instead: a local HF dir, a solm checkpoint")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--systems", default=",".join(WANTED), help="comma-separated; missing engines are skipped")
    ap.add_argument("--n", type=int, default=4, help="requests per system")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--counters-hz", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--structure-from",
        default="shipped",
        help="shipped (capture references with the shipped tiny models), a folder of <system> traces, or none",
    )
    ap.add_argument("--force", action="store_true", help="overwrite existing traces under --out")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda asked for, but torch sees no CUDA device (use --device cpu)", file=sys.stderr)
        return 2
    if not 10.0 <= args.counters_hz <= 20.0:
        print(f"note: --counters-hz {args.counters_hz} is outside the 10-20 Hz this script is meant for")
    out = Path(args.out)
    if (out / "meta.json").exists() and not args.force:
        print(f"error: {out} already holds a capture (choose another --out or pass --force)", file=sys.stderr)
        return 2
    spec = args.model or f"arch:{args.arch}"
    t0 = time.perf_counter()
    try:
        model, info = load_model(spec, args.device, seed=args.seed)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    load_s = time.perf_counter() - t0
    tok = Tokenizer()
    scored = quality_applicable(info, "")
    warm_up(model, tok)
    summary = capture_systems(args, model, info, spec, out)
    device = write_meta(args, argv, out, spec, model, info, load_s, summary, scored)
    ok = [s for s, v in summary.items() if v["status"] == "ok"]
    print(
        json.dumps(
            {
                "bench": "gpu_capture",
                "out": str(out),
                "device": device.get("name", ""),
                "model": spec,
                "ok": ok,
                "failed": [s for s, v in summary.items() if v["status"] == "error"],
                "wall_s": {s: round(v["wall_s"], 3) for s, v in summary.items() if "wall_s" in v},
            }
        )
    )
    return 0 if ok and all(v["status"] != "error" for v in summary.values()) else 1


def capture_systems(args: argparse.Namespace, model, info: dict, spec: str, out: Path) -> dict:
    """Capture every `--systems` engine under `out/<system>`, one line each: system -> status (ok,
    error, skipped when the engine is not in this checkout), wall time and the capture's figures.
    One failing engine does not lose the others' traces."""
    have = set(systems())
    wanted = [s for s in args.systems.split(",") if s]
    summary: dict = {}
    for system in wanted:
        if system not in have:
            summary[system] = {"status": "skipped", "error": "engine not present in this checkout"}
            print(f"{system:18s} skipped (engine not present)")
            continue
        t = time.perf_counter()
        try:
            ref = reference_dir(system, args, out)
            res = capture_system(system, model, info, spec, args, out / system, ref)
            summary[system] = {"status": "ok", "dir": system, "wall_s": time.perf_counter() - t, **res}
        except Exception as e:  # one failing engine must not lose the others' traces
            summary[system] = {
                "status": "error",
                "wall_s": time.perf_counter() - t,
                "error": f"{type(e).__name__}: {e}",
            }
        s = summary[system]
        print(f"{system:18s} {s['status']:6s} {s['wall_s']:8.1f} s  {s.get('error', '')}")
    return summary


def write_meta(
    args: argparse.Namespace,
    argv: list[str] | None,
    out: Path,
    spec: str,
    model,
    info: dict,
    load_s: float,
    summary: dict,
    scored: bool,
) -> dict:
    """Write `out/meta.json` (model, device, per-system summary, settings, versions, host); returns
    the device's description."""
    sampler = CounterSampler(1.0 / args.counters_hz, use_nvml=args.device.startswith("cuda"))
    device = device_meta(args.device, sampler)
    sampler.stop()
    try:
        from runtime.hf_adapter import transformers_version

        tf_version = transformers_version()
    except ImportError:
        tf_version = ""
    meta = {
        "kind": "gpu_capture",
        "model_spec": spec,
        "model": model_meta(model, spec, info),
        "device": device,
        "load_s": load_s,
        "systems": summary,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "page_size": args.page_size,
        "counters_hz": args.counters_hz,
        "structure_from": args.structure_from,
        "quality_applicable": scored,
        "quality_note": "" if scored else NOT_APPLICABLE,
        "transformers": tf_version,
        "torch": torch.__version__,
        "solm_version": solm_version(),
        "git_commit": git_commit(),
        "seed": args.seed,
        "argv": sys.argv[1:] if argv is None else argv,
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(), "cores": os.cpu_count()},
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "meta.json", meta)
    return device


if __name__ == "__main__":
    raise SystemExit(main())
