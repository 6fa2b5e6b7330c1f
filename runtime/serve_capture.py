"""Serving capture: a system under load, recorded as a trace (format v1, `schema_minor` 1).

What: `solm capture --rate R` (Poisson arrivals, R requests/s, seeded) or `--concurrency C` (a
closed loop: C clients, each sending its next request when its last one finishes) runs a task's
prompts through `runtime.server.Server`: continuous batching over one KV pool of `--kv-budget-mib`,
the batch formed by the shared scheduler (`scheduling`, `--scheduler`, `--max-seqs`,
`--max-batch-tokens`, `--chunked-prefill`). Per request: arrival, queue, first token, finish,
preemptions, recomputed tokens. Per pass and request (steps.parquet, rows of one pass share
`batch_index`): its rows, KV reads, the keys its attention scored, the pass's requests and rows,
preemptions and recomputes; prefill chunks are rows with `chunk` true and step_index -1.

Why here and not in runtime/capture.py: one-at-a-time capture (repeats, structure replay) stays
as it is; this module only adds the load loop and reuses its row builders.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from profiler.counters import CounterSampler
from profiler.errors import UsageError
from profiler.schema import CHUNK_NOTE, MIN_RATE
from profiler.writer import TraceWriter
from runtime.answer_length import default_max_tokens
from runtime.capture import (
    CaptureConfig,
    capture_meta,
    check_config,
    quality_applicable,
    request_row,
    token_rows,
)
from runtime.checkpoint import load_model
from runtime.engines import Engine, GenerationConfig, Request, get_engine
from runtime.hf_tokenizer import tokenizer_for
from runtime.sampling import SamplingConfig
from runtime.server import ATTENTION_MODES, PassRecord, Server, WallClock
from runtime.tokenizer import Tokenizer


@dataclass
class LoadConfig:
    rate: float | None = None  # requests/s (Poisson); or
    concurrency: int | None = None  # clients in a closed loop
    max_seqs: int = 64
    max_batch_tokens: int = 4096
    kv_budget_mib: float = 8.0
    scheduler: str = "fcfs"
    chunked_prefill: bool = False
    attention: str = "mask"
    rows_sweep: bool = False  # after serving, time the forward over rows x pool sizes (runtime/rows_sweep.py)

    def check(self) -> None:
        """Bad settings: ValueError with one clear line (the CLI prints it, exit 2)."""
        if (self.rate is None) == (self.concurrency is None):
            raise UsageError("give exactly one of --rate and --concurrency")
        if self.rate is not None and not self.rate >= MIN_RATE:  # inf: every request arrives at once (a burst)
            raise UsageError(f"--rate must be at least {MIN_RATE:g} requests/s (or inf), got {self.rate}")
        if self.concurrency is not None and self.concurrency < 1:
            raise UsageError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.max_seqs < 1 or self.max_batch_tokens < 1:
            raise UsageError(
                f"--max-seqs and --max-batch-tokens must be >= 1, got {self.max_seqs}, {self.max_batch_tokens}"
            )
        if not (self.kv_budget_mib > 0 and math.isfinite(self.kv_budget_mib)):
            raise UsageError(f"--kv-budget-mib must be > 0, got {self.kv_budget_mib}")
        if self.attention not in ATTENTION_MODES:
            raise UsageError(f"--attention must be one of {', '.join(ATTENTION_MODES)}, got {self.attention!r}")


def make_scheduler(load: LoadConfig):
    from scheduling import get_scheduler

    try:
        cls = get_scheduler(load.scheduler)
    except KeyError as e:  # an unknown policy name: the lookup's message lists the valid ones
        raise UsageError(f"--scheduler: {e.args[0] if e.args else e}") from None
    # said either way: the scheduler's own default is on (was: every load capture chunked)
    return cls(max_seqs=load.max_seqs, max_batch_tokens=load.max_batch_tokens, chunked_prefill=load.chunked_prefill)


def _arrivals_kind(rate: float | None) -> str:
    if rate is None:
        return "closed loop"
    return "poisson" if math.isfinite(rate) else "all at once (--rate inf)"


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """n arrival times (s) of a Poisson process of `rate`/s, the first at 0; all 0 when rate is inf."""
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


def step_rows(rec: PassRecord, origin_s: float = 0.0) -> dict[int, list[dict]]:
    """steps.parquet rows of one pass, by request."""
    out: dict[int, list[dict]] = {}
    reqs, rows = len(rec.entries), rec.rows
    for e in rec.entries:
        if e.step is not None:
            row = e.step.as_row()
        else:
            row = {
                "request_id": e.request_id,
                "step_index": -1,
                "phase": "prefill",
                "streams": "",
                "active_streams": 0,
                "query_tokens": 0,
                "kv_tokens_read": 0,
                "live_kv_tokens": -1,
                "kv_bytes_allocated": -1,
                "emitted_tokens": 0,
                "evicted_tokens": 0,
                "freed_kv_bytes": 0,
                "note": CHUNK_NOTE,
                "host_s": float("nan"),
            }
        row.update(
            batch_index=rec.index,
            start_s=rec.start_s - origin_s,
            duration_s=rec.end_s - rec.start_s,
            forward_s=rec.forward_s,
            device_memory_bytes=-1,
            batch_requests=reqs,
            batch_query_tokens=rows,
            recompute_tokens=e.recompute_tokens,
            preempted_requests=len(rec.preempted),
            attention_kv_tokens=e.attention_kv_tokens,
            chunk=e.chunk,
        )
        out.setdefault(e.request_id, []).append(row)
    return out


def capture_load(cfg: CaptureConfig, load: LoadConfig, out: str | Path, overwrite: bool = False) -> Path:
    """Run `cfg`'s prompts under `load` and write the serving trace to `out`."""
    load.check()
    cfg = cfg.resolved()
    check_config(cfg)  # as one-at-a-time capture (a --device cuda without CUDA was torch's AssertionError)
    if get_engine(cfg.system).start is Engine.start:  # was: NotImplementedError (exit 1) after loading the model
        raise UsageError(
            f"{cfg.system} runs one request at a time (its engine keeps no per-pass request state to "
            "batch): capture it without --rate/--concurrency"
        )
    if cfg.repeats != 1 or cfg.structure_from:
        raise UsageError(
            "--repeats and --structure-from apply to one-at-a-time capture, not to --rate/--concurrency "
            "(repeat a load run with separate captures: arrivals never mix across runs)"
        )
    from runtime.tasks import get_task

    task = get_task(cfg.task)
    # as one-at-a-time capture: room for the task's longest answer unless told
    max_tokens = default_max_tokens(cfg.task) if cfg.max_tokens is None else cfg.max_tokens
    cfg = dataclasses.replace(cfg, max_tokens=max_tokens)
    model, info = load_model(cfg.model, cfg.device, seed=cfg.seed)
    tok = tokenizer_for(model)  # a real model: its own tokenizer
    gen_cfg = GenerationConfig(
        max_tokens=max_tokens,
        page_size=cfg.page_size,
        sampling=SamplingConfig(cfg.temperature, cfg.top_p, cfg.seed),
    )
    try:
        engine = get_engine(cfg.system)(model, tok, gen_cfg, **cfg.knobs)
    except TypeError as e:
        raise UsageError(f"bad knob for {cfg.system}: {e}") from None
    server_args: dict[str, Any] = dict(kv_budget_mib=load.kv_budget_mib, attention=load.attention)
    Server(engine, scheduler=make_scheduler(load), **server_args)  # a budget below one page fails before any work
    examples = task.examples(cfg.split, cfg.n, cfg.seed)
    for i, ex in enumerate(task.examples("train", cfg.warmup, cfg.seed) if cfg.warmup else []):
        engine.generate(Request(-1 - i, ex.prompt))  # untimed warm-up, one at a time
    scored = quality_applicable(info, "")
    sampler = CounterSampler(cfg.counters_interval_s, use_nvml=cfg.device.startswith("cuda"))
    clock = WallClock()
    server = Server(engine, scheduler=make_scheduler(load), clock=clock, **server_args)
    meta = {**capture_meta(cfg, model, info, sampler, "perf_counter", scored), "serving": serving_meta(load, server)}
    writer = TraceWriter(out, meta, overwrite=overwrite)
    passes: list[PassRecord] = []  # as they run (serve returns them, unless it is cut short)
    server.on_pass = passes.append
    arrivals, more = load_arrivals(load, [ex.prompt for ex in examples], cfg.seed)
    sampler.start()
    server.clock = clock = WallClock()  # arrivals count from here
    sampler.origin = clock.t0
    try:
        result = server.serve(arrivals, more)
    except KeyboardInterrupt:  # Ctrl-C: keep every request that ended, as one-at-a-time capture does
        ended = [server.tracked[rid] for rid in server.finished]
        write_requests(writer, passes, ended, examples, task, tok, scored, whole_only=True)
        raise
    finally:
        counters = sampler.stop()
    write_requests(writer, result["passes"], result["requests"], examples, task, tok, scored)
    writer.set_counters(counters)
    extra = serving_summary(result)
    if load.rows_sweep:
        extra["rows_sweep"] = rows_sweep_meta(model, cfg.page_size, load.attention)
    return writer.close(extra)


