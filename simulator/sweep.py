"""Sweeps: every combination of trace x hardware x model x max-seqs x arrival, and its Pareto front.

What: each configuration is one replay (`simulator.replay`); its row holds the settings, the
`vllm bench serve` metrics, the quality copied from the trace, and `pareto`: True where no other
row is at least as good on every objective (quality up, mean E2E latency down, output throughput
up, peak KV bytes down) and better on one. A configuration that cannot run (weights larger than
the part's memory) is a row with its error, not a crash.

How: a local process pool by default (one worker per core, workloads sent once per worker);
`backend="ray"` runs the same chunks as Ray tasks, on an existing cluster (`address`) or on a
local instance bound to loopback (`simulator.ray_backend`). Workers die with the sweep: the pool
is stopped on any exit, and each worker asks Linux for SIGTERM when its parent dies. Each
finished chunk is appended to `results.jsonl` in the output directory at once, so an interrupted
sweep keeps what it finished and a rerun with the same `out` skips it; `sweep.parquet` is written
at the end (and on interrupt) with the Pareto marks.

    from simulator.sweep import sweep
    table = sweep(["traces/sequential-tiny"], hardware=["a100-80g", "h100-sxm"], max_seqs=[1, 8, 32],
                  rates=[1, 10, float("inf")], out="runs/sweep1")
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import numpy as np
import pandas as pd

from profiler.errors import UsageError, parse_json, quoted
from profiler.host import usable_cores
from profiler.outdir import input_file, write_file_atomic
from profiler.services import die_with_parent
from profiler.stats import non_dominated
from simulator.hardware import get_hardware
from simulator.models import ModelSpec, get_model
from simulator.replay import ReplayConfig
from simulator.workload import Workload, load_workload

# one sweep's most configurations: 100,000 replays of ~0.05 s each (4 requests of a shipped trace) are
# ~1.4 CPU-hours, and a grid's list, keys and results table stay in memory
MAX_CONFIGS = 100_000
RESULTS_JSONL = "results.jsonl"
LOCAL_WORKERS_PER_CORE = 4  # a process-pool worker holds every trace; beyond this it only thrashes
RESULTS_PARQUET = "sweep.parquet"
SETTINGS = (
    "trace",
    "hardware",
    "model",
    "max_seqs",
    "rate",
    "concurrency",
    "max_batch_tokens",
    "num_requests",
    "scheduler",
    "seed",
)
# the deployment (simulator/cluster): swept over tp x pp x replicas; the rest fixed for a sweep
CLUSTER_SETTINGS = (
    "tp",
    "pp",
    "pp_schedule",
    "replicas",
    "router",
    "workload",
    "time_scale",
    "price_per_gpu_hour",
    "slo_ttft_ms",
    "slo_tpot_ms",
)
CLUSTER_DEFAULTS = {
    "tp": 1,
    "pp": 1,
    "pp_schedule": "drain",
    "replicas": 1,
    "router": "round_robin",
    "workload": None,
    "time_scale": 1.0,
    "price_per_gpu_hour": None,
    "slo_ttft_ms": None,
    "slo_tpot_ms": None,
}
OPTIONS = (
    "chunked_prefill",
    "reserve",
    "sjf_oracle",
    "slo_ttft_ms",
    "slo_tpot_ms",
)  # ReplayConfig fields passed as given
# (column, +1 to maximise / -1 to minimise)
OBJECTIVES: tuple[tuple[str, int], ...] = (
    ("quality_mean", 1),
    ("mean_e2el_ms", -1),
    ("output_throughput", 1),
    ("peak_kv_bytes", -1),
)


def objectives_for(table: pd.DataFrame) -> tuple[tuple[str, int], ...]:
    """Deployment sweeps (GPU counts differ) trade cost (or GPU count) against p99 TTFT and goodput
    (or output throughput without an SLO); others keep OBJECTIVES."""
    if "gpus" not in table or table["gpus"].dropna().nunique() < 2:
        return OBJECTIVES
    priced = "cost_per_million_output_tokens" in table and table["cost_per_million_output_tokens"].notna().any()
    slo = "request_goodput" in table and table["request_goodput"].notna().any()
    return (
        ("cost_per_million_output_tokens" if priced else "gpus", -1),
        ("p99_ttft_ms", -1),
        ("request_goodput" if slo else "output_throughput", 1),
    )


def grid(
    traces: Sequence[str],
    hardware: Sequence[str],
    models: Sequence[str] = ("",),
    max_seqs: Sequence[int] = (256,),
    rates: Sequence[float | None] = (None,),
    concurrency: Sequence[int | None] = (None,),
    max_batch_tokens: int = 8192,
    num_requests: int | None = None,
    scheduler: str = "fcfs",
    seed: int = 0,
    options: dict | None = None,
    cluster: dict | None = None,
) -> list[dict]:
    """Every combination, as plain dicts (model "" = the trace's own). Bad names fail here, before any work.

    `options`: ReplayConfig fields passed as given (OPTIONS). `cluster`: deployment settings
    (CLUSTER_DEFAULTS' keys); "tp", "pp" and "replicas" may be lists."""
    _check_names(hardware, models)
    arrivals = _arrivals(rates, concurrency)
    fixed = {**CLUSTER_DEFAULTS, **(cluster or {})}
    calibrations = _pop_calibrations(fixed, hardware)
    shapes = _shapes(fixed)
    _check_table_ints(
        {
            "--max-seqs": max_seqs,
            "--concurrency": concurrency,
            "--max-batch-tokens": [max_batch_tokens],
            "--num-requests": [num_requests],
            "--seed": [seed],
            "--tp": [s[0] for s in shapes],
            "--pp": [s[1] for s in shapes],
            "--replicas": [s[2] for s in shapes],
        }
    )
    _check_size(traces, hardware, models, max_seqs, arrivals, shapes)
    configs = []
    for t, h, m, s, (r, c), (tp, pp, k) in itertools.product(traces, hardware, models, max_seqs, arrivals, shapes):
        cfg = {
            "trace": str(t),
            "hardware": h,
            "model": m,
            "max_seqs": int(s),
            "rate": r,
            "concurrency": c,
            "max_batch_tokens": int(max_batch_tokens),
            "num_requests": num_requests,
            "scheduler": scheduler,
            "seed": int(seed),
            **fixed,
            "tp": tp,
            "pp": pp,
            "replicas": k,
            **(options or {}),
        }
        if h in calibrations:
            cfg["gemm_calibration"] = calibrations[h]
        _replay_config(cfg)  # ValueError for a bad setting, before any work
        _cluster_config(cfg)
        configs.append(cfg)
    return configs


def _check_size(*axes: Sequence) -> None:
    """UsageError for a grid of more than MAX_CONFIGS configurations, before any is built (was: 4 parts x
    199 max-seqs x 199 rates, 158,404 replays, accepted and run for hours with no word of the size)."""
    sizes = [len(axis) for axis in axes]
    total = math.prod(sizes)
    if total > MAX_CONFIGS:
        names = ("traces", "parts", "models", "max-seqs", "arrivals", "deployments (tp, pp, replicas)")
        factors = " x ".join(f"{n} {name}" for n, name in zip(sizes, names, strict=True) if n > 1)
        raise UsageError(
            f"the grid has {total:,} configurations ({factors}), more than the {MAX_CONFIGS:,} one sweep runs; "
            f"narrow the lists or split it into several sweeps"
        )


def _check_table_ints(settings: dict[str, Sequence]) -> None:
    """UsageError for an integer setting beyond a table column's 64 bits (was: --max-seqs
    1,99999999999999999999 ran, then every write of the table, and every resume, an OverflowError)."""
    for flag, values in settings.items():
        for v in values:
            if isinstance(v, (int, np.integer)) and not -(2**63) <= v < 2**63:
                raise UsageError(f"{flag} {quoted(v)}: beyond the 64-bit integers a sweep's table holds")


def _check_names(hardware: Sequence[str], models: Sequence[str]) -> None:
    """Every part and model name known (UnknownName otherwise), the parts first."""
    for h in hardware:
        get_hardware(h)
    for m in models:
        if m:
            get_model(m)


def _arrivals(
    rates: Sequence[float | None], concurrency: Sequence[int | None]
) -> list[tuple[float | None, int | None]]:
    """(rate, concurrency) pairs: each rate open loop, then each client count closed loop; (None,
    None), the trace's own arrivals, when neither is given."""
    arrivals: list[tuple[float | None, int | None]] = [(r, None) for r in rates if r is not None]
    arrivals += [(None, c) for c in concurrency if c is not None]
    return arrivals or [(None, None)]


def _pop_calibrations(fixed: dict, hardware: Sequence[str]) -> dict:
    """Takes "gemm_calibrations" out of the deployment settings: a part's own GEMM calibration
    (solm calibrate), {part: its GemmParams as JSON}, per config; one for a part not swept is refused."""
    calibrations = fixed.pop("gemm_calibrations", None) or {}
    stray = sorted(set(calibrations) - set(hardware))
    if stray:
        raise UsageError(
            f"--gemm-calibration: fitted on {stray[0]}, which is not among --hardware {','.join(hardware)} "
            f"(a calibration serves the part it was fitted on)"
        )
    from simulator.gemm import GemmParams

    # each config parses its part's again (run_one): refuse a bad one here, before any work; not JSON
    # text (TypeError, ValueError), not exactly GemmParams' fields, or a value out of range (ValueError)
    for part, text in calibrations.items():
        try:
            GemmParams.from_json(json.loads(text))
        except (TypeError, ValueError) as error:
            raise UsageError(f"--gemm-calibration for {part}: {error}") from None
    return calibrations


def _shapes(fixed: dict) -> list[tuple]:
    """Every (tp, pp, replicas) of the deployment settings, each a number or a list of them."""
    return list(
        itertools.product(
            *(
                [int(x) for x in fixed[k]] if isinstance(fixed[k], (list, tuple)) else [fixed[k]]
                for k in ("tp", "pp", "replicas")
            )
        )
    )


def _cluster_config(cfg: dict):
    from simulator.cluster.parallel import Parallelism
    from simulator.cluster.run import ClusterConfig

    return ClusterConfig(
        Parallelism(cfg["tp"], cfg["pp"], schedule=cfg.get("pp_schedule", "drain")),
        replicas=cfg["replicas"],
        router=cfg["router"],
        slo_ttft_ms=cfg["slo_ttft_ms"],
        slo_tpot_ms=cfg["slo_tpot_ms"],
    )


def workload_key(cfg: dict) -> str:
    return cfg["trace"] if not cfg.get("workload") else f"{cfg['workload']}@{cfg['time_scale']}|{cfg['trace']}"


def load_workloads(configs: list[dict]) -> dict[str, Workload]:
    """Each distinct (trace, workload file) once: the trace's own, or the file stretched over it."""
    from simulator.cluster.workload_file import read_workload_file, stretch

    out: dict[str, Workload] = {}
    for cfg in configs:
        key = workload_key(cfg)
        if key not in out:
            w = load_workload(cfg["trace"])
            if cfg.get("workload"):
                w = stretch(w, read_workload_file(cfg["workload"], time_scale=cfg["time_scale"]), seed=cfg["seed"])
            out[key] = w
    return out


def _replay_config(cfg: dict) -> ReplayConfig:
    return ReplayConfig(
        max_seqs=cfg["max_seqs"],
        max_batch_tokens=cfg["max_batch_tokens"],
        rate=None if cfg["rate"] is None else float(cfg["rate"]),
        concurrency=cfg["concurrency"],
        num_requests=cfg["num_requests"],
        scheduler=cfg["scheduler"],
        seed=cfg["seed"],
        **{k: cfg[k] for k in OPTIONS if k in cfg},
    )


def config_key(cfg: dict) -> str:
    """The identity of a configuration: its settings, the trace by its resolved path (a resumed
    sweep finds its rows however the trace's path is spelled: ./t, t/, a symlink)."""
    keys = dict.fromkeys((*SETTINGS, *OPTIONS, *CLUSTER_SETTINGS))
    key = {**{k: cfg.get(k, CLUSTER_DEFAULTS.get(k)) for k in keys}, "trace": os.path.realpath(cfg["trace"])}
    if cfg.get("gemm_calibration"):  # only when given: sweeps written before it keep their keys
        key["gemm_calibration"] = cfg["gemm_calibration"]
    return json.dumps(key, sort_keys=True)


def run_one(cfg: dict, workloads: dict[str, Workload]) -> dict:
    """One configuration's row: settings, metrics, quality from the trace, status."""
    from simulator.cluster.run import simulate

    w = workloads[workload_key(cfg)]
    row = {**cfg, "key": config_key(cfg), "system": w.source.get("system"), "status": "ok", "error": ""}
    try:
        model = get_model(cfg["model"]) if cfg["model"] else ModelSpec.from_trace_meta(w.source["model"])
        row["model"] = model.name
        hardware = get_hardware(cfg["hardware"])
        if cfg.get("price_per_gpu_hour") is not None:
            hardware = dataclasses.replace(hardware, price_per_gpu_hour=cfg["price_per_gpu_hour"])
        if cfg.get("gemm_calibration"):
            from simulator.gemm import GemmParams
            from simulator.gemm_calibration import gemm_fit_of

            params = GemmParams.from_json(json.loads(cfg["gemm_calibration"]))
            hardware = dataclasses.replace(hardware, gemm_fit=gemm_fit_of(params))
        res = simulate(w, hardware, model, _replay_config(cfg), _cluster_config(cfg))
        row.update(res.metrics)
        row["quality_mean"] = w.quality_mean  # from the trace (NaN: not scored), never from the simulation
    except (ValueError, KeyError) as e:
        row.update(status="error", error=str(e.args[0] if isinstance(e, KeyError) and e.args else e))
    return row


def run_chunk(configs: list[dict], workloads: dict[str, Workload] | None = None) -> list[dict]:
    return [run_one(c, workloads if workloads is not None else _WORKER_WORKLOADS) for c in configs]


_WORKER_WORKLOADS: dict[str, Workload] = {}


def _init_worker(workloads: dict[str, Workload]) -> None:
    global _WORKER_WORKLOADS
    die_with_parent()  # a worker blocked on the task pipe must not outlive a killed sweep
    _WORKER_WORKLOADS = workloads


def pareto_mask(table: pd.DataFrame, objectives: Sequence[tuple[str, int]] = OBJECTIVES) -> np.ndarray:
    """True for rows no other ok row dominates (NaN counts as worst; errors are never optimal)."""
    ok = (table["status"] == "ok").to_numpy() if "status" in table else np.ones(len(table), bool)
    cols = [c for c, _ in objectives if c in table]
    x = (
        np.stack([table[c].astype(float).to_numpy() * s for c, s in objectives if c in table], axis=1)
        if cols
        else np.zeros((len(table), 0))
    )
    out = np.zeros(len(table), bool)
    out[np.flatnonzero(ok)] = non_dominated(x[ok])
    return out


def _chunks(items: list, n: int) -> list[list]:
    return [items[i : i + n] for i in range(0, len(items), n)]


def _torn(path: Path) -> bool:
    """True when the file ends in a row cut short (a sweep killed mid-write): no newline at its end."""
    try:
        with path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:  # missing or empty
        return False


def _append(path: Path, rows: Iterable[dict]) -> None:
    torn = _torn(path)
    with path.open("a", encoding="utf-8") as f:
        if torn:  # end the torn row's line: was glued to the next row, and the next resume could not read it
            f.write("\n")
        for row in rows:
            f.write(json.dumps(row, default=_jsonable) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    return str(x)


def read_results(out: str | Path) -> pd.DataFrame:
    """The rows finished so far (results.jsonl), with Pareto marks; empty if none."""
    path = Path(out) / RESULTS_JSONL
    if not path.exists() and not path.is_symlink():
        return pd.DataFrame()
    if path.is_symlink():  # was: the resume appended its rows to the file the link points to
        raise UsageError(f"{path}: a link, not the results a sweep wrote; choose another --out")
    input_file(path, "sweep results")  # a FIFO there blocked the resume for ever
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as error:
        raise UsageError(f"{path}: not a sweep's results ({error}); choose another --out") from None
    # a row cut short (a sweep killed mid-write) is skipped; any other line must be a row (was: `[1, 2]` skipped)
    try:
        rows = [
            parse_json(line, "a line")
            for line in lines
            if line and not (line.startswith("{") and not line.endswith("}"))
        ]
    except UsageError as error:
        raise UsageError(f"{path}: not a sweep's results ({error}); choose another --out") from None
    if not all(isinstance(row, dict) and "key" in row for row in rows):
        raise UsageError(f"{path}: a line that is not a sweep's result row; choose another --out")
    table = pd.DataFrame(rows).drop_duplicates("key", keep="last").reset_index(drop=True) if rows else pd.DataFrame()
    if len(table):
        _check_column_types(table, path)
        table["pareto"] = pareto_mask(table, objectives_for(table))
    return table


def _check_column_types(table: pd.DataFrame, path: Path) -> None:
    """UsageError if a column's values are of types no table holds together (a row edited by hand:
    "max_seqs": "1" beside 2 was an internal error, ArrowTypeError, when sweep.parquet was written)."""
    import pyarrow as pa

    try:
        pa.Table.from_pandas(table, preserve_index=False)
    except (pa.ArrowTypeError, pa.ArrowInvalid, OverflowError) as error:  # Overflow: an int beyond 64 bits
        column = str(error.args[-1]) if error.args else str(error)
        raise UsageError(
            f"{path}: rows of mixed types, not a sweep's results ({column}); choose another --out"
        ) from None


def _write_parquet(table: pd.DataFrame, out: Path) -> None:
    if len(table):
        _check_column_types(table, out / RESULTS_JSONL)  # its rows are kept; the table is not written
        # a temporary file of its own name: was a fixed `.sweep.parquet.tmp`, and a link there had the table
        # written through it into the file it named
        write_file_atomic(out / RESULTS_PARQUET, table.to_parquet(index=False))


def sweep(
    traces: Sequence[str],
    hardware: Sequence[str],
    models: Sequence[str] = ("",),
    max_seqs: Sequence[int] = (256,),
    rates: Sequence[float | None] = (None,),
    concurrency: Sequence[int | None] = (None,),
    max_batch_tokens: int = 8192,
    num_requests: int | None = None,
    scheduler: str = "fcfs",
    seed: int = 0,
    backend: str = "local",
    address: str | None = None,
    workers: int | None = None,
    out: str | Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    options: dict | None = None,
    cluster: dict | None = None,
) -> pd.DataFrame:
    """Run the grid; return the table (and write it under `out`). See the module docstring."""
    workers = _workers(backend, workers)
    configs = grid(
        traces,
        hardware,
        models,
        max_seqs,
        rates,
        concurrency,
        max_batch_tokens,
        num_requests,
        scheduler,
        seed,
        options,
        cluster,
    )
    if address is not None and backend != "ray":  # was: ignored, the grid ran on the local pool
        raise UsageError("--address names a Ray cluster: give it with --backend ray")
    if backend == "ray" and address is not None:  # "" too: it was taken for no address (a local Ray)
        from simulator.ray_backend import probe

        probe(address)  # a wrong address is one line now, not after loading every trace
    order = {config_key(c): i for i, c in enumerate(configs)}
    workloads = load_workloads(configs)
    out_dir = Path(out) if out is not None else None
    done: list[dict] = []
    if out_dir is not None:
        done, configs = _resume(out_dir, configs, order)
    return _run_and_write(configs, done, order, workloads, backend, address, workers, out_dir, progress)


def _workers(backend: str, workers: int | None) -> int:
    """The worker count (default: one per usable core), refused (UsageError) for an unknown backend,
    fewer than one worker, or a local pool that would only thrash."""
    if backend not in ("local", "ray"):
        raise UsageError(f"unknown backend {backend!r}; valid: local, ray")
    cores = usable_cores()
    if workers is not None and workers < 1:  # 0 was taken as "the default"
        raise UsageError(f"workers must be >= 1, got {workers}")
    workers = workers or max(1, cores)
    if backend == "local" and workers > LOCAL_WORKERS_PER_CORE * cores:  # was: 10000 spawned 2500+ processes
        raise UsageError(
            f"--workers {workers}: a local pool of more than {LOCAL_WORKERS_PER_CORE} processes per core (this machine "
            f"has {cores}) only thrashes; use --backend ray --address for more"
        )
    return workers


def _run_and_write(
    configs: list[dict],
    done: list[dict],
    order: dict[str, int],
    workloads: dict[str, Workload],
    backend: str,
    address: str | None,
    workers: int,
    out_dir: Path | None,
    progress: Callable[[int, int], None] | None,
) -> pd.DataFrame:
    """Run `configs` after the `done` rows, appending each finished chunk to results.jsonl; the
    table of every finished row, also written as Parquet, even when the run is interrupted."""
    total = len(configs) + len(done)

    def finished_chunk(rows: list[dict]) -> None:
        done.extend(rows)
        if out_dir is not None:
            _append(out_dir / RESULTS_JSONL, rows)
        if progress:
            progress(len(done), total)

    try:
        chunks = _chunks(configs, _chunk_size(len(configs), workers))
        _dispatch(chunks, workloads, backend, address, workers, finished_chunk)
    finally:
        table = _table(done, order)
        if out_dir is not None:
            _write_parquet(table, out_dir)
    return table


def _resume(out_dir: Path, configs: list[dict], order: dict[str, int]) -> tuple[list[dict], list[dict]]:
    """(rows already in `out_dir`'s results that belong to this grid, the configurations still to run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / RESULTS_PARQUET).is_dir():  # was: every configuration ran, then the table failed to replace it
        raise UsageError(f"{out_dir / RESULTS_PARQUET}: a folder, not the table a sweep writes; choose another --out")
    table, rows_file = out_dir / RESULTS_PARQUET, out_dir / RESULTS_JSONL
    if (table.exists() or table.is_symlink()) and not (rows_file.exists() or rows_file.is_symlink()):
        # a sweep writes its rows before its table: without them, whose grid the table holds is unknown
        # (was: this grid ran and replaced the table, perhaps another sweep's)
        raise UsageError(
            f"--out {out_dir} holds a {RESULTS_PARQUET} but no {RESULTS_JSONL}: not a sweep this one can resume; "
            "choose another --out"
        )
    finished = read_results(out_dir)
    keys = set(finished["key"]) if len(finished) else set()
    foreign = keys - set(order)
    if foreign:  # was: its rows kept in results.jsonl but its sweep.parquet replaced by this grid's
        raise UsageError(
            f"--out {out_dir} holds {len(foreign)} finished configuration(s) of another sweep (other traces or "
            f"settings); resume it with its own command, or choose another --out"
        )
    rows = finished.drop(columns="pareto").to_dict("records") if len(finished) else []
    done = [r for r in rows if r["key"] in order]
    return done, [c for c in configs if config_key(c) not in keys]


def _chunk_size(n_configs: int, workers: int) -> int:
    """Configurations per task: about 8 tasks per worker, 1..25 each."""
    return max(1, min(25, math.ceil(n_configs / (workers * 8)))) if n_configs else 1


def _dispatch(
    chunks: list[list[dict]],
    workloads: dict[str, Workload],
    backend: str,
    address: str | None,
    workers: int,
    finished_chunk: Callable[[list[dict]], None],
) -> None:
    """Run every chunk on the chosen backend (in this process with one local worker)."""
    if not chunks:
        pass
    elif backend == "ray":
        _run_ray(chunks, workloads, address, workers, finished_chunk)
    elif workers == 1:
        for chunk in chunks:
            finished_chunk(run_chunk(chunk, workloads))
    else:
        _run_pool(chunks, workloads, min(workers, len(chunks)), finished_chunk)  # no idle processes


def _run_pool(
    chunks: list[list[dict]], workloads: dict[str, Workload], workers: int, finished_chunk: Callable[[list[dict]], None]
) -> None:
    """Chunks on a process pool; on any exit (an error, Ctrl-C, SIGTERM turned into SystemExit by
    the command) the workers are stopped before this returns, none left behind."""
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(workloads,))
    try:
        pending = {pool.submit(run_chunk, chunk) for chunk in chunks}
        while pending:
            ready, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in ready:
                finished_chunk(fut.result())
    except BaseException:
        procs = list((getattr(pool, "_processes", None) or {}).values())  # CPython keeps them here
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:  # a running chunk is not waited for: its rows are lost, the rerun redoes it
            p.terminate()
        for p in procs:
            p.join(10)
        raise
    pool.shutdown(wait=True)


def _table(rows: list[dict], order: dict[str, int]) -> pd.DataFrame:
    """Rows in grid order (whatever order they finished in), Pareto marked."""
    if not rows:
        return pd.DataFrame(columns=[*SETTINGS, "status", "error", "pareto"])
    table = pd.DataFrame(rows).drop_duplicates("key", keep="last")
    table = table.assign(_o=table["key"].map(order)).sort_values("_o", kind="stable").drop(columns="_o")
    table = table.reset_index(drop=True)
    table["pareto"] = pareto_mask(table, objectives_for(table))
    return table


def _run_ray(
    chunks: list[list[dict]],
    workloads: dict[str, Workload],
    address: str | None,
    workers: int,
    finished_chunk: Callable[[list[dict]], None],
) -> None:
    from simulator.ray_backend import ray_session

    with ray_session(address, workers) as ray:
        task = ray.remote(run_chunk)
        ref = ray.put(workloads)
        pending = [task.remote(chunk, ref) for chunk in chunks]
        # On a stop (SIGTERM, an error) the pending chunks are left to `ray.shutdown()`, which
        # ends the workers, and never cancelled: a cancelled chunk that was already pushed to a
        # worker gets its reply after the driver dropped it, and Ray's C++ check "Tried to
        # complete task that was not pending" exits the driver with 1 (SIGTERMs to a running sweep:
        # `ray.cancel(force=False)` 4 of 40, with force=True and a wait 1 of 6; without a cancel 0 of 40).
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for r in ready:
                finished_chunk(ray.get(r))
