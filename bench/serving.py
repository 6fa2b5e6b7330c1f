"""Serving benchmark: sequential, PASTA and TIP under load, measured against the simulator's
prediction from a batch-1 calibration.

What: for each system, (1) a batch-1 calibration trace on the dev (train) split (by default through
the serving runtime at concurrency 1, `--calibration server`, with the rows sweep the capture
records beside it, `--rows-sweep`: how the runtime's forward grows with 1-32 rows over pools of
64-1024 slots; `--no-rows-sweep` calibrates without it; `--calibration engine`: one-at-a-time
capture through the engine alone); (2) its capacity,
measured as the request throughput of the dev split all arriving at once under the bench's batch
settings; (3) on the test split, Poisson loads at 25%, 60% and 90% of that capacity plus one
overload point (150%, in a KV pool small enough that requests are preempted), every load run
repeated `--repeats` times (default 3), runs interleaved across systems and loads in a rotated
order. Each run is captured by `solm capture --rate R` (the batched runtime, one shared KV pool)
and predicted by `simulator.load_validation` from the batch-1 trace alone, with the run's own
arrivals and batch settings: nothing is tuned per point. TIP runs twice in the same pool (512
tokens), with its learned eviction and dense (`--knob policy=full`), the latter at TIP's 90% and
overload rates. Printed side by side: measured (median over
repeats, and the min-max spread) vs simulated median/p99 TTFT and E2E, throughput, goodput under
the SLO (TTFT <= 5x and TPOT <= 2x the batch-1 run's medians, each system its own), preemptions;
PASTA vs sequential speedup (median E2E ratio) and throughput as load rises; TIP vs dense.
`batched_equals_alone`: every request of a run without preemptions has the text of the same
request run alone (the batch-1 capture of the test split), greedy.

Where the runtime cannot capture under load (no `solm capture --rate` in this checkout), the bench
still runs the simulator side: capacity and every load point are simulated (the test split's
batch-1 trace replayed at Poisson rates, one seed per repeat), measured figures are null and
`missing` says what is absent.

`pass_time_ratio_by_batch`: per system and batch size, measured / predicted pass time over every
load run (p10, median): flat when the simulator knows how a pass grows with the batch, whatever
the machine's load does to the level.
`pass_breakdown_by_batch`: the same passes split into the forward (`steps.forward_s`), the
requests' host work and the server's own work, measured beside predicted, and the forward of the
passes that carry a prefill apart; `forward_fit_on_rows_sweep`: how each calibration's forward
predicts the rows sweep it was fitted on. `--forward-fit` picks how the calibration costs the
forward (default: on the part the calibration ran on, the rows sweep's grid or a line through
its passes, `simulator.measured_forward`).

    .venv/bin/python bench/serving.py [--quick] [--repeats 3] [--n 24] [--work DIR] [--calibration server|engine] [--calibrate-once] [--no-rows-sweep] [--idle-sweep] [--forward-fit auto|sweep|line|roofline]

`--work DIR` keeps every capture in DIR and reuses the ones already there: the same measurements
re-predicted by another simulator (run it again with the same flags).

Last line: one JSON object {"bench": "serving", ...} (keys in the issue's Targets).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from profiler.reader import read_trace  # noqa: E402
from simulator.load_calibration import FORWARD_FITS, calibrate_batch1, sweep_passes  # noqa: E402
from simulator.load_validation import (  # noqa: E402
    pass_breakdown,
    pass_time_ratios,
    serving_config,
    summarize_run,
    validate_one,
)
from simulator.models import ModelSpec  # noqa: E402
from simulator.replay import replay  # noqa: E402
from simulator.validation import trace_hardware  # noqa: E402
from simulator.workload import from_trace  # noqa: E402

SYSTEMS = {  # name -> capture arguments; sequential runs PASTA's task with PASTA's sequential baseline model
    "sequential": ["--system", "sequential", "--model", "pasta-sequential", "--task", "word_facts"],
    "pasta": ["--system", "pasta", "--task", "word_facts"],
    "tip": ["--system", "tip"],
    "tip-dense": ["--system", "tip", "--knob", "policy=full"],
}
CAPACITY_OF = {"tip-dense": "tip"}  # dense TIP runs at TIP's rates: the same load into the same pool
ONLY_AT = {"tip-dense": (0.9, 1.5)}  # dense TIP only where the pool binds (the comparison's points)
LOADS = (0.25, 0.6, 0.9, 1.5)  # fractions of measured capacity; the last is the overload point
LOW, HIGH = (0.25, 0.6), 0.9
MAX_SEQS, MAX_BATCH_TOKENS, POOL_TOKENS, MAX_TOKENS = 8, 512, 512, 128
# the batch-1 calibration through the server: a closed loop of one client (one request at a time), the
# load runs' batch settings, a pool no request of these models can fill (so never a preemption)
CALIBRATION_SERVER = [
    "--concurrency", "1", "--max-seqs", str(MAX_SEQS), "--max-batch-tokens", str(MAX_BATCH_TOKENS),
    "--chunked-prefill", "--kv-budget-mib", "64", "--rows-sweep",
]  # fmt: skip
SLO_TTFT_X, SLO_TPOT_X = 5.0, 2.0
MIB = 1 << 20


def solm(argv: list[str]) -> None:
    """Run `solm ARGV` in this process (no interpreter start per run); RuntimeError on failure."""
    from solm.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    if rc != 0:
        raise RuntimeError(f"solm {' '.join(argv)} failed ({rc}): {err.getvalue().strip()[-400:]}")


def load_capture_available() -> bool:
    """Whether `solm capture` can load the runtime with a rate (the batched serving runtime)."""
    import argparse as ap

    from solm.commands import capture

    sub = ap.ArgumentParser().add_subparsers()
    capture.add_parser(sub)
    return "--rate" in sub.choices["capture"]._option_string_actions


def batch_args(kv_budget_mib: float) -> list[str]:
    return [
        "--max-seqs",
        str(MAX_SEQS),
        "--max-batch-tokens",
        str(MAX_BATCH_TOKENS),
        "--kv-budget-mib",
        f"{kv_budget_mib:.6f}",
        "--chunked-prefill",
    ]


def _complete(out: Path) -> bool:
    try:
        return bool(json.loads((out / "meta.json").read_text()).get("complete"))
    except (OSError, ValueError):
        return False


def capture(name: str, out: Path, split: str, n: int, extra: list[str] = ()) -> Path:
    """`solm capture` into OUT; a complete trace already at OUT is reused (`--work`: re-predict saved runs)."""
    if _complete(out):
        return out
    solm(
        [
            "capture",
            *SYSTEMS[name],
            "--split",
            split,
            "--n",
            str(n),
            "--max-tokens",
            str(MAX_TOKENS),
            "--threads",
            "1",
            *extra,
            "--out",
            str(out),
            "--force",
            "--json",
        ]
    )
    return out


def slo_of(batch1) -> dict:
    """Each system's SLO: TTFT <= 5x and TPOT <= 2x the medians of its own batch-1 run."""
    s = summarize_run(
        batch1.requests["arrival_s"],
        batch1.requests["ttft_s"],
        batch1.requests["e2e_s"],
        batch1.requests["output_tokens"],
    )
    return {"slo_ttft_ms": SLO_TTFT_X * s["ttft_p50_ms"], "slo_tpot_ms": SLO_TPOT_X * s["tpot_p50_ms"]}


