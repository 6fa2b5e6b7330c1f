"""Simulator benchmark: how right (validation against measured CPU traces, cost model against the
public A100 per-op data) and how fast (a 1,000 x 500-token replay, a 1,000-configuration sweep).

What it measures:
- `request_latency_mape_percent`, `step_time_mape_percent`: `simulator.validation.validate` on
  every measured CPU trace shipped in traces/ (mean over traces); when none is shipped yet, on a
  small sequential capture made here (said in the output). The shipped traces record each
  request's fastest of 3 runs (`capture --repeats 3`), which filters out the shared machine's
  slow spells; the same figures on each trace's first run alone (what a `--repeats 1` capture
  would have recorded, from the runs the trace keeps in runs.parquet, `profiler.runs.single_run`)
  are printed beside them (`..._first_run`).
- `replay_1000x500_s`: wall time of `replay` (SimPy run + metrics) of 1,000 requests x 500
  generated tokens (100-token prompts) under continuous batching (max-seqs 256) on h100-sxm with
  llama-3-8b, Poisson arrivals at 20 requests/s; `replay_1000x500_burst_s` with all at t = 0.
- `sweep_1000_s`: a 1,000-configuration sweep (5 parts x 4 models x 5 max-seqs x 10 rates) of
  one trace (cycled to 32 requests) on the local process pool, one worker per core.
- `a100_op_mape_percent`: held-out median APE per op family of the cost model against the vidur
  A100 profiles (`simulator.calibrate.a100_op_errors`), and its median over families.
- `a100_unseen_median_ape_percent`, `a100_unseen_p90_ape_percent`: the tile-and-wave GEMM model on
  A100 shapes held out from its fit, with `old_model_unseen_*` beside them (bench/cost_model.py's
  evaluation; `--quick` fits on every 8th token count, else every 2nd); `a100_repeat_median_percent`
  and `a100_repeat_p90_percent`, how far apart the data's own two timings of one GEMM are.
- `h100_sxm_tiles_median_ape_percent`, `..._p90_...`, `b200_tiles_*`, `h200_tiles_*`, and `*_old_*`
  beside them: the same models on parts never fitted, XLA's measured bf16 GEMM tables
  (simulator/data/xla-gemm) and the project's H200 grid (simulator/data/h200-gemm), over the GEMMs
  above 10 us, and as `*_above_20us_*` over those above 20 us, where the XLA tables' fixed cost of
  about 5 us is a quarter of the time or less (`simulator.gemm_transfer`; bench/cost_model.py
  --transfer).
- `gpu_cross_check`: for every measured one-at-a-time GPU trace under traces/ (traces/gpu-h200:
  bench/gpu_capture.py's folders and the serving batch-1 capture), the trace predicted from its
  structure and the catalog part alone (`simulator.validation.cross_check`, nothing fitted to it)
  and `validate` on it (calibrated on half); empty where no GPU trace is shipped (the output says
  so).

Last line: one JSON object {"bench": "simulator", ...}.

    .venv/bin/python bench/simulator.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from profiler.host import usable_cores  # noqa: E402
from simulator.hardware import get_hardware  # noqa: E402
from simulator.models import get_model  # noqa: E402
from simulator.replay import ReplayConfig, replay  # noqa: E402
from simulator.sweep import sweep  # noqa: E402
from simulator.validation import validate  # noqa: E402
from simulator.workload import uniform  # noqa: E402


def measured_traces(device_type: str) -> list[Path]:
    """Measured one-at-a-time traces anywhere under traces/ (gpu_capture folders nest them: e.g.
    traces/gpu-h200/llama-3-8b/pasta) on `device_type`; not a gpu_capture's shipped-model
    references, not serving runs under load (those are checked against their batch-1 capture)."""
    out = []
    for meta in sorted((ROOT / "traces").rglob("meta.json")):
        m = json.loads(meta.read_text())
        if (
            m.get("kind") == "measured"
            and (m.get("device") or {}).get("type") == device_type
            and "reference" not in meta.relative_to(ROOT / "traces").parts
            and not m.get("serving")
        ):
            out.append(meta.parent)
    return out


def capture_here(tmp: Path, n: int) -> Path:
    out = tmp / "sequential-tiny4l"
    cmd = [
        sys.executable,
        "-m",
        "solm",
        "capture",
        "--system",
        "sequential",
        "--model",
        "tiny-4l",
        "--n",
        str(n),
        "--max-tokens",
        "48",
        "--repeats",
        "3",
        "--out",
        str(out),
        "--json",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return out


def recorded_runs(meta: dict) -> str:
    """How a trace chose the run it records of each request, in words."""
    n = int(meta.get("runs_per_request") or 1)
    if n == 1:
        return "one run per request"
    keep = str((meta.get("repeats") or {}).get("recorded", "")).split(" ")[1:2] or ["?"]
    return f"{'fastest' if keep[0] == 'min' else keep[0]} of {n} runs per request"


def mean_or_none(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def validation_figures(traces: list[Path]) -> tuple[list[dict], list[dict]]:
    """`validate` on each trace as recorded, and on its first run alone where it keeps every run."""
    from profiler.reader import read_trace
    from profiler.runs import read_runs, single_run

    checks, first_runs = [], []
    for t in traces:
        trace = read_trace(t)
        v = {**validate(trace), "recorded_runs": recorded_runs(trace.meta)}
        checks.append(v)
        line = (
            f"validate {v['trace']}: step MAPE {v['step_time_mape_percent']:.1f}%, request latency MAPE "
            f"{v['request_latency_mape_percent']:.1f}% ({v['check_requests']} held-out requests; {v['recorded_runs']})"
        )
        if read_runs(t) is not None:
            view, info = single_run(trace, 0)
            f = validate(view)
            first_runs.append(f)
            line += (
                f"; first run only: step {f['step_time_mape_percent']:.1f}%, request latency "
                f"{f['request_latency_mape_percent']:.1f}% ({info['requests']} requests)"
            )
        elif v["recorded_runs"] != "one run per request":
            line += "; first run only: n/a (the trace predates runs.parquet)"
        print(line)
    return checks, first_runs


def time_replay(rate: float, reps: int) -> float:
    w = uniform(1000, 100, 500)
    hw, model = get_hardware("h100-sxm"), get_model("llama-3-8b")
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        res = replay(w, hw, model, ReplayConfig(rate=rate, max_seqs=256))
        best = min(best, time.perf_counter() - t0)
    assert res.metrics["completed"] == 1000 and res.metrics["total_output_tokens"] == 500_000
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    reps = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        traces = measured_traces("cpu")
        source = "traces/"
        if not traces:
            traces, source = [capture_here(Path(tmp), 8 if args.quick else 16)], "captured here (no shipped CPU trace)"
        checks, first_runs = validation_figures(traces)
        speed = replay_and_sweep_times(traces[0], reps, Path(tmp))
    gpu = gpu_cross_checks()

    from simulator.calibrate import a100_op_errors

    ops = a100_op_errors()
    print("A100 held-out median APE per op family: " + ", ".join(f"{k} {v:.1f}%" for k, v in ops.items()))
    unseen = unseen_gemm_errors(thin=8 if args.quick else 2)
    print(
        json.dumps(
            {
                "bench": "simulator",
                "quick": args.quick,
                "validation_traces": [str(t) for t in traces],
                "validation_source": source,
                **validation_keys(checks, first_runs),
                **speed,
                "a100_op_mape_percent": ops,
                "a100_op_mape_percent_median": float(np.median(list(ops.values()))),
                **unseen,
                "gpu_cross_check": gpu,
            }
        )
    )


def validation_keys(checks: list[dict], first_runs: list[dict]) -> dict:
    """The JSON line's validation figures: mean MAPEs over the traces, as recorded and first run only."""
    return {
        "recorded_runs": sorted({v["recorded_runs"] for v in checks}),
        "request_latency_mape_percent": float(np.mean([v["request_latency_mape_percent"] for v in checks])),
        "step_time_mape_percent": float(np.mean([v["step_time_mape_percent"] for v in checks])),
        "request_latency_mape_percent_first_run": mean_or_none([v["request_latency_mape_percent"] for v in first_runs]),
        "step_time_mape_percent_first_run": mean_or_none([v["step_time_mape_percent"] for v in first_runs]),
        "first_run_traces": len(first_runs),
    }


