"""bench/cluster.py: the cluster what-if at scale (issue 15 targets).

What it measures, each printed with how it was obtained:
- comm_mape_percent: `simulator.comm` against the measured A100 collectives, on the buffer sizes
  its fit did not see (every other size of each series; within one node). Goal <= 10%.
- replay_100k_s: N requests cycled from the Splitwise conversation workload (structure from
  traces/sequential-reverse_words) on 8 replicas of Llama-3-8B on H100 behind least-outstanding
  routing, arrivals scaled to about 70% load. Load = offered rate / capacity, the capacity being
  the request throughput of the same 8 replicas with every request of a saturating batch arriving
  at once (measured first, printed). Full run: N = 100,000 (requirement <= 60 s, aim <= 30 s);
  --quick: N = 10,000 and replay_100k_s is that time x 10 (marked `replay_100k_extrapolated`).
  replay_events_per_s: simulated (pass, request) rows per second of replay (a row is one request
  in one batched forward pass); passes_per_s beside it.
- sim_trace_mb_per_100k: the simulated trace of that replay written with `write_simulated_trace`
  (Parquet tables, steps and tokens a row group at a time, + graph.json in the shared form),
  scaled to 100k requests. Aim <= 100 MB.
- peak_rss_mb: this process's peak resident memory (VmHWM): the replay and writing its trace
  (also printed after each: `peak_rss_mb_after_replay`, `peak_rss_mb_after_writing`). Aim <= 2,000 MB.
- trace_read_s: what the dashboard loads of that simulated trace for every page
  (`dashboard.data.load_traces`: the requests table and two steps columns; the other steps columns
  and the per-token rows are left to the page that shows them), in a process of its own (its
  memory, `trace_read_peak_rss_mb`, is the reader's, not the simulator's).
- --fingerprint: sha256 figures of the replay's metrics and of each written table's contents, to
  check that a change leaves the replay's output alone (compare two runs' `fingerprint:` lines).
- dashboard_page_open_s: each dashboard page driven by streamlit's AppTest (every file of
  dashboard/views/) on a folder holding only that simulated trace, in a process of its own:
  `first_open` is the first page with an empty cache (it reads the trace), then per page `warm`
  (the trace cached, as when one clicks through the pages; a page's own first work, such as the
  Diff page reading the token texts, is part of it) and `cold` (every cache cleared and collected
  first: reading the trace again is part of it); `dashboard_peak_rss_mb` is that process's peak
  memory. `--repeat N` runs it N times: each figure is the fastest of the N, with the median beside
  it (`..._median`); the peak RSS is the largest. `dashboard_page_open_s_max` is the slowest warm
  page, `dashboard_page_open_cold_s_max` the slowest cold one (target: each <= 5 s at 100k). (The
  What-if page replays measured traces only: on a simulated trace alone it shows its notice.)
- --keep-trace DIR writes the simulated trace there and keeps it; `--pages DIR [--repeat N]` then
  times the dashboard pages on it (or on any trace folder) without replaying.
- The deployment sweep: `solm sweep` over --tp 1,2,4,8 --replicas 1,2,4 for Llama-3-70B on H100
  with the code workload, priced at --price USD/GPU-hour, SLO TTFT 2 s / TPOT 100 ms; its Pareto
  rows (cost per million output tokens vs p99 TTFT and goodput) are printed.

Wall times on this shared machine drift with the neighbours' load (and stretch far more when the
two cores are oversubscribed): the replay's CPU time (`replay_cpu_s`, this process only) is printed
beside its wall time; the replay is timed once per run (it is minutes long).

    python bench/cluster.py [--quick]        (last line: {"bench": "cluster", ...})
    python bench/cluster.py --quick --requests 100000 --keep-trace /tmp/sim100k --repeat 3
    python bench/cluster.py --pages /tmp/sim100k --repeat 3   (last line: {"bench": "cluster_dashboard", ...})
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profiler.errors import UsageError
from profiler.outdir import check_out_dir
from simulator.cluster.run import ClusterConfig, simulate
from simulator.cluster.workload_file import WORKLOADS_DIR, read_workload_file, stretch
from simulator.comm import evaluate
from simulator.hardware import get_hardware
from simulator.models import get_model
from simulator.replay import ReplayConfig
from simulator.simtrace import write_simulated_trace
from simulator.workload import load_workload

STRUCTURE = ROOT / "traces" / "sequential-reverse_words"
REPLICAS = 8
TARGET_LOAD = 0.7


def _rss_mb() -> int:
    """This process's peak resident memory, MB: VmHWM (ru_maxrss of a child started by this script
    reads its parent's peak when that is higher)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def capacity_rps(structure, n: int) -> float:
    """Request throughput of the 8 replicas when n requests all arrive at once."""
    log = read_workload_file(WORKLOADS_DIR / "splitwise_conv.csv")
    res = simulate(
        stretch(structure, log),
        get_hardware("h100-sxm"),
        get_model("llama-3-8b"),
        ReplayConfig(num_requests=n, rate=float("inf")),
        ClusterConfig(replicas=REPLICAS, router="least_outstanding"),
    )
    return float(res.metrics["request_throughput"])