def serving_meta(load: LoadConfig, server: Server) -> dict:
    """meta.json `serving`: the load and batch settings the run used."""
    return {
        "rate_per_s": load.rate if load.rate is None or math.isfinite(load.rate) else None,
        "concurrency": load.concurrency,
        "max_seqs": load.max_seqs,
        "max_batch_tokens": load.max_batch_tokens,
        "kv_budget_mib": load.kv_budget_mib,
        "pool_pages": server.pool_capacity_blocks,
        "pool_bytes": server.pool_capacity_blocks * server.store.page_bytes,
        "scheduler": load.scheduler,
        "chunked_prefill": load.chunked_prefill,
        "attention": load.attention,
        "arrivals": _arrivals_kind(load.rate),
    }


def load_arrivals(load: LoadConfig, prompts: list[str], seed: int):
    """(the first arrivals as (arrival_s, prompt), the closed loop's next-arrival callback or None)."""
    if load.rate is not None:
        return list(zip(poisson_arrivals(len(prompts), load.rate, seed), prompts)), None
    assert load.concurrency is not None  # LoadConfig holds exactly one of a rate and a concurrency
    first = min(load.concurrency, len(prompts))
    queue = list(prompts[first:])

    def more(rid: int, t: float):
        return (t, queue.pop(0)) if queue else None

    return [(0.0, p) for p in prompts[:first]], more


