"""Figures of a trace, as `solm inspect` prints them. Pure pandas over a read `Trace`."""

from __future__ import annotations

import math

from profiler.reader import Trace
from profiler.stats import geomean


def _f(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def summarize(trace: Trace) -> dict:
    req, steps = trace.requests, trace.steps
    ok = req[req["status"] != "error"]
    out_tokens = int(req["output_tokens"].sum())
    wall = float(ok["e2e_s"].sum())
    q = req["quality_score"].dropna()
    model = trace.meta.get("model", {})
    device = trace.meta.get("device", {})
    return {
        "trace": str(trace.path),
        "kind": trace.kind,
        "system": trace.system,
        "task": trace.meta.get("task"),
        "model": model.get("name") if isinstance(model, dict) else model,
        "device": device.get("name") if isinstance(device, dict) else device,
        "complete": trace.complete,
        "requests": int(len(req)),
        "errors": int((req["status"] == "error").sum()),
        "output_tokens": out_tokens,
        "steps": int(len(steps)),
        "quality_mean": _f(q.mean()) if len(q) else None,
        "tokens_per_s": _f(out_tokens / wall) if wall > 0 else None,
        "ttft_s_p50": _f(ok["ttft_s"].median()) if len(ok) else None,
        "e2e_s_mean": _f(ok["e2e_s"].mean()) if len(ok) else None,
        "e2e_s_p50": _f(ok["e2e_s"].median()) if len(ok) else None,
        "e2e_s_p99": _f(ok["e2e_s"].quantile(0.99)) if len(ok) else None,
        "theoretical_speedup_geomean": _f(geomean(req["theoretical_speedup"])),
        "peak_kv_tokens": int(req["peak_live_kv_tokens"].max()) if len(req) else 0,
        "peak_kv_bytes": int(req["peak_kv_bytes"].max()) if len(req) else 0,
        "mean_live_kv_tokens": _f(steps["live_kv_tokens"].mean()) if len(steps) else None,
        "nvml": bool(trace.meta.get("nvml", False)),
    }


def attention_strategy(meta: dict) -> str:
    """How a measured trace's masked attention ran (`meta.device.sdpa`, runtime/attention.py);
    traces captured before it was recorded ran PyTorch's own choice (`auto`)."""
    device = meta.get("device")
    return str((device.get("sdpa") if isinstance(device, dict) else None) or "auto")