def time_scale_for_load(structure, quick: bool) -> tuple[float, float]:
    """(time scale, capacity): the conversation trace's arrivals sped up so the 8 replicas run at
    TARGET_LOAD of their capacity (req/s; both printed)."""
    native = read_workload_file(WORKLOADS_DIR / "splitwise_conv.csv")
    native_rps = len(native.arrival_s) / native.arrival_s[-1]
    capacity = capacity_rps(structure, 2000 if quick else 8000)
    scale = TARGET_LOAD * capacity / native_rps
    print(
        f"load: capacity {capacity:.1f} req/s (8 x llama-3-8b on h100-sxm, saturating batch); the conversation "
        f"trace offers {native_rps:.2f} req/s, so --time-scale {scale:.2f} offers {TARGET_LOAD * capacity:.1f} req/s "
        f"({TARGET_LOAD:.0%} load)"
    )
    return scale, capacity


def replay(structure, n: int, scale: float):
    """The timed replay: (result, wall s, CPU s); from reading the workload file to the collected result."""
    t0, c0 = time.perf_counter(), time.process_time()
    w = stretch(structure, read_workload_file(WORKLOADS_DIR / "splitwise_conv.csv", time_scale=scale))
    res = simulate(
        w,
        get_hardware("h100-sxm"),
        get_model("llama-3-8b"),
        ReplayConfig(num_requests=n),
        ClusterConfig(replicas=REPLICAS, router="least_outstanding"),
    )
    return res, time.perf_counter() - t0, time.process_time() - c0


def in_subprocess(flag: str, trace_dir: Path) -> dict:
    """This script's `flag` step on `trace_dir` in its own process (its memory is not the simulator's)."""
    out = subprocess.run(
        [sys.executable, __file__, flag, str(trace_dir)], cwd=ROOT, text=True, capture_output=True, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])


def read_back(trace_dir: Path) -> dict:
    """What the dashboard loads of a trace for every page: seconds and peak RSS."""
    from dashboard.data import load_traces

    t = time.perf_counter()
    traces, errors = load_traces([trace_dir])
    if len(errors):
        raise RuntimeError(f"{trace_dir}: {errors.iloc[0]['error']}")
    return {"read_s": round(time.perf_counter() - t, 2), "peak_rss_mb": _rss_mb()}


def trace_fingerprint(trace_dir: Path) -> dict[str, str]:
    """sha256 of each table's contents (each column's values in row order, read a row group at a
    time) and of graph.json: the same replay output gives the same figures however the files are
    encoded or cut into row groups."""
    import hashlib

    import pyarrow.parquet as pq

    out = {}
    for name in ("requests", "steps", "tokens"):
        f = pq.ParquetFile(trace_dir / f"{name}.parquet")
        streams: dict[str, list] = {col: [] for col in f.schema_arrow.names}  # per column: a hash per stream
        for g in range(f.num_row_groups):
            for col, hashes in streams.items():
                parts = _value_bytes(f.read_row_group(g, columns=[col]).column(0).combine_chunks())
                hashes += [hashlib.sha256() for _ in parts[len(hashes) :]]
                for h, part in zip(hashes, parts):
                    h.update(part)
        digests = "".join(col + "".join(h.hexdigest() for h in hashes) for col, hashes in streams.items())
        out[name] = hashlib.sha256(digests.encode()).hexdigest()[:16]
    out["graph"] = hashlib.sha256((trace_dir / "graph.json").read_bytes()).hexdigest()[:16]
    return out