def _med(values: list) -> float | None:
    v = [x for x in values if x is not None and x == x]
    return float(np.median(v)) if v else None


def _spread(values: list) -> list | None:
    v = [x for x in values if x is not None and x == x]
    return [float(min(v)), float(max(v))] if v else None


# ---- the two modes ----------------------------------------------------------------------------
class Setup:
    """Per system: calibration (dev), the test split's batch-1 trace, cost, hardware, model, SLO, pool."""

    def __init__(
        self,
        name: str,
        work: Path,
        n_cal: int,
        n: int,
        calibration: str = "server",
        rows_sweep: bool = True,
        forward_fit: str = "auto",
        idle_sweep: bool = False,
    ) -> None:
        self.name = name
        self.work, self.n, self.n_cal, self.calibration, self.rows_sweep = work, n, n_cal, calibration, rows_sweep
        self.forward_fit, self.idle_sweep = forward_fit, idle_sweep
        self.cal = self.calibration_trace(0)
        self.alone = read_trace(capture(name, work / f"{name}-alone", "test", n))
        self._alone = {0: self.alone}
        self.ratios: list[np.ndarray] = []  # per load run: (requests in a pass, measured / predicted pass time)
        self.breakdowns: list[np.ndarray] = []  # per load run: `pass_breakdown` rows
        self.model = ModelSpec.from_trace_meta(self.cal.meta)
        self.hw = trace_hardware(self.cal.meta)
        self.cost = calibrate_batch1(self.cal, self.hw, self.model, rows_sweep, forward_fit, idle_sweep)
        self.costs = {0: self.cost}  # per repeat: the calibration captured just before its load runs
        self.sweep_passes = len(sweep_passes(self.cal.meta)) if rows_sweep else 0
        self.slo = slo_of(self.cal)
        self.kv_budget_mib = POOL_TOKENS * self.model.kv_bytes_per_token / MIB

    def calibration_trace(self, rep: int):
        """Repeat `rep`'s batch-1 calibration on the train split: through the serving runtime at
        concurrency 1 (its own host path), or the engine alone (`solm capture` without a load)."""
        suffix = f"-r{rep}" if rep else ""
        if self.calibration == "server":
            out = self.work / f"{self.name}-cal-server{suffix}"
            return read_trace(capture(self.name, out, "train", self.n_cal, CALIBRATION_SERVER))
        return read_trace(capture(self.name, self.work / f"{self.name}-cal{suffix}", "train", self.n_cal))

    def recalibrate(self, rep: int) -> None:
        """Capture and fit repeat `rep`'s own calibration (the first repeat's is the setup's)."""
        if rep not in self.costs:
            self.costs[rep] = calibrate_batch1(
                self.calibration_trace(rep), self.hw, self.model, self.rows_sweep, self.forward_fit, self.idle_sweep
            )

    def cost_for(self, rep: int):
        return self.costs.get(rep, self.cost)

    def alone_for(self, seed: int):
        """The test split's requests of load run `seed` (its seed picks them) run one at a time."""
        if seed not in self._alone:
            out = self.work / f"{self.name}-alone-s{seed}"
            self._alone[seed] = read_trace(capture(self.name, out, "test", self.n, ["--seed", str(seed)]))
        return self._alone[seed]

    def config(self, rate: float | None, seed: int = 0):
        knobs = {
            "max_seqs": MAX_SEQS,
            "max_batch_tokens": MAX_BATCH_TOKENS,
            "chunked_prefill": True,
            "page_size": 16,
            "kv_budget_mib": self.kv_budget_mib,
        }
        return serving_config({"knobs": knobs}, self.model, rate=rate, seed=seed, **self.slo)

    def simulate(self, trace, rate: float | None, seed: int = 0) -> dict:
        """The trace's requests replayed at a Poisson rate (inf: all at once) under the bench's settings."""
        w = from_trace(trace)
        import dataclasses

        w = dataclasses.replace(w, logit_tokens=w.query_tokens.copy())
        res = replay(w, self.hw, self.model, self.config(rate, seed), cost=self.cost)
        r = res.requests
        return {
            **summarize_run(r["arrival_s"], r["ttft_s"], r["e2e_s"], r["output_tokens"], **self.slo),
            "preemptions": int(res.metrics["preemptions"]),
        }


