"""Capture: run an engine over a task's held-out prompts and write a trace (format v1).

This is where the runtime meets the profiler: the engine yields steps, the recorder times them,
counters are sampled in the background, and each finished request is committed to the trace at
once (a capture cut short keeps every finished request).
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from profiler.counters import CounterSampler
from profiler.recorder import Recorder, make_timer
from profiler.writer import TraceWriter
from runtime.checkpoint import REPO_ROOT, load_model
from runtime.engines import Completion, GenerationConfig, Request, drain, get_engine
from runtime.hf_tokenizer import tokenizer_for
from runtime.model import TinyLM
from runtime.sampling import SamplingConfig
from runtime.tasks import Example, get_task
from runtime.tokenizer import Tokenizer

# which of a request's repeated runs is recorded: index into its runs sorted by latency
KEEP = {"min": lambda n: 0, "median": lambda n: (n - 1) // 2}

NOT_APPLICABLE = ("not applicable: a model that does not speak the project's tokenizer (random real-scale "
                  "weights, a transformers checkpoint, real GGUF weights) or a structure replayed from another trace")


@dataclass
class CaptureConfig:
    system: str = "sequential"
    model: str = ""  # "": the system's shipped model
    task: str = ""  # "": the system's default task
    n: int = 8
    split: str = "test"
    device: str = "cpu"
    seed: int = 0
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    page_size: int = 16
    counters_interval_s: float = 0.05
    warmup: int = 1  # untimed requests run first (allocator, kernels and caches warm up), as serving benchmarks do
    repeats: int = 1  # runs of every request, in interleaved rounds; one of them is recorded (`keep`)
    keep: str = "min"  # which run of the repeats: "min" (fastest: the machine least disturbed) or "median"
    knobs: dict = field(default_factory=dict)  # engine-specific settings
    structure_from: str = ""  # a trace directory: replay its structure (runtime.structure_replay)

    def resolved(self) -> "CaptureConfig":
        """Fill in the system's shipped model and default task (the engine class names them)."""
        from runtime.gguf import REAL_DEFAULT_TASK, is_gguf_spec

        engine = get_engine(self.system)
        model = self.model or engine.default_model
        default_task = REAL_DEFAULT_TASK if is_gguf_spec(model) and not self.structure_from else engine.default_task
        return CaptureConfig(**{**asdict(self), "model": model, "task": self.task or default_task})


def solm_version() -> str:
    try:
        from importlib.metadata import version

        return version("solm")
    except Exception:  # not installed: running from a checkout
        return "0.1.0+checkout"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def device_meta(device: str, sampler: CounterSampler) -> dict:
    info = {"type": "cuda" if device.startswith("cuda") else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda or "", **sampler.meta()}
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
    return info


def model_meta(model: TinyLM, spec: str, info: dict) -> dict:
    c = model.cfg
    dtype = model.embed.weight.dtype
    return {
        "name": spec if not Path(spec).is_dir() else Path(spec).name, "preset": c.name,
        "n_layers": c.n_layers, "d_model": c.d_model, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads,
        "d_ff": c.d_ff, "vocab_size": c.vocab_size, "dtype": str(dtype).replace("torch.", ""),
        "dtype_bytes": torch.empty((), dtype=dtype).element_size(), "params": model.num_parameters(),
        "kv_bytes_per_token": model.kv_bytes_per_token, "trained": bool(info.get("trained", True)),
        "checkpoint_info": info,
        **(model.meta_extra() if hasattr(model, "meta_extra") else {}),  # real architectures: head_dim, tied embeddings
    }


def provenance_meta(device: str, sampler: CounterSampler, timer_name: str, seed: int) -> dict:
    """Where and when a capture ran, and how it was timed and sampled (meta.json keys)."""
    return {
        "device": device_meta(device, sampler),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(), "cores": os.cpu_count(),
                 "python": platform.python_version()},
        "solm_version": solm_version(), "git_commit": git_commit(), "seed": seed,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "timer": timer_name,
        "counters_source": sampler.source, "nvml": sampler.source == "nvml", "nvml_reason": sampler.reason,
    }