def rows_sweep_meta(model, page_size: int, attention: str) -> dict:
    """meta.json `rows_sweep` (`--rows-sweep`): the forward timed over rows x pool sizes."""
    from runtime.rows_sweep import REPS, idle_sweep, rows_sweep

    return {
        "what": "batched decode passes of R requests over a pool of S slots: forward only, median of reps "
        "(first_s: the shape's first pass)",
        "reps": REPS,
        "attention": attention,
        "passes": rows_sweep(model, page_size, attention),
        "after_idle": idle_sweep(model, page_size, attention),
    }


def write_requests(
    writer: TraceWriter,
    passes: list[PassRecord],
    tracked: list,
    examples: list,
    task,
    tok: Tokenizer,
    scored: bool,
    whole_only: bool = False,
) -> None:
    """Commit each of the `tracked` requests with its rows of `passes` and its tokens, after serving
    (nothing is written while requests are timed). `whole_only` (a run cut short): a request whose
    last pass was cut before it was recorded is left out rather than committed with rows missing."""
    steps: dict[int, list[dict]] = {}
    for rec in passes:
        for rid, rows in step_rows(rec).items():
            steps.setdefault(rid, []).extend(rows)
    for t in tracked:
        c, ex = t.completion, examples[t.request.request_id]
        rows = steps.get(c.request_id, [])
        if whole_only and sum(not row["chunk"] for row in rows) != c.steps:
            continue
        times = SimpleNamespace(
            start_s=t.start_s if not math.isnan(t.start_s) else t.end_s, first_token_s=t.first_token_s, end_s=t.end_s
        )
        quality = task.score(ex, c.text) if scored and c.status != "error" else math.nan
        row = request_row(ex, c, times, quality, t.arrival_s)
        row.update(
            queue_s=times.start_s - t.arrival_s,
            preemptions=t.preemptions,
            recompute_tokens=t.state.recompute_tokens if t.state else 0,
        )
        writer.add_request(row, rows, token_rows(c, tok), c.graph)


def serving_summary(result: dict) -> dict:
    """meta.json extras of a load run: wall time and the serving totals."""
    passes, reqs = result["passes"], result["requests"]
    wall = max((t.end_s for t in reqs), default=0.0)
    out_tokens = sum(len(t.completion.output_ids) for t in reqs)
    return {
        "wall_s": wall,
        "serving_summary": {
            "passes": len(passes),
            "preemptions": result["preemptions"],
            "recomputes": result["recomputes"],
            "recompute_tokens": result["recompute_tokens"],
            "mean_batch_requests": float(np.mean([len(p.entries) for p in passes])) if passes else 0.0,
            "max_batch_requests": max((len(p.entries) for p in passes), default=0),
            "errors": sum(t.completion.status == "error" for t in reqs),
            "output_tokens": out_tokens,
            "output_tokens_per_s": out_tokens / wall if wall > 0 else None,
        },
    }