def replay_and_sweep_times(trace: Path, reps: int, tmp: Path) -> dict:
    """Seconds to replay 1000 x 500 tokens (Poisson and all at once, fastest of `reps`) and to sweep
    1000 configurations of `trace` on every usable core (results under `tmp`); printed and returned."""
    replay_s = time_replay(20.0, reps)
    burst_s = time_replay(float("inf"), reps)
    print(f"replay 1000 x 500 tokens: {replay_s:.2f} s (Poisson 20 req/s), {burst_s:.2f} s (all at t=0)")

    workers = usable_cores()
    t0 = time.perf_counter()
    table = sweep(
        [str(trace)],
        hardware=["a100-80g", "h100-sxm", "h200", "l40s", "mi300x"],
        models=["llama-3-8b", "qwen3-4b", "gemma-7b", "llama-2-7b"],
        max_seqs=[1, 4, 16, 64, 256],
        rates=list(np.geomspace(0.5, 256, 10)),
        num_requests=32,
        workers=workers,
        out=tmp / "sweep",
    )
    sweep_s = time.perf_counter() - t0
    print(
        f"sweep of {len(table)} configurations on {workers} workers: {sweep_s:.1f} s "
        f"({int(table['pareto'].sum())} Pareto-optimal)"
    )
    return {
        "replay_1000x500_s": replay_s,
        "replay_1000x500_burst_s": burst_s,
        "sweep_1000_s": sweep_s,
        "sweep_configs": int(len(table)),
        "sweep_workers": workers,
    }


