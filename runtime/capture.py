"""Capture: run an engine over a task's held-out prompts and write a trace (format v1).

This is where the runtime meets the profiler: the engine yields steps, the recorder times them,
counters are sampled in the background, and each finished request is committed to the trace at
once (a capture cut short keeps every finished request).

`--repeats N` runs every request N times in interleaved rounds (every request once, then again):
each request is committed after its first run and refined as later rounds finish, so a capture
cut short keeps every request that ran once. The recorded runs (`--keep`) are laid on one
timeline (see `Rounds`), and every run's timings go to `runs.parquet` (`profiler.runs`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

from profiler.counters import CounterSampler
from profiler.errors import UsageError
from profiler.host import read_host_cpu
from profiler.provenance import git_commit, solm_version
from profiler.recorder import RecordedRun, Recorder, make_timer
from profiler.runs import run_rows, write_runs
from profiler.writer import TraceWriter
from runtime.answer_length import default_max_tokens
from runtime.checkpoint import load_model
from runtime.engines import Completion, GenerationConfig, Request, drain, get_engine
from runtime.engines.operating_points import check_knob_types
from runtime.hf_tokenizer import tokenizer_for
from runtime.model import TinyLM
from runtime.options import KEEP
from runtime.sampling import SamplingConfig
from runtime.tasks import Example, Task, get_task
from runtime.tokenizer import Tokenizer

NOT_APPLICABLE = (
    "not applicable: a model that does not speak the project's tokenizer (random real-scale "
    "weights, a transformers checkpoint, real GGUF weights) or a structure replayed from another trace"
)


@dataclass
class CaptureConfig:
    system: str = "sequential"
    model: str = ""  # "": the system's shipped model
    task: str = ""  # "": the system's default task
    n: int = 8
    split: str = "test"
    device: str = "cpu"
    seed: int = 0
    max_tokens: int | None = None  # None: room for the task's longest answer (runtime.answer_length)
    temperature: float = 0.0
    top_p: float = 1.0
    page_size: int = 16
    counters_interval_s: float = 0.05
    warmup: int = 1  # untimed requests run first (allocator, kernels and caches warm up), as serving benchmarks do
    repeats: int = 1  # runs of every request, in interleaved rounds; one of them is recorded (`keep`)
    keep: str = "min"  # which run of the repeats: "min" (fastest: the machine least disturbed) or "median"
    knobs: dict = field(default_factory=dict)  # engine-specific settings
    structure_from: str = ""  # a trace directory: replay its structure (runtime.structure_replay)

    def resolved(self) -> CaptureConfig:
        """Fill in the system's shipped model and default task (the engine class names them)."""
        from runtime.gguf import REAL_DEFAULT_TASK, is_gguf_spec

        engine = get_engine(self.system)
        model = self.model or engine.default_model
        default_task = REAL_DEFAULT_TASK if is_gguf_spec(model) and not self.structure_from else engine.default_task
        return CaptureConfig(**{**asdict(self), "model": model, "task": self.task or default_task})


def device_meta(device: str, sampler: CounterSampler) -> dict:
    from runtime.attention import strategy_in_force

    info = {
        "type": "cuda" if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        # how the eager passes' masked attention ran (SOLM_SDPA resolved for the device, runtime/attention.py)
        "sdpa": strategy_in_force(device.startswith("cuda")),
        **sampler.meta(),
    }
    if info["type"] == "cuda":
        idx = torch.device(device).index or 0
        info["name"] = torch.cuda.get_device_name(idx)
        info["memory_bytes"] = torch.cuda.get_device_properties(idx).total_memory
        if sampler.source == "nvml":
            try:
                info["driver"] = sampler._nvml.nvmlSystemGetDriverVersion()
            except Exception:
                info["driver"] = ""
    else:
        info["name"] = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
        info["threads"] = torch.get_num_threads()
        info["cpu"] = read_host_cpu()  # model, cores, clock at capture: what validation replays on
    return info


