"""SLOs and cost of a simulated run: goodput, GPU count, GPU-hours, cost per million output tokens.

Goodput (DistServe, Zhong et al., OSDI '24): completed requests per second whose TTFT and TPOT
both meet their objectives (an objective not given is met by every request; a one-token request
has no TPOT and meets that objective), over the run's duration. GPU-hours: every GPU of the
deployment held for the whole run (first arrival to last finish), as a rented node is billed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def goodput(requests: pd.DataFrame, duration_s: float, slo_ttft_ms: float | None = None,
            slo_tpot_ms: float | None = None) -> dict:
    """{goodput_rps, slo_attained_percent} from the per-request table (`ReplayResult.requests`)."""
    ok = (requests["status"] != "error").to_numpy()
    ttft_ms = requests["ttft_s"].to_numpy(float) * 1e3
    tpot_ms = requests["tpot_s"].to_numpy(float) * 1e3
    good = ok & ~np.isnan(ttft_ms)
    if slo_ttft_ms is not None:
        good &= ttft_ms <= slo_ttft_ms
    if slo_tpot_ms is not None:
        good &= np.isnan(tpot_ms) | (tpot_ms <= slo_tpot_ms)
    n = len(requests)
    return {"slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms,
            "goodput_rps": float(good.sum() / duration_s) if duration_s > 0 else None,
            "slo_attained_percent": float(100 * good.sum() / n) if n else None}


def cost_figures(gpus: int, duration_s: float, output_tokens: int, price_per_gpu_hour: float | None) -> dict:
    """{gpus, gpu_hours, cost_usd, cost_per_million_output_tokens} (cost: None without a price)."""
    gpu_hours = gpus * duration_s / 3600.0
    cost = None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour
    per_million = None if cost is None or not output_tokens else cost / output_tokens * 1e6
    return {"gpus": int(gpus), "gpu_hours": gpu_hours, "price_per_gpu_hour": price_per_gpu_hour,
            "cost_usd": cost, "cost_per_million_output_tokens": per_million}


def check_slo(value: float | None, flag: str) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{flag} must be a positive number of milliseconds, got {value!r}")