def measured_run(setup: Setup, out: Path, rate: float, seed: int, n: int) -> dict:
    trace = read_trace(
        capture(
            setup.name, out, "test", n, ["--rate", f"{rate:.6g}", "--seed", str(seed), *batch_args(setup.kv_budget_mib)]
        )
    )
    cost = setup.cost_for(seed)  # repeat `seed`'s own calibration
    lv = validate_one(trace, cost, setup.hw, setup.model, **setup.slo)
    same = texts_equal(trace, setup.alone_for(seed)) if lv["preemptions_measured"] == 0 else None
    setup.ratios.append(pass_time_ratios(trace, cost))
    setup.breakdowns.append(pass_breakdown(trace, cost))
    return {
        "measured": {**lv["measured"], "preemptions": lv["preemptions_measured"]},
        "simulated": {**lv["simulated"], "preemptions": lv["preemptions_simulated"]},
        "equal_alone": same,
        "trace": str(trace.path),
    }


def texts_equal(trace, alone) -> bool | None:
    """Whether every request of `trace` has the text it has in `alone`; None when they share no prompt."""
    a = trace.requests.set_index("prompt")["output_text"]
    b = alone.requests.set_index("prompt")["output_text"]
    common = a.index.intersection(b.index)
    return bool((a.loc[common] == b.loc[common]).all()) if len(common) else None