def model_meta(model: TinyLM, spec: str, info: dict) -> dict:
    c = model.cfg
    dtype = model.embed.weight.dtype
    return {
        "name": spec if not Path(spec).is_dir() else Path(spec).name,
        "preset": c.name,
        "n_layers": c.n_layers,
        "d_model": c.d_model,
        "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads,
        "d_ff": c.d_ff,
        "vocab_size": c.vocab_size,
        "dtype": str(dtype).replace("torch.", ""),
        "dtype_bytes": torch.empty((), dtype=dtype).element_size(),
        "params": model.num_parameters(),
        "kv_bytes_per_token": model.kv_bytes_per_token,
        "trained": bool(info.get("trained", True)),
        "checkpoint_info": info,
        **(
            extra() if (extra := getattr(model, "meta_extra", None)) else {}
        ),  # real architectures: head_dim, tied embeddings
    }


def provenance_meta(device: str, sampler: CounterSampler, timer_name: str, seed: int) -> dict:
    """Where and when a capture ran, and how it was timed and sampled (meta.json keys)."""
    return {
        "device": device_meta(device, sampler),
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        "solm_version": solm_version(),
        "git_commit": git_commit(),
        "seed": seed,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "timer": timer_name,
        "counters_source": sampler.source,
        "nvml": sampler.source == "nvml",
        "nvml_reason": sampler.reason,
    }


def request_row(ex: Example, c: Completion, rec, quality: float, arrival_s: float) -> dict:
    return {
        "request_id": c.request_id,
        "prompt": ex.prompt,
        "reference": ex.answer,
        "prompt_tokens": c.prompt_tokens,
        "output_tokens": len(c.output_ids),
        "output_text": c.text,
        "quality_score": quality,
        "arrival_s": arrival_s,
        "start_s": rec.start_s,
        "ttft_s": rec.first_token_s - arrival_s,
        "e2e_s": rec.end_s - arrival_s,
        "steps": c.steps,
        "critical_path_tokens": c.critical_path_tokens,
        "theoretical_speedup": c.theoretical_speedup,
        "peak_live_kv_tokens": c.peak_live_kv_tokens,
        "peak_kv_bytes": c.peak_kv_bytes,
        "status": c.status,
        "stop_reason": c.stop_reason,
        "error": c.error,
        "events": json.dumps(c.events),
    }


def token_rows(c: Completion, tok: Tokenizer) -> list[dict]:
    return [
        {
            "request_id": c.request_id,
            "token_index": i,
            "token_id": t.token_id,
            "token_text": tok.token_text(t.token_id),
            "stream": t.stream,
            "step_index": t.step_index,
            "position_id": t.position_id,
            "kv_slot": t.kv_slot,
            "kind": t.kind,
            "visible_streams": list(t.visible_streams),
            "evicted_at_step": t.evicted_at_step,
        }
        for i, t in enumerate(c.tokens)
    ]


def quality_applicable(info: dict, structure_from: str) -> bool:
    """Scored only when a solm model (trained or a preset, whose score is a real measurement) chooses
    its own tokens: a transformers model does not speak the project's tokenizer, and a replayed
    structure's text is the reference's, not the model's."""
    return "arch" not in info and "hf_dir" not in info and "gguf" not in info and not structure_from


def structure_scripts(cfg: CaptureConfig) -> tuple[list, dict]:
    """The reference requests to replay and the reference's meta, checked against the capture's
    system (one clear error)."""
    from profiler.validate import read_valid_trace
    from runtime.structure_replay import REPLAYABLE, scripts_of

    if cfg.system not in REPLAYABLE:
        raise UsageError(f"--structure-from supports {', '.join(REPLAYABLE)}, not {cfg.system!r}")
    ref = read_valid_trace(cfg.structure_from)  # a missing, corrupt or invalid trace: a TraceError, one line
    if ref.meta.get("system") != cfg.system:
        raise UsageError(
            f"--structure-from {cfg.structure_from} holds a {ref.meta.get('system')!r} trace, not {cfg.system!r}"
        )
    return scripts_of(ref.requests, ref.tokens)[: cfg.n], ref.meta


