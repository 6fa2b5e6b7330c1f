"""SLOs and cost of a simulated run: goodput, GPU count, GPU-hours, cost per million output tokens.

Goodput (DistServe, Zhong et al., OSDI '24; `vllm bench serve --goodput`): completed requests per
second whose TTFT and TPOT both meet the objectives given (a one-token request has TPOT 0), over
the run's duration; None when no objective is given. GPU-hours: every GPU of the
deployment held for the whole run (first arrival to last finish), as a rented node is billed.
"""

from __future__ import annotations

import math

import numpy as np

from profiler.errors import UsageError


def goodput(ttft_s, tpot_s, ok, duration_s: float, slo_ttft_ms: float | None = None,
            slo_tpot_ms: float | None = None) -> dict:
    """{request_goodput, slo_attained_percent, slo_ttft_ms, slo_tpot_ms}; None without an objective.

    The same signature and keys as serve-sched's `simulator/slo.py`, which replaces this function
    once it is on main (one count of goodput for measured and simulated runs)."""
    if slo_ttft_ms is None and slo_tpot_ms is None:
        return {"request_goodput": None, "slo_attained_percent": None, "slo_ttft_ms": None, "slo_tpot_ms": None}
    good = np.asarray(ok, bool).copy()
    if slo_ttft_ms is not None:
        good &= np.nan_to_num(np.asarray(ttft_s, float), nan=np.inf) * 1e3 <= slo_ttft_ms
    if slo_tpot_ms is not None:
        good &= np.nan_to_num(np.asarray(tpot_s, float), nan=0.0) * 1e3 <= slo_tpot_ms  # one token: TPOT 0
    n = int(good.sum())
    return {"request_goodput": n / duration_s if duration_s > 0 else None,
            "slo_attained_percent": 100.0 * n / len(good) if len(good) else None,
            "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms}


def cost_figures(gpus: int, duration_s: float, output_tokens: int, price_per_gpu_hour: float | None) -> dict:
    """{gpus, gpu_hours, cost_usd, cost_per_million_output_tokens} (cost: None without a price)."""
    gpu_hours = gpus * duration_s / 3600.0
    cost = None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour
    per_million = None if cost is None or not output_tokens else cost / output_tokens * 1e6
    return {"gpus": int(gpus), "gpu_hours": gpu_hours, "price_per_gpu_hour": price_per_gpu_hour,
            "cost_usd": cost, "cost_per_million_output_tokens": per_million}


def check_slo(value: float | None, flag: str) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise UsageError(f"{flag} must be a positive number of milliseconds, got {value!r}")