def request_row(ex: Example, c: Completion, rec, quality: float, arrival_s: float) -> dict:
    return {
        "request_id": c.request_id, "prompt": ex.prompt, "reference": ex.answer,
        "prompt_tokens": c.prompt_tokens, "output_tokens": len(c.output_ids), "output_text": c.text,
        "quality_score": quality, "arrival_s": arrival_s, "start_s": rec.start_s,
        "ttft_s": rec.first_token_s - arrival_s, "e2e_s": rec.end_s - arrival_s, "steps": c.steps,
        "critical_path_tokens": c.critical_path_tokens, "theoretical_speedup": c.theoretical_speedup,
        "peak_live_kv_tokens": c.peak_live_kv_tokens, "peak_kv_bytes": c.peak_kv_bytes,
        "status": c.status, "stop_reason": c.stop_reason, "error": c.error, "events": json.dumps(c.events),
    }


def token_rows(c: Completion, tok: Tokenizer) -> list[dict]:
    return [
        {"request_id": c.request_id, "token_index": i, "token_id": t.token_id, "token_text": tok.token_text(t.token_id),
         "stream": t.stream, "step_index": t.step_index, "position_id": t.position_id, "kv_slot": t.kv_slot,
         "kind": t.kind, "visible_streams": list(t.visible_streams), "evicted_at_step": t.evicted_at_step}
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
    from profiler.reader import read_trace
    from runtime.structure_replay import REPLAYABLE, read_scripts

    if cfg.system not in REPLAYABLE:
        raise ValueError(f"--structure-from supports {', '.join(REPLAYABLE)}, not {cfg.system!r}")
    ref = read_trace(cfg.structure_from)  # a missing or corrupt trace is a TraceError, one line
    if ref.meta.get("system") != cfg.system:
        raise ValueError(f"--structure-from {cfg.structure_from} holds a {ref.meta.get('system')!r} trace, "
                         f"not {cfg.system!r}")
    return read_scripts(cfg.structure_from)[: cfg.n], ref.meta


def capture(cfg: CaptureConfig, out: str | Path, overwrite: bool = False, progress: bool = True,
            loaded: tuple | None = None) -> Path:
    """Run `cfg` and write its trace to `out`. `loaded`: an already loaded (model, info) to use
    instead of loading `cfg.model` (bench/gpu_capture.py loads an 8B model once for every system)."""
    cfg = cfg.resolved()
    if cfg.n < 1:
        raise ValueError(f"--n must be >= 1, got {cfg.n}")
    if cfg.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {cfg.warmup}")
    if cfg.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {cfg.repeats}")
    if cfg.keep not in KEEP:
        raise ValueError(f"--keep must be one of {', '.join(KEEP)}, got {cfg.keep!r}")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    engine_cls = get_engine(cfg.system)
    scripts = None
    if cfg.structure_from:
        scripts, ref_meta = structure_scripts(cfg)
        cfg = CaptureConfig(**{**asdict(cfg), "task": ref_meta.get("task") or cfg.task,
                               "split": ref_meta.get("split") or cfg.split})
    task = get_task(cfg.task)
    model, info = loaded or load_model(cfg.model, cfg.device, seed=cfg.seed)
    tok = tokenizer_for(model, structure_replay=scripts is not None)  # a real model: its own tokenizer
    gen_cfg = GenerationConfig(max_tokens=cfg.max_tokens, page_size=cfg.page_size,
                               sampling=SamplingConfig(cfg.temperature, cfg.top_p, cfg.seed))
    try:
        if scripts is None:
            engine = engine_cls(model, tok, gen_cfg, **cfg.knobs)
        else:
            from runtime.structure_replay import Replayer

            replayer = Replayer(cfg.system, model, tok, gen_cfg, **cfg.knobs)
    except TypeError as e:  # an unknown knob for this engine
        raise ValueError(f"bad knob for {cfg.system}: {e}") from None
    # `start(rid, example, script)`: a request's step generator; `warm`: untimed (example, script) runs
    if scripts is None:
        examples = task.examples(cfg.split, cfg.n, cfg.seed)
        warm = [(ex, None) for ex in task.examples("train", cfg.warmup, cfg.seed)] if cfg.warmup else []

        def start(rid: int, ex: Example, script):
            return engine.run(Request(rid, ex.prompt))
    else:  # the reference's prompts and structure; warm up on its first request
        examples = [Example(sc.prompt, sc.answer) for sc in scripts]
        warm = [(examples[0], scripts[0])] * cfg.warmup

        def start(rid: int, ex: Example, script):
            return replayer.run(Request(rid, ex.prompt), script)
    scored = quality_applicable(info, cfg.structure_from) and task.scored

    timer = make_timer(cfg.device)
    origin = timer.now()
    sampler = CounterSampler(cfg.counters_interval_s, origin=origin, use_nvml=cfg.device.startswith("cuda"))
    memory_fn = (lambda: torch.cuda.memory_allocated()) if cfg.device.startswith("cuda") else None
    recorder = Recorder(timer, memory_fn, origin=origin)
    meta = {
        "kind": "measured", "system": cfg.system, "knobs": {**cfg.knobs, "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature, "top_p": cfg.top_p, "page_size": cfg.page_size},
        "task": cfg.task, "split": cfg.split, "model": model_meta(model, cfg.model, info),
        **provenance_meta(cfg.device, sampler, timer.name, cfg.seed),
        "quality_applicable": scored, "quality_note": "" if scored else (NOT_APPLICABLE if task.scored else task.quality_note),
        "structure_source": cfg.structure_from or "the model's own tokens",
    }
    for i, (ex, script) in enumerate(warm):  # same engine and settings, nothing recorded
        drain(start(-1 - i, ex, script))
    meta["warmup_requests"] = cfg.warmup
    meta["runs_per_request"] = cfg.repeats
    writer = TraceWriter(out, meta, overwrite=overwrite)
    sampler.start()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(examples) * cfg.repeats, desc=f"capture {cfg.system}", unit="run", leave=False, disable=None)
    runs: list[list] = [[] for _ in examples]  # per request: (e2e, arrival, recorded run) of each round so far
    diverged = 0
    try:
        for round_ in range(cfg.repeats):  # rounds interleave requests, so a slow spell of the machine
            for rid, ex in enumerate(examples):  # hits different requests in different rounds
                arrival = recorder.now_s()
                rec = recorder.run(start(rid, ex, scripts[rid] if scripts else None))
                if runs[rid] and rec.result.output_ids != runs[rid][0][2].result.output_ids:
                    diverged += 1
                runs[rid].append((rec.end_s - arrival, arrival, rec))
                if bar:
                    bar.update(1)
                if round_ < cfg.repeats - 1:
                    continue
                runs[rid].sort(key=lambda r: r[0])  # by latency
                _, arrival, rec = runs[rid][KEEP[cfg.keep](cfg.repeats)]
                c: Completion = rec.result
                quality = task.score(ex, c.text) if scored and c.status != "error" else math.nan
                writer.add_request(request_row(ex, c, rec, quality, arrival), rec.step_rows, token_rows(c, tok), c.graph)
                writer.set_counters(sampler.snapshot())
    finally:
        if bar:
            bar.close()
        rows = sampler.stop()
    extra = {"wall_s": recorder.now_s(), "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if cfg.repeats > 1:  # how much the runs of one request differed: the machine's noise, kept in the record
        mid = KEEP["median"](cfg.repeats)  # each finished request's runs are sorted by latency
        spread = sorted((rr[-1][0] - rr[0][0]) / rr[mid][0] for rr in runs if len(rr) == cfg.repeats)
        extra["repeats"] = {
            "runs_per_request": cfg.repeats, "recorded": f"the {cfg.keep} end-to-end latency run",
            "rounds": "interleaved: every request once, then again", "diverged_runs": diverged,
            "e2e_spread_percent_median": round(100 * spread[len(spread) // 2], 2) if spread else None,
            "e2e_spread_percent_max": round(100 * spread[-1], 2) if spread else None}
    writer.set_counters(rows)
    return writer.close(extra)