def measured_capacity(setup: Setup, work: Path, n: int) -> float:
    trace = read_trace(
        capture(
            setup.name, work / f"{setup.name}-capacity", "train", n, ["--rate", "inf", *batch_args(setup.kv_budget_mib)]
        )
    )
    r = trace.requests
    return summarize_run(
        r["arrival_s"], r["ttft_s"], np.where(r["status"] != "error", r["e2e_s"], np.nan), r["output_tokens"]
    )["request_throughput"]


# ---- the run ----------------------------------------------------------------------------------
def run_loads(
    setups: dict[str, Setup],
    capacity: dict[str, float],
    measured: bool,
    repeats: int,
    n: int,
    work: Path,
    calibrate_once: bool = False,
) -> dict:
    """(system, load) -> list of per-repeat {measured, simulated}; interleaved, order rotated per repeat;
    each repeat after the first starts with every system's own calibration (unless `calibrate_once`)."""
    cells = [(name, load) for load in LOADS for name in setups if load in ONLY_AT.get(name, LOADS)]
    runs: dict = {}
    for rep in range(repeats):
        if measured and not calibrate_once:
            for s in setups.values():
                s.recalibrate(rep)
        k = rep % len(cells)
        for name, load in cells[k:] + cells[:k]:
            rate = load * capacity[CAPACITY_OF.get(name, name)]
            s = setups[name]
            if measured:
                r = measured_run(s, work / f"{name}-{load}-{rep}", rate, rep, n)
            else:
                r = {"measured": None, "simulated": s.simulate(s.alone, rate, seed=rep), "equal_alone": None}
            runs.setdefault((name, load), []).append({**r, "rate": rate})
    return runs


def aggregate(runs: dict) -> list[dict]:
    keys = (
        "ttft_p50_ms",
        "ttft_p99_ms",
        "e2e_p50_ms",
        "e2e_p99_ms",
        "tpot_p50_ms",
        "output_throughput",
        "request_throughput",
        "request_goodput",
        "preemptions",
    )
    rows = []
    for (name, load), rs in runs.items():
        row = {"system": name, "load": load, "rate": _med([r["rate"] for r in rs]), "repeats": len(rs)}
        for side in ("measured", "simulated"):
            got = [r[side] for r in rs if r[side] is not None]
            row[side] = {k: _med([g.get(k) for g in got]) for k in keys} if got else None
            if got:
                row[side]["spread"] = {
                    k: _spread([g.get(k) for g in got]) for k in ("e2e_p50_ms", "ttft_p50_ms", "output_throughput")
                }
        row["equal_alone"] = [r["equal_alone"] for r in rs]
        rows.append(row)
    return sorted(rows, key=lambda r: (r["system"], r["load"]))


def mape(rows: list[dict], loads, key: str) -> float | None:
    apes = [
        abs(r["simulated"][key] / r["measured"][key] - 1) * 100
        for r in rows
        if r["load"] in loads
        and r["system"] != "tip-dense"
        and r["measured"]
        and r["measured"].get(key)
        and r["simulated"].get(key) is not None
    ]
    return float(np.mean(apes)) if apes else None


def comparisons(rows: list[dict]) -> tuple[list, dict]:
    by = {(r["system"], r["load"]): r for r in rows}
    side = "measured" if rows and rows[0]["measured"] else "simulated"
    speed = []
    for load in LOADS:
        s, p = by.get(("sequential", load)), by.get(("pasta", load))
        if s and p:
            speed.append(
                {
                    "load": load,
                    "source": side,
                    "speedup": s[side]["e2e_p50_ms"] / p[side]["e2e_p50_ms"],
                    "simulated_speedup": s["simulated"]["e2e_p50_ms"] / p["simulated"]["e2e_p50_ms"],
                    "sequential_req_per_s": s[side]["request_throughput"],
                    "pasta_req_per_s": p[side]["request_throughput"],
                }
            )
    t, d = by.get(("tip", LOADS[-1])), by.get(("tip-dense", LOADS[-1]))
    tip = {}
    if t and d:
        tip = {
            "source": side,
            "load": LOADS[-1],
            "ratio": t[side]["output_throughput"] / d[side]["output_throughput"],
            "simulated_ratio": t["simulated"]["output_throughput"] / d["simulated"]["output_throughput"],
            "tip_preemptions": t[side]["preemptions"],
            "dense_preemptions": d[side]["preemptions"],
        }
    return speed, tip