def gpu_cross_checks() -> list[dict]:
    """Each measured GPU trace in traces/ predicted from the catalog alone and calibrated on half
    (printed; none: one line saying so)."""
    from simulator.validation import cross_check

    gpu = []
    for t in measured_traces("cuda"):
        c, v = cross_check(t), validate(t)
        gpu.append(
            {
                "trace": str(t.relative_to(ROOT)),
                "hardware": c["hardware"],
                "system": c["system"],
                "uncalibrated_request_latency_mape_percent": c["request_latency_mape_percent"],
                "uncalibrated_step_time_mape_percent": c["step_time_mape_percent"],
                "calibrated_request_latency_mape_percent": v["request_latency_mape_percent"],
            }
        )
        print(
            f"GPU cross-check {gpu[-1]['trace']} on {c['hardware']}: predicted from the catalog alone, request "
            f"latency MAPE {c['request_latency_mape_percent']:.1f}% (step {c['step_time_mape_percent']:.1f}%); "
            f"calibrated on half, {v['request_latency_mape_percent']:.1f}%"
        )
    if not gpu:
        print("GPU cross-check: no measured GPU trace in traces/ yet (bench/gpu_capture.py on a GPU writes one)")
    return gpu


def unseen_gemm_errors(thin: int) -> dict[str, float | int]:
    """The GEMM cost model on A100 shapes no fold was fitted on (leave-one-model-out and
    leave-one-TP-degree-out, pooled), the old smooth model's error beside it: bench/cost_model.py's
    figures (that bench prints them per op family, token count and fold)."""
    from simulator.calibrate import load_vidur
    from simulator.gemm_fit import gemm_rows, holdout_predictions, repeat_spread_percent, summary, unseen_keys
    from simulator.gemm_transfer import TRANSFER_PARTS, calibration_keys, transfer_errors, transfer_keys

    table = load_vidur()
    report = summary(holdout_predictions(table, thin=thin))
    measured = transfer_keys(transfer_errors())
    calibrated = calibration_keys()
    repeat_median, repeat_p90, _ = repeat_spread_percent(gemm_rows(table))
    figures: dict[str, float | int] = {
        **unseen_keys(report),
        # the data's own spread: one GEMM timed in two profiles, max / min - 1
        "a100_repeat_median_percent": round(repeat_median, 2),
        "a100_repeat_p90_percent": round(repeat_p90, 2),
        "gemm_fit_every_nth_token_count": thin,
        **measured,
        **calibrated,
    }
    names = {"h100-sxm": "H100", "b200": "B200", "h200": "H200"}

    def per_part(keys: dict, what: str) -> str:  # "H100 4.86% / 14.02%, B200 ..." over TRANSFER_PARTS
        return ", ".join(
            f"{names.get(part, part)} {keys[f'{key}_{what}_median_ape_percent']}% / {keys[f'{key}_{what}_p90_ape_percent']}%"
            for part, key in ((part, part.replace("-", "_")) for part in TRANSFER_PARTS)
        )

    print(
        "The same tables used the other way, the tile model calibrated on each part's own GEMMs (solm calibrate) "
        f"and scored on held-out (K, N) shapes, median / p90 APE over every GEMM: {per_part(calibrated, 'calibrated_heldout')} "
        f"(the A100 fit carried: {per_part(calibrated, 'carried_heldout')})"
    )
    print(
        "GEMMs above 10 us on parts never fitted (XLA's H100 SXM and B200 tables, the project's H200 grid), tile model "
        f"median / p90 APE: {per_part(measured, 'tiles')} (old model {per_part(measured, 'old')})"
    )
    print(
        f"A100 GEMMs on unseen shapes (tile model fitted on every {thin}th token count): median "
        f"{figures['a100_unseen_median_ape_percent']}%, p90 {figures['a100_unseen_p90_ape_percent']}% "
        f"(old model {figures['old_model_unseen_median_ape_percent']}%, {figures['old_model_unseen_p90_ape_percent']}%)"
    )
    return figures


if __name__ == "__main__":
    main()