def check_config(cfg: CaptureConfig) -> None:
    """Bad settings, each one clear line (UsageError), before anything is loaded."""
    if cfg.n < 1:
        raise UsageError(f"--n must be >= 1, got {cfg.n}")
    if cfg.max_tokens is not None and cfg.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {cfg.max_tokens}")
    if cfg.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {cfg.warmup}")
    if cfg.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {cfg.repeats}")
    if cfg.keep not in KEEP:
        raise UsageError(f"--keep must be one of {', '.join(KEEP)}, got {cfg.keep!r}")
    check_knob_types(cfg.system, cfg.knobs)  # before a model is loaded
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cfg.device.startswith("cuda") and int(cfg.device.partition(":")[2] or 0) >= count:
        have = f"only {count}" if count else "no"
        raise UsageError(f"--device {cfg.device} asked for, but torch sees {have} CUDA device(s) (use --device cpu)")


def make_start(cfg: CaptureConfig, model, tok: Tokenizer, scripts: list | None):
    """`start(rid, example, script)`: a request's step generator, on the engine `cfg` names (or a
    replayer of `scripts`, the reference trace's structure)."""
    gen_cfg = GenerationConfig(
        max_tokens=default_max_tokens(cfg.task) if cfg.max_tokens is None else cfg.max_tokens,
        page_size=cfg.page_size,
        sampling=SamplingConfig(cfg.temperature, cfg.top_p, cfg.seed),
    )
    if scripts is not None:
        from runtime.structure_replay import check_token_ids

        check_token_ids(scripts, getattr(model, "logits_vocab", None) or model.cfg.vocab_size, cfg.structure_from)
    try:
        if scripts is None:
            engine = get_engine(cfg.system)(model, tok, gen_cfg, **cfg.knobs)
            return lambda rid, ex, script: engine.run(Request(rid, ex.prompt))
        from runtime.structure_replay import Replayer

        replayer = Replayer(cfg.system, model, tok, gen_cfg, **cfg.knobs)
        return lambda rid, ex, script: replayer.run(Request(rid, ex.prompt), script)
    except (TypeError, ValueError) as e:  # an unknown knob for this engine, or a value it refuses
        raise UsageError(f"bad knob for {cfg.system}: {e}") from None


def workload(cfg: CaptureConfig, task, scripts: list | None) -> tuple[list[Example], list[tuple]]:
    """The recorded examples, and the untimed warm-up runs as (example, script) pairs."""
    if scripts is None:
        warm = [(ex, None) for ex in task.examples("train", cfg.warmup, cfg.seed)] if cfg.warmup else []
        return task.examples(cfg.split, cfg.n, cfg.seed), warm
    examples = [Example(sc.prompt, sc.answer) for sc in scripts]  # the reference's; warm up on its first
    return examples, [(examples[0], scripts[0])] * cfg.warmup


@dataclass
class Run:
    """One timed run of one request, on the capture's clock."""

    round: int
    arrival_s: float
    gap_s: float  # since the end of the run before it in its round: the host's work between requests
    rec: RecordedRun

    @property
    def e2e_s(self) -> float:
        return self.rec.end_s - self.arrival_s


def shifted(rec: RecordedRun, by_s: float, first_batch: int) -> RecordedRun:
    """`rec` moved `by_s` seconds along the clock, its passes renumbered from `first_batch`."""
    rows = [
        {**row, "start_s": row["start_s"] + by_s, "batch_index": first_batch + j} for j, row in enumerate(rec.step_rows)
    ]
    return RecordedRun(rec.result, rows, rec.start_s + by_s, rec.first_token_s + by_s, rec.end_s + by_s)