def _value_bytes(a) -> list[bytes]:
    """A column chunk's values as byte streams (lengths, then values, for strings and lists), each of
    which concatenates to the same bytes however the column is cut."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_list(a.type):  # each row's length, then the values
        lengths = pc.fill_null(pc.list_value_length(a), -1).to_numpy(zero_copy_only=False)
        return [lengths.astype(np.int64).tobytes(), *_value_bytes(pc.list_flatten(a))]
    if pa.types.is_string(a.type) or pa.types.is_binary(a.type):  # each value's length, then its bytes
        lengths = pc.fill_null(pc.binary_length(a), -1).to_numpy(zero_copy_only=False)
        text = b"".join(v for v in a.cast(pa.binary()).to_pylist() if v is not None)
        return [lengths.astype(np.int64).tobytes(), text]
    return [np.ascontiguousarray(a.to_numpy(zero_copy_only=False)).tobytes()]


def replay_at_scale(
    n: int, quick: bool, dashboard: bool = True, fingerprint: bool = False, keep: Path | None = None, repeat: int = 1
) -> dict:
    structure = load_workload(STRUCTURE)
    scale, capacity = time_scale_for_load(structure, quick)
    res, replay_s, replay_cpu_s = replay(structure, n, scale)
    m = res.metrics
    rows = res.rows.n
    rss_replayed = _rss_mb()
    print(
        f"replay: {n} requests in {replay_s:.1f} s wall, {replay_cpu_s:.1f} s CPU ({rows} pass-request rows, {m['passes']} passes); "
        f"p99 TTFT {m['p99_ttft_ms']:.0f} ms, p99 TPOT {m['p99_tpot_ms']:.1f} ms, "
        f"{m['request_throughput']:.1f} req/s over {m['duration_s']:.0f} s simulated"
    )
    out = Path(tempfile.mkdtemp(prefix="solm-cluster-bench-"))
    sim = keep or out / "sim"
    try:
        t1, c1 = time.perf_counter(), time.process_time()
        write_simulated_trace(res, sim)
        write_s, write_cpu_s = time.perf_counter() - t1, time.process_time() - c1
        del res
        mb = _dir_mb(sim)
        rss_written = _rss_mb()
        if fingerprint:
            print("fingerprint:", json.dumps({"metrics": _metrics_hash(m), **trace_fingerprint(sim)}))
        read = in_subprocess("--read-back", sim)
        pages = dashboard_runs(sim, repeat) if dashboard else None
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(
        f"simulated trace: {mb:.1f} MB for {n} requests (written in {write_s:.1f} s wall, {write_cpu_s:.1f} s CPU); "
        f"peak RSS {rss_replayed} MB after the replay, {rss_written} MB after writing; read back as the dashboard "
        f"loads it in {read['read_s']} s (in its own process: peak RSS {read['peak_rss_mb']} MB)"
    )
    factor = 100_000 / n
    figures = {
        "replay_requests": n,
        "replay_s": round(replay_s, 2),
        "replay_100k_s": round(replay_s * factor, 2),
        "replay_cpu_s": round(replay_cpu_s, 2),
        "replay_100k_extrapolated": n != 100_000,
        "replay_events_per_s": round(rows / replay_s),
        "passes_per_s": round(m["passes"] / replay_s),
        "load_time_scale": round(scale, 3),
        "capacity_rps": round(capacity, 2),
        "sim_trace_mb_per_100k": round(mb * factor, 1),
        "trace_write_s": round(write_s, 2),
        "trace_read_s": read["read_s"],
        "trace_read_peak_rss_mb": read["peak_rss_mb"],
        "p99_ttft_ms": round(m["p99_ttft_ms"], 1),
        "peak_rss_mb_after_replay": rss_replayed,
        "peak_rss_mb_after_writing": rss_written,
    }
    return figures if pages is None else {**figures, **dashboard_figures(pages)}


def _metrics_hash(metrics: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(metrics, sort_keys=True, default=str).encode()).hexdigest()[:16]


def dashboard_runs(trace_dir: Path, repeat: int) -> dict:
    """`dashboard_pages` in `repeat` fresh processes, one after another: per figure the fastest
    run and the median of all; the largest peak RSS."""
    runs = [in_subprocess("--dashboard-pages", trace_dir) for _ in range(repeat)]
    both = lambda values: {"min": min(values), "median": round(statistics.median(values), 2)}  # noqa: E731
    return {
        "runs": repeat,
        "first_open": both([r["first_open"] for r in runs]),
        "pages": {
            p: {mode: both([r["pages"][p][mode] for r in runs]) for mode in ("warm", "cold")} for p in runs[0]["pages"]
        },
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
    }


def dashboard_figures(pages: dict) -> dict:
    """Print the page times (fastest of the runs, the median in brackets) and return the JSON figures."""
    f = lambda v: f"{v['min']}" + (f" ({v['median']})" if pages["runs"] > 1 else "")  # noqa: E731
    how = f"fastest of {pages['runs']} runs, median in brackets; " if pages["runs"] > 1 else ""
    print(
        f"dashboard pages (s, AppTest, {how}each run a fresh process): first open "
        + f"{f(pages['first_open'])}; "
        + ", ".join(f"{p} {f(v['warm'])} warm / {f(v['cold'])} cold" for p, v in pages["pages"].items())
        + f"; peak RSS {pages['peak_rss_mb']} MB"
    )
    worst = lambda mode, stat: max(v[mode][stat] for v in pages["pages"].values())  # noqa: E731
    return {
        "dashboard_runs": pages["runs"],
        "dashboard_first_open_s": pages["first_open"]["min"],
        "dashboard_first_open_s_median": pages["first_open"]["median"],
        "dashboard_page_open_s": {p: v["warm"]["min"] for p, v in pages["pages"].items()},
        "dashboard_page_open_cold_s": {p: v["cold"]["min"] for p, v in pages["pages"].items()},
        "dashboard_page_open_s_max": worst("warm", "min"),
        "dashboard_page_open_s_max_median": worst("warm", "median"),
        "dashboard_page_open_cold_s_max": worst("cold", "min"),
        "dashboard_page_open_cold_s_max_median": worst("cold", "median"),
        "dashboard_peak_rss_mb": pages["peak_rss_mb"],
    }


def dashboard_pages(trace_dir: Path) -> dict:
    """Seconds each dashboard page takes to run on a folder holding `trace_dir` (module doc)."""
    import gc
    import os

    import streamlit as st
    from streamlit.logger import set_log_level
    from streamlit.testing.v1 import AppTest

    set_log_level("error")  # bare-mode warnings, a few per page run
    os.environ["SOLM_TRACE_DIRS"] = str(trace_dir)
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=600)
    t = time.perf_counter()
    at.run()
    first = time.perf_counter() - t
    out = {}
    for page in sorted((ROOT / "dashboard" / "views").glob("[!_]*.py")):  # the app's pages
        path = f"views/{page.name}"
        times = {}
        for mode in ("warm", "cold"):
            if mode == "cold":
                st.cache_data.clear()
                st.cache_resource.clear()
                gc.collect()  # the dropped traces freed now, not when the collector next runs
            t = time.perf_counter()
            at.switch_page(path).run()
            times[mode] = round(time.perf_counter() - t, 2)
            if at.exception:
                raise RuntimeError(f"dashboard page {path}: {at.exception[0].value}")
        out[Path(path).stem] = times
    return {"first_open": round(first, 2), "pages": out, "peak_rss_mb": _rss_mb()}


def deployment_sweep(quick: bool, price: float) -> dict:
    """`solm sweep` over tp x replicas for Llama-3-70B on H100 with the code workload."""
    out = Path(tempfile.mkdtemp(prefix="solm-cluster-sweep-"))
    n = 300 if quick else 2000
    cmd = [
        sys.executable,
        "-m",
        "solm",
        "sweep",
        str(ROOT / "traces" / "pasta-word_facts"),
        "--hardware",
        "h100-sxm",
        "--model",
        "llama-3-70b",
        "--workload",
        str(WORKLOADS_DIR / "splitwise_code.csv"),
        "--tp",
        "1,2,4,8",
        "--replicas",
        "1,2,4",
        "--num-requests",
        str(n),
        "--price-per-gpu-hour",
        str(price),
        "--slo-ttft-ms",
        "2000",
        "--slo-tpot-ms",
        "100",
        "--workers",
        "2",
        "--out",
        str(out),
    ]
    print("sweep:", " ".join(cmd[2:]))
    try:
        r = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, check=False)
        print(r.stdout, end="")
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return {"sweep_ok": False}
        figures = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "sweep_ok": True,
        "sweep_configs": figures["configs"],
        "sweep_pareto": figures["pareto"],
        "sweep_requests": n,
    }


def build_parser() -> argparse.ArgumentParser:
    """The bench's flags (module docstring), and the two its own subprocesses take."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10,000 requests (extrapolated to 100k), a smaller sweep")
    ap.add_argument("--requests", type=int, default=None, help="replay this many requests (default 100,000)")
    ap.add_argument(
        "--price",
        type=float,
        default=2.5,
        help="USD per GPU-hour for the sweep (default 2.5, an assumed H100 rental price)",
    )
    ap.add_argument("--no-dashboard", dest="dashboard", action="store_false", help="skip timing the dashboard pages")
    ap.add_argument(
        "--repeat", type=int, default=1, help="time the dashboard pages this many times (fastest and median printed)"
    )
    ap.add_argument(
        "--keep-trace",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the replay's simulated trace to DIR (new or empty) and keep it",
    )
    ap.add_argument(
        "--pages",
        type=Path,
        default=None,
        metavar="DIR",
        help="only time the dashboard pages on the trace folder DIR (e.g. one kept with --keep-trace)",
    )
    ap.add_argument(
        "--fingerprint",
        action="store_true",
        help="print sha256 figures of the replay's metrics and written tables (to check a change leaves them alone)",
    )
    # the bench's own subprocesses
    ap.add_argument("--dashboard-pages", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--read-back", type=Path, default=None, help=argparse.SUPPRESS)
    return ap


def main() -> int:
    ap = build_parser()
    args = ap.parse_args()
    if args.dashboard_pages is not None:
        print(json.dumps(dashboard_pages(args.dashboard_pages)))
        return 0
    if args.read_back is not None:
        print(json.dumps(read_back(args.read_back)))
        return 0
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: give 1 or more")
    if args.pages is not None:
        if not (args.pages / "meta.json").is_file():
            ap.error(f"--pages {args.pages}: not a trace folder (no meta.json)")
        figures = dashboard_figures(dashboard_runs(args.pages.resolve(), args.repeat))
        print(json.dumps({"bench": "cluster_dashboard", "trace": str(args.pages), **figures}))
        return 0
    try:  # refused before the replay, not after it
        keep = check_out_dir(args.keep_trace, force=None, flag="--keep-trace") if args.keep_trace else None
    except UsageError as e:
        ap.error(str(e))
    figures = {"bench": "cluster", **comm_figures()}
    n = args.requests or (10_000 if args.quick else 100_000)
    figures.update(replay_at_scale(n, args.quick, args.dashboard, args.fingerprint, keep, args.repeat))
    figures.update(deployment_sweep(args.quick, args.price))
    figures["peak_rss_mb"] = _rss_mb()
    figures["quick"] = args.quick
    print(json.dumps(figures))
    return 0


def comm_figures() -> dict:
    """The collective-cost model's held-out error (simulator.comm's evaluation), printed with its
    per-series figures; the two MAPEs returned."""
    comm = evaluate()
    print(
        f"comm: held-out MAPE {comm['comm_mape_percent']}% over {comm['held_out_rows']} buffer sizes the fit did "
        f"not see ({comm['comm_mape_percent_1mib_up']}% from 1 MiB up); per series {comm['series']}"
    )
    return {
        "comm_mape_percent": comm["comm_mape_percent"],
        "comm_mape_percent_1mib_up": comm["comm_mape_percent_1mib_up"],
    }


if __name__ == "__main__":
    sys.exit(main())