def _by_requests(runs: list[np.ndarray], width: int, summarise) -> dict:
    """Rows of every load run (first column: requests in the pass) grouped by that column, each
    group of at least 10 passes summarised as `summarise(rows)` plus its count."""
    r = np.vstack(runs) if runs else np.zeros((0, width))
    return {
        int(n): {"passes": int(m.sum()), **summarise(r[m])}
        for n in np.unique(r[:, 0])
        if (m := r[:, 0] == n).sum() >= 10
    }


def ratios_by_batch(setups: dict) -> dict:
    """Per system, by requests in a pass: p10 and median of measured / predicted pass time over every
    load run (`pass_time_ratios`). A flat row: the simulator knows how a pass grows with the batch."""
    return {
        name: _by_requests(
            s.ratios, 2, lambda r: {"p10": float(np.percentile(r[:, 1], 10)), "median": float(np.median(r[:, 1]))}
        )
        for name, s in setups.items()
    }


def breakdown_by_batch(setups: dict) -> dict:
    """Per system, by requests in a pass, over every load run that times the forward alone
    (`pass_breakdown`): the median measured / predicted forward, and the medians of the requests'
    host work and of the server's own work per pass, measured and predicted (us)."""

    def summarise(b: np.ndarray) -> dict:
        multi = b[:, 7] > 0
        return {
            "forward_ratio": float(np.median(b[:, 1] / b[:, 2])),
            "multi_row_passes": int(multi.sum()),
            "multi_row_forward_ratio": float(np.median(b[multi, 1] / b[multi, 2])) if multi.sum() >= 3 else None,
            "host_us": [float(np.median(b[:, 3]) * 1e6), float(np.median(b[:, 4]) * 1e6)],
            "server_us": [float(np.median(b[:, 5]) * 1e6), float(np.median(b[:, 6]) * 1e6)],
        }

    return {name: _by_requests(s.breakdowns, 8, summarise) for name, s in setups.items()}


def sweep_fit(setups: dict) -> dict:
    """Per system, how its (first) calibration's forward predicts the rows sweep it was fitted on:
    measured / predicted, median and [min, max] over the sweep's shapes, and at one row."""
    out = {}
    for name, s in setups.items():
        sw = sweep_passes(s.cal.meta)
        if not len(sw):
            continue
        r = sw[:, 2] / np.asarray(s.cost.forward_s(sw[:, 0], sw[:, 1], sw[:, 3]), float)
        one = sw[:, 0] == 1
        out[name] = {
            "median": float(np.median(r)),
            "range": [float(r.min()), float(r.max())],
            "one_row_median": float(np.median(r[one])) if one.any() else None,
        }
    return out


def print_breakdown(by: dict, fit: dict) -> None:
    if fit:
        print("the calibration's forward on its own rows sweep, measured / predicted: median [min, max], at 1 row:")
        for name, v in fit.items():
            print(
                f"  {name:10s} {v['median']:.2f} [{v['range'][0]:.2f}, {v['range'][1]:.2f}], {v['one_row_median']:.2f}"
            )
    if any(by.values()):
        print("by requests in the pass (median over every load run): forward measured / predicted;")
        print("  requests' host work and the server's own work per pass, measured/predicted us:")
        for name, rows in by.items():
            cells = [
                f"{n}: {v['forward_ratio']:.2f} {v['host_us'][0]:.0f}/{v['host_us'][1]:.0f} "
                f"{v['server_us'][0]:.0f}/{v['server_us'][1]:.0f}"
                for n, v in rows.items()
            ]
            print(f"  {name:10s} " + "  ".join(cells))
        print(
            "forward measured / predicted of the passes with a multi-row stream (a prefill), by requests in the pass:"
        )
        for name, rows in by.items():
            cells = [
                f"{n}: {v['multi_row_forward_ratio']:.2f}" for n, v in rows.items() if v["multi_row_forward_ratio"]
            ]
            print(f"  {name:10s} " + "  ".join(cells))


