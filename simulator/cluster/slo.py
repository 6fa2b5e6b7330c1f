"""Cost of a simulated deployment: GPU count, GPU-hours, cost per million output tokens (goodput
under SLOs is `simulator.slo.goodput`, shared with the single-device replay). GPU-hours: every GPU of the
deployment held for the whole run (first arrival to last finish), as a rented node is billed.
"""

from __future__ import annotations


def cost_figures(gpus: int, duration_s: float, output_tokens: int, price_per_gpu_hour: float | None) -> dict:
    """{gpus, gpu_hours, cost_usd, cost_per_million_output_tokens} (cost: None without a price)."""
    gpu_hours = gpus * duration_s / 3600.0
    cost = None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour
    per_million = None if cost is None or not output_tokens else cost / output_tokens * 1e6
    return {
        "gpus": int(gpus),
        "gpu_hours": gpu_hours,
        "price_per_gpu_hour": price_per_gpu_hour,
        "cost_usd": cost,
        "cost_per_million_output_tokens": per_million,
    }