class Rounds:
    """Every run of every request so far, the run each request records (`keep`), and the one
    timeline the recorded runs are laid on: in request order, request 0 arriving when it first
    did, each next one after the one before it ended plus the gap measured before it in its own
    round. Arrivals never go back in time whichever round a recorded run came from, and with one
    run per request the timeline is the measured one."""

    def __init__(self, n: int, keep: str) -> None:
        self.runs: list[list[Run]] = [[] for _ in range(n)]
        self.keep = keep
        self._last_end: float | None = None

    def add(self, rid: int, round_: int, arrival_s: float, rec: RecordedRun) -> None:
        gap = arrival_s - self._last_end if rid and self._last_end is not None else 0.0
        self.runs[rid].append(Run(round_, arrival_s, gap, rec))
        self._last_end = rec.end_s

    def kept(self, rid: int) -> Run:
        by_latency = sorted(self.runs[rid], key=lambda r: r.e2e_s)
        return by_latency[KEEP[self.keep](len(by_latency))]

    def laid(self, upto: int) -> list[tuple[Run, float, RecordedRun]]:
        """(kept run, arrival, the run moved onto the timeline) of requests 0..upto-1."""
        out: list[tuple[Run, float, RecordedRun]] = []
        end, batch = 0.0, 0
        for rid in range(upto):
            k = self.kept(rid)
            arrival = self.runs[0][0].arrival_s if rid == 0 else end + k.gap_s
            moved = shifted(k.rec, arrival - k.arrival_s, batch)
            out.append((k, arrival, moved))
            end, batch = moved.end_s, batch + len(moved.step_rows)
        return out

    def diverged(self) -> int:
        """Runs whose output differs from their request's first run."""
        return sum(r.rec.result.output_ids != rr[0].rec.result.output_ids for rr in self.runs for r in rr[1:])

    def table_rows(self) -> list[dict]:
        """Every run's timings (profiler.runs), on the capture's real clock."""
        rows: list[dict] = []
        for rid, rr in enumerate(self.runs):
            kept = self.kept(rid) if rr else None
            for r in rr:
                rows += run_rows(
                    rid,
                    r.round,
                    r.arrival_s,
                    r.rec.first_token_s - r.arrival_s,
                    r.e2e_s,
                    r.rec.step_rows,
                    r is kept,
                    r.rec.result.output_ids == rr[0].rec.result.output_ids,
                )
        return rows

    def meta(self, repeats: int) -> dict:
        """How much the runs of one request differed (the machine's noise), for meta.json."""
        full = [sorted(r.e2e_s for r in rr) for rr in self.runs if len(rr) == repeats]
        spread = sorted((x[-1] - x[0]) / x[KEEP["median"](repeats)] for x in full)
        return {
            "runs_per_request": repeats,
            "recorded": f"the {self.keep} end-to-end latency run",
            "rounds": "interleaved: every request once, then again",
            "diverged_runs": self.diverged(),
            "timeline": "recorded runs laid end to end in request order, each after the gap measured before it in "
            "its own round (the counters keep the real clock)",
            "every_run": "runs.parquet (profiler.runs.single_run gives the trace as the first round saw it)",
            "e2e_spread_percent_median": round(100 * spread[len(spread) // 2], 2) if spread else None,
            "e2e_spread_percent_max": round(100 * spread[-1], 2) if spread else None,
        }


@dataclass
class Session:
    """What one capture commits with: its writer, scorer and the state of every request."""

    writer: TraceWriter
    task: Task
    tok: Tokenizer
    examples: list[Example]
    scored: bool
    rounds: Rounds
    committed: dict = field(default_factory=dict)  # rid -> (kept Run, arrival) as written

    def commit(self, upto: int) -> None:
        """Write requests 0..upto-1 whose recorded run or place on the timeline changed."""
        for rid, (kept, arrival, rec) in enumerate(self.rounds.laid(upto)):
            if self.committed.get(rid, (None, None))[0] is kept and self.committed[rid][1] == arrival:
                continue
            ex, c = self.examples[rid], rec.result
            quality = self.task.score(ex, c.text) if self.scored and c.status != "error" else math.nan
            self.writer.add_request(
                request_row(ex, c, rec, quality, arrival),
                rec.step_rows,
                token_rows(c, self.tok),
                c.graph,
                replace=rid in self.committed,
            )
            self.committed[rid] = (kept, arrival)


def _not_applicable_note(task_name: str) -> str:
    task = get_task(task_name)
    return NOT_APPLICABLE if task.scored else task.quality_note  # a task with no exact scorer says so itself


def capture_meta(cfg: CaptureConfig, model, info: dict, sampler: CounterSampler, timer_name: str, scored: bool) -> dict:
    return {
        "kind": "measured",
        "system": cfg.system,
        "knobs": {
            **cfg.knobs,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "page_size": cfg.page_size,
        },
        "task": cfg.task,
        "split": cfg.split,
        "model": model_meta(model, cfg.model, info),
        **provenance_meta(cfg.device, sampler, timer_name, cfg.seed),
        "quality_applicable": scored,
        "quality_note": "" if scored else _not_applicable_note(cfg.task),
        "structure_source": cfg.structure_from or "the model's own tokens",
        "engine_settings": engine_settings(cfg),
        "warmup_requests": cfg.warmup,
        "runs_per_request": cfg.repeats,
    }


def engine_settings(cfg: CaptureConfig) -> dict:
    """Every keyword setting the engine ran with: its defaults (a shipped operating point among
    them) overlaid with the knobs given (`knobs` holds only those)."""
    from runtime.engines.operating_points import engine_defaults

    plain = (type(None), bool, int, float, str)
    return {**{k: v for k, v in engine_defaults(cfg.system).items() if isinstance(v, plain)}, **cfg.knobs}


def run_rounds(cfg: CaptureConfig, s: Session, start, scripts: list | None, recorder: Recorder, sampler, bar) -> None:
    """Every request once (each committed as it finishes), then again in later rounds (the
    recorded runs refined and every run's timings saved as each round finishes)."""
    try:
        for round_ in range(cfg.repeats):  # rounds interleave requests, so a slow spell of the machine
            for rid, ex in enumerate(s.examples):  # hits different requests in different rounds
                arrival = recorder.now_s()
                s.rounds.add(rid, round_, arrival, recorder.run(start(rid, ex, scripts[rid] if scripts else None)))
                if bar:
                    bar.update(1)
                if round_ == 0:
                    s.commit(rid + 1)
                    s.writer.set_counters(sampler.snapshot())
            if round_:
                s.commit(len(s.examples))
                write_runs(s.writer.dir, s.rounds.table_rows())
                s.writer.set_counters(sampler.snapshot())
    finally:
        if cfg.repeats > 1 and any(s.rounds.runs):  # a run cut short keeps the runs of its unfinished round too
            write_runs(s.writer.dir, s.rounds.table_rows())


def capture(
    cfg: CaptureConfig, out: str | Path, overwrite: bool = False, progress: bool = True, loaded: tuple | None = None
) -> Path:
    """Run `cfg` and write its trace to `out`. `loaded`: an already loaded (model, info) to use
    instead of loading `cfg.model` (bench/gpu_capture.py loads an 8B model once for every system)."""
    cfg = cfg.resolved()
    check_config(cfg)
    scripts = None
    if cfg.structure_from:
        scripts, ref_meta = structure_scripts(cfg)
        cfg = CaptureConfig(
            **{**asdict(cfg), "task": ref_meta.get("task") or cfg.task, "split": ref_meta.get("split") or cfg.split}
        )
    task = get_task(cfg.task)
    if cfg.max_tokens is None:
        cfg = CaptureConfig(**{**asdict(cfg), "max_tokens": default_max_tokens(cfg.task)})
    model, info = loaded or load_model(cfg.model, cfg.device, seed=cfg.seed)
    tok = tokenizer_for(model, structure_replay=scripts is not None)  # a real model: its own tokenizer
    start = make_start(cfg, model, tok, scripts)
    examples, warm = workload(cfg, task, scripts)
    scored = quality_applicable(info, cfg.structure_from) and task.scored
    timer = make_timer(cfg.device)
    origin = timer.now()
    sampler = CounterSampler(cfg.counters_interval_s, origin=origin, use_nvml=cfg.device.startswith("cuda"))
    memory_fn = (lambda: torch.cuda.memory_allocated()) if cfg.device.startswith("cuda") else None
    recorder = Recorder(timer, memory_fn, origin=origin)
    meta = capture_meta(cfg, model, info, sampler, timer.name, scored)
    for i, (ex, script) in enumerate(warm):  # same engine and settings, nothing recorded
        drain(start(-1 - i, ex, script))
    session = Session(
        TraceWriter(out, meta, overwrite=overwrite), task, tok, examples, scored, Rounds(len(examples), cfg.keep)
    )
    sampler.start()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=len(examples) * cfg.repeats, desc=f"capture {cfg.system}", unit="run", leave=False, disable=None
        )
    try:
        run_rounds(cfg, session, start, scripts, recorder, sampler, bar)
    finally:
        if bar:
            bar.close()
        rows = sampler.stop()
    extra = {"wall_s": recorder.now_s(), "finished_at": datetime.now(UTC).isoformat(timespec="seconds")}
    if cfg.repeats > 1:
        extra["repeats"] = session.rounds.meta(cfg.repeats)
    session.writer.set_counters(rows)
    return session.writer.close(extra)