def print_ratios(ratios: dict) -> None:
    print("measured / predicted pass time by requests in the pass (p10 / median over every load run):")
    for name, by in ratios.items():
        print(f"  {name:10s} " + "  ".join(f"{n}: {v['p10']:.2f}/{v['median']:.2f}" for n, v in by.items()))


def _fmt(x, w=7, p=1) -> str:
    return f"{'n/a':>{w}s}" if x is None or x != x else f"{x:{w}.{p}f}"


def print_table(rows: list[dict]) -> None:
    print(
        f"{'system':10s} {'load':>5s} {'rate/s':>7s} | {'E2E50 meas':>10s} {'[spread]':>15s} {'sim':>7s} | "
        f"{'E2E99 m':>7s} {'sim':>7s} | {'TTFT50 m':>8s} {'sim':>7s} | {'tok/s m':>7s} {'sim':>7s} | "
        f"{'good m':>6s} {'sim':>6s} | {'preempt m':>9s} {'sim':>5s}"
    )
    for r in rows:
        m, s = r["measured"] or {}, r["simulated"]
        sp = (m.get("spread") or {}).get("e2e_p50_ms")
        print(
            f"{r['system']:10s} {r['load']:5.2f} {_fmt(r['rate'], 7, 2)} | {_fmt(m.get('e2e_p50_ms'), 10)} "
            f"{('[' + _fmt(sp[0], 6) + ',' + _fmt(sp[1], 6) + ']') if sp else '':>15s} {_fmt(s['e2e_p50_ms'])} | "
            f"{_fmt(m.get('e2e_p99_ms'))} {_fmt(s['e2e_p99_ms'])} | {_fmt(m.get('ttft_p50_ms'), 8)} "
            f"{_fmt(s['ttft_p50_ms'])} | {_fmt(m.get('output_throughput'), 7, 0)} {_fmt(s['output_throughput'], 7, 0)}"
            f" | {_fmt(m.get('request_goodput'), 6, 2)} {_fmt(s['request_goodput'], 6, 2)} | "
            f"{_fmt(m.get('preemptions'), 9, 0)} {_fmt(s['preemptions'], 5, 0)}"
        )


