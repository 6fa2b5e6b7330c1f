"""Frames of the Load page: latency against throughput, one point per serving run (pure pandas).

What: a serving trace (`solm capture --rate R | --concurrency C`; its meta names the load) is one
point per system: its median and p99 TTFT, TPOT and E2E against its request and output
throughput. Simulated points come from (a) simulated traces in the folders that were replayed
under a load (Poisson or closed loop) and (b) `simulator.load_validation`: each measured serving
trace predicted from a batch-1 trace of the same system and model found in the folders, at its own
arrivals or, for a what-if, at another rate. Definitions as vLLM's benchmark (simulator/simtrace.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.reader import Trace

COLUMNS = (
    "system",
    "kind",
    "load",
    "request_throughput",
    "output_throughput",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "e2e_ms_p50",
    "e2e_ms_p99",
    "trace",
    "path",
)


def serving_level(meta: dict) -> tuple[float | None, int | None]:
    """(rate, concurrency) a run was loaded with; (None, None) for a one-at-a-time capture."""
    knobs = {**(meta.get("knobs") or {}), **(meta.get("serving") or {})}
    sim = (meta.get("simulation") or {}).get("batch") or {}
    rate = knobs.get("rate", sim.get("rate"))
    conc = knobs.get("concurrency", sim.get("concurrency"))
    return (float(rate) if rate is not None else None), (int(conc) if conc is not None else None)


def is_serving(trace: Trace) -> bool:
    return serving_level(trace.meta) != (None, None)


def load_label(rate: float | None, concurrency: int | None) -> str:
    return f"rate {rate:g}/s" if rate is not None else f"{concurrency} clients" if concurrency is not None else "trace"


def point(trace: Trace, kind: str) -> dict:
    """One Load-page point from a trace's requests table."""
    r = trace.requests
    ok = r[r["status"] != "error"]
    arrival, ttft, e2e = (ok[c].to_numpy(float) for c in ("arrival_s", "ttft_s", "e2e_s"))
    out = ok["output_tokens"].to_numpy(float)
    multi = out > 1
    tpot = (e2e[multi] - ttft[multi]) / (out[multi] - 1)
    duration = float(np.nanmax(arrival + e2e) - np.nanmin(arrival)) if len(ok) else 0.0
    pct = lambda v, q: float(np.nanpercentile(v, q) * 1e3) if len(v) else None  # noqa: E731
    rate, conc = serving_level(trace.meta)
    return {
        "system": trace.system,
        "kind": kind,
        "load": load_label(rate, conc),
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": out.sum() / duration if duration > 0 else None,
        "ttft_ms_p50": pct(ttft, 50),
        "ttft_ms_p99": pct(ttft, 99),
        "tpot_ms_p50": pct(tpot, 50),
        "e2e_ms_p50": pct(e2e, 50),
        "e2e_ms_p99": pct(e2e, 99),
        "trace": trace.name,
        "path": str(trace.path),
    }


def load_points(traces: list[Trace]) -> pd.DataFrame:
    """Measured serving runs and simulated traces replayed under load, one row each."""
    rows = [point(t, "measured" if t.kind == "measured" else "simulated trace") for t in traces if is_serving(t)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def calibration_groups(traces: list[Trace]) -> list[tuple[str, list[str]]]:
    """(batch-1 trace, its system's measured serving traces) for every system that has both."""

    def key(t: Trace) -> tuple:
        return t.system, (t.meta.get("model") or {}).get("name")

    serving: dict[tuple, list[str]] = {}
    for t in traces:
        if t.kind == "measured" and is_serving(t):
            serving.setdefault(key(t), []).append(str(t.path))
    out = []
    for t in traces:
        if t.kind == "measured" and not is_serving(t) and key(t) in serving:
            out.append((str(t.path), sorted(serving.pop(key(t)))))
    return out


def predicted_points(result: dict, kind: str = "simulated (batch-1 calibration)") -> pd.DataFrame:
    """Simulated points of a `validate_load` result (one per load level)."""
    rows = []
    for lv in result["levels"]:
        s = lv["simulated"]
        rows.append(
            {
                "system": lv["system"],
                "kind": kind,
                "load": load_label(lv["rate"], lv["concurrency"]),
                "request_throughput": s["request_throughput"],
                "output_throughput": s["output_throughput"],
                "ttft_ms_p50": s["ttft_p50_ms"],
                "ttft_ms_p99": s["ttft_p99_ms"],
                "tpot_ms_p50": s["tpot_p50_ms"],
                "e2e_ms_p50": s["e2e_p50_ms"],
                "e2e_ms_p99": s["e2e_p99_ms"],
                "trace": lv["trace"].split("/")[-1],
                "path": lv["trace"],
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))
