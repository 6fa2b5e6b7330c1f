"""Goodput: requests per second that met their latency objectives (SLOs).

What: as `vllm bench serve --goodput ttft:MS tpot:MS` (DistServe, OSDI '24): a request is good
when it completed and every objective given holds: TTFT <= `slo_ttft_ms` and TPOT <= `slo_tpot_ms`
(a one-token request has TPOT 0, as vLLM counts it). Goodput = good requests / the run's duration
(first arrival at t = 0 to the last finish, the same duration as every throughput). No objective
given: goodput is not computed (None), never a default that would read as a measurement.

One function for measured and simulated runs, so `bench/serving.py` and `solm simulate` count
alike.
"""

from __future__ import annotations

import numpy as np

from profiler.errors import UsageError


def check_slo(slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> None:
    for name, v in (("slo-ttft-ms", slo_ttft_ms), ("slo-tpot-ms", slo_tpot_ms)):
        if v is not None and not (v > 0):  # also refuses NaN
            raise UsageError(f"{name} must be > 0 ms, got {v!r}")


def goodput(
    ttft_s, tpot_s, ok, duration_s: float, slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None
) -> dict:
    """{"request_goodput": good req/s or None, "slo_attained_percent": share of all requests that were good}."""
    check_slo(slo_ttft_ms, slo_tpot_ms)
    if slo_ttft_ms is None and slo_tpot_ms is None:
        return {"request_goodput": None, "slo_attained_percent": None, "slo_ttft_ms": None, "slo_tpot_ms": None}
    ok = np.asarray(ok, bool)
    good = ok.copy()
    if slo_ttft_ms is not None:
        good &= np.nan_to_num(np.asarray(ttft_s, float), nan=np.inf) * 1e3 <= slo_ttft_ms
    if slo_tpot_ms is not None:
        good &= np.nan_to_num(np.asarray(tpot_s, float), nan=0.0) * 1e3 <= slo_tpot_ms  # one token: TPOT 0
    n = int(good.sum())
    return {
        "request_goodput": n / duration_s if duration_s > 0 else None,
        "slo_attained_percent": 100.0 * n / len(ok) if len(ok) else None,
        "slo_ttft_ms": slo_ttft_ms,
        "slo_tpot_ms": slo_tpot_ms,
    }