def parse_args() -> argparse.Namespace:
    """The bench's flags (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests per run (under 5 minutes)")
    ap.add_argument("--n", type=int, default=0, help="requests per load run (default 24; --quick 8)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every (system, load), interleaved (default 3)")
    ap.add_argument(
        "--work",
        type=Path,
        help="keep every capture in this folder; a capture already there is reused, not rerun (re-predict saved "
        "measurements with another simulator: same --quick/--n/--repeats/--systems)",
    )
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ", ".join(SYSTEMS))
    ap.add_argument(
        "--calibration",
        choices=("server", "engine"),
        default="server",
        help="batch-1 calibration run through the serving runtime at concurrency 1 (default) or through the "
        "engine alone (one-at-a-time capture)",
    )
    ap.add_argument(
        "--calibrate-once",
        action="store_true",
        help="predict every repeat from the first repeat's calibration (default: each repeat captures its own "
        "just before its load runs, so the machine's drift between them hits both sides alike)",
    )
    ap.add_argument(
        "--no-rows-sweep",
        action="store_true",
        help="calibrate on the batch-1 passes alone, without the rows sweep the server calibration records",
    )
    ap.add_argument(
        "--idle-sweep",
        action="store_true",
        help="predict with the calibration's idle sweep too: the first pass after the server slept runs as much "
        "slower as the capture measured (off by default)",
    )
    ap.add_argument(
        "--forward-fit",
        choices=FORWARD_FITS,
        default="auto",
        help="how the calibration costs the forward (simulator.measured_forward; default auto: on the part the "
        "trace ran on the rows sweep's grid or a line, the roofline rescale on another part)",
    )
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    n = args.n or (8 if args.quick else 24)
    names = [s for s in args.systems.split(",") if s]
    bad = [s for s in names if s not in SYSTEMS]
    if bad or args.repeats < 1 or n < 2:
        print(f"serving.py: error: unknown systems {bad} / repeats must be >= 1, n >= 2", file=sys.stderr)
        sys.exit(2)
    measured = load_capture_available()
    t0 = time.perf_counter()
    setups, capacity, runs = run_all(args, names, n, measured)
    rows = aggregate(runs)
    print_table(rows)
    ratios = ratios_by_batch(setups) if measured else {}
    print_ratios(ratios)
    breakdown, fit = (breakdown_by_batch(setups), sweep_fit(setups)) if measured else ({}, {})
    print_breakdown(breakdown, fit)
    out = {
        **settings_of(args, n, measured, setups, capacity),
        **figures_of(rows, ratios, breakdown, fit),
        "wall_s": time.perf_counter() - t0,
    }
    print(json.dumps(out))


def run_all(args: argparse.Namespace, names: list[str], n: int, measured: bool) -> tuple[dict, dict, dict]:
    """(setups, capacity per system, load runs): every system's calibration and capacity (measured, or
    simulated without the serving runtime), then the interleaved load runs, under `--work` or a
    temporary folder removed after."""
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="solm-serving-")))
        work.mkdir(parents=True, exist_ok=True)
        setups = {
            name: Setup(name, work, n, n, args.calibration, not args.no_rows_sweep, args.forward_fit, args.idle_sweep)
            for name in names
        }
        capacity = {}
        for name, s in setups.items():
            if name in CAPACITY_OF:
                continue
            capacity[name] = (
                measured_capacity(s, work, n) if measured else s.simulate(s.cal, float("inf"))["request_throughput"]
            )
        runs = run_loads(setups, capacity, measured, args.repeats, n, work, args.calibrate_once)
    return setups, capacity, runs


def settings_of(args: argparse.Namespace, n: int, measured: bool, setups: dict, capacity: dict) -> dict:
    """The JSON line's settings: mode, what is missing, requests, capacity, batch, SLOs, calibration."""
    missing = (
        []
        if measured
        else [
            "`solm capture --rate` (the batched serving runtime, serve-rt) is not in this "
            "checkout: measured figures are null, the simulator side ran alone"
        ]
    )
    return {
        "bench": "serving",
        "mode": "measured" if measured else "simulated-only",
        "missing": missing,
        "requests_per_run": n,
        "repeats": args.repeats,
        "capacity_req_per_s": capacity,
        "capacity_source": "measured (dev split, all at once)" if measured else "simulated (dev split, all at once)",
        "batch": {
            "max_seqs": MAX_SEQS,
            "max_batch_tokens": MAX_BATCH_TOKENS,
            "pool_kv_tokens": POOL_TOKENS,
            "chunked_prefill": True,
            "scheduler": "fcfs",
        },
        "slo": {name: s.slo for name, s in setups.items()},
        "calibration": args.calibration,
        "calibration_rows_sweep_passes": {name: s.sweep_passes for name, s in setups.items()},
        "calibration_per_repeat": not args.calibrate_once,
        "forward_fit": args.forward_fit,
        "idle_sweep": args.idle_sweep,
        "forward_source": {name: s.cost.source for name, s in setups.items()},
        "slo_rule": f"TTFT <= {SLO_TTFT_X:g}x and TPOT <= {SLO_TPOT_X:g}x the system's batch-1 medians",
    }


def figures_of(rows: list[dict], ratios: dict, breakdown: dict, fit: dict) -> dict:
    """The JSON line's figures: prediction errors, PASTA and TIP comparisons, batched-equals-alone, rows."""
    speed, tip = comparisons(rows)
    equal = [e for r in rows for e in r["equal_alone"] if e is not None]
    return {
        "e2e_p50_mape_percent": mape(rows, LOW, "e2e_p50_ms"),
        "ttft_p50_mape_percent": mape(rows, LOW, "ttft_p50_ms"),
        "throughput_mape_percent": mape(rows, LOW, "output_throughput"),
        "e2e_p50_mape_percent_at_90": mape(rows, (HIGH,), "e2e_p50_ms"),
        "ttft_p50_mape_percent_at_90": mape(rows, (HIGH,), "ttft_p50_ms"),
        "throughput_mape_percent_at_90": mape(rows, (HIGH,), "output_throughput"),
        "pasta_speedup_at_load": speed,
        "tip_throughput_ratio": tip.get("ratio"),
        "tip_vs_dense": tip,
        "batched_equals_alone": (all(equal) if equal else None),
        "batched_equals_alone_runs": len(equal),
        "pass_time_ratio_by_batch": ratios,
        "pass_breakdown_by_batch": breakdown,
        "forward_fit_on_rows_sweep": fit,
        "rows": rows,
    }


if __name__ == "__main__":
    main()
