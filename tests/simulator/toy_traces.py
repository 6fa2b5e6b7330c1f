"""Toy traces with round numbers, written with `profiler.writer.write_trace`, for simulator tests.

Each request is a list of `P` (one forward pass). Builders give the shapes the systems produce:
sequential, PASTA (k threads batched into one pass per step), TIP (a dead step's KV freed) and
planned diffusion (spans denoised together, one token per span per step at steps_ratio 1).
The toy model: 2 layers, 2 KV heads of 16 dims, fp32, so 512 KV bytes per token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from profiler.writer import table_from_rows, write_trace
from simulator.cost import CostModel, CostParams
from simulator.hardware import override

PAGE = 16
MODEL_META = {
    "name": "toy-2l",
    "n_layers": 2,
    "d_model": 64,
    "n_heads": 4,
    "n_kv_heads": 2,
    "d_ff": 128,
    "vocab_size": 100,
    "dtype": "float32",
    "dtype_bytes": 4,
    "params": 0,
    "kv_bytes_per_token": 512,
}
KV_BYTES_PER_TOKEN = 512
BLOCK_BYTES = PAGE * KV_BYTES_PER_TOKEN  # 8192


@dataclass
class P:
    phase: str
    q: int
    kv: int
    live: int
    emits: int
    streams: int = 1
    evicted: int = 0


def seq(prompt: int, n: int) -> list[P]:
    return [P("prefill", prompt, prompt * (prompt + 1) // 2, prompt, 1)] + [
        P("decode", 1, prompt + i, prompt + i, 1) for i in range(1, n)
    ]


def second_turn(prompt: int, turn: int) -> list[P]:
    """A later prefill of the request's own (SoT's expansion, a second turn): its prompt, one
    decode, then `turn` more prompt tokens read causally after those, then one decode."""
    before = prompt + 1
    return [
        P("prefill", prompt, prompt * (prompt + 1) // 2, prompt, 1),
        P("decode", 1, before, before, 1),
        P("prefill", turn, turn * before + turn * (turn + 1) // 2, before + turn, 1),
        P("decode", 1, before + turn + 1, before + turn + 1, 1),
    ]


def pasta(prompt: int, k: int, length: int) -> list[P]:
    """Prefill (emits the promise), k threads of `length` tokens side by side, then one joined token."""
    out = [P("prefill", prompt, prompt * (prompt + 1) // 2, prompt, 1)]
    live = prompt + 1
    for j in range(length):
        live += k
        out.append(P("decode", k, k * (prompt + 1 + j + 1), live - 1, k, streams=k))
    out.append(P("decode", 1, live, live, 1))
    return out


def tip(prompt: int, steps: int, step_len: int) -> list[P]:
    """`steps` reasoning steps of `step_len` tokens, one register: each new step kills the previous one."""
    out = [P("prefill", prompt, prompt * (prompt + 1) // 2, prompt, 1)]
    live = prompt
    for i in range(1, steps * step_len):
        evicted = step_len if i % step_len == 0 and i >= 2 * step_len else 0
        live += 1 - evicted
        out.append(P("decode", 1, live, live, 1, evicted=evicted))
    return out


def planned_diffusion(prompt: int, plan: int, spans: list[int]) -> list[P]:
    """An AR plan of `plan` tokens, then every span denoised together, one token per span per step."""
    out = [P("prefill", prompt, prompt * (prompt + 1) // 2, prompt, 1)]
    out += [P("plan", 1, prompt + i, prompt + i, 1) for i in range(1, plan)]
    prefix = prompt + plan
    for j in range(max(spans)):
        active = [s for s in spans if s > j]
        out.append(
            P(
                "denoise",
                sum(active),
                sum(s * (prefix + s) for s in active),
                prefix + sum(spans),
                len(active),
                streams=len(active),
            )
        )
    return out


def write_toy_trace(
    path: Path,
    requests: list[list[P]],
    prompts: list[int],
    arrivals: list[float] | None = None,
    quality: list[float] | None = None,
    system: str = "toy",
    timed_by=None,
    device: dict | None = None,
) -> Path:
    """`timed_by`: a cost model; the passes then run one request after another (as `solm capture`
    does) and each takes exactly what that model predicts (logits of every row, as the runtime)."""
    arrivals = arrivals or [0.0] * len(requests)
    req_rows, step_rows, tok_rows, graphs = [], [], [], {}
    clock = 0.0
    for rid, passes in enumerate(requests):
        out_tokens = sum(p.emits for p in passes)
        n_tok = 0
        if timed_by is not None:
            arrivals[rid] = clock
        first_token_s = None
        for i, p in enumerate(passes):
            pages = -(-p.live // PAGE)
            duration = float(timed_by.step_time_s(p.q, p.kv, p.streams, p.q)) if timed_by is not None else 0.0
            start, clock = clock, clock + duration
            if first_token_s is None and p.emits:
                first_token_s = clock
            step_rows.append(
                {
                    "request_id": rid,
                    "step_index": i,
                    "batch_index": -1,
                    "phase": p.phase,
                    "start_s": start,
                    "duration_s": duration,
                    "streams": ",".join(str(s) for s in range(p.streams)),
                    "active_streams": p.streams,
                    "query_tokens": p.q,
                    "kv_tokens_read": p.kv,
                    "live_kv_tokens": p.live,
                    "kv_bytes_allocated": pages * BLOCK_BYTES,
                    "emitted_tokens": p.emits,
                    "evicted_tokens": p.evicted,
                    "freed_kv_bytes": 0,
                    "device_memory_bytes": -1,
                    "note": "",
                }
            )
            for s in range(p.emits):
                n_tok += 1
                tok_rows.append(
                    {
                        "request_id": rid,
                        "token_index": n_tok - 1,
                        "token_id": 1,
                        "token_text": "x",
                        "stream": s,
                        "step_index": i,
                        "position_id": 0,
                        "kv_slot": 0,
                        "kind": "content",
                        "visible_streams": [-1],
                        "evicted_at_step": -1,
                    }
                )
        req_rows.append(
            {
                "request_id": rid,
                "prompt": "p",
                "reference": "",
                "prompt_tokens": prompts[rid],
                "output_tokens": out_tokens,
                "output_text": "",
                "quality_score": (quality or [float("nan")] * len(requests))[rid],
                "arrival_s": arrivals[rid],
                "start_s": arrivals[rid],
                "ttft_s": (first_token_s or clock) - arrivals[rid] if timed_by is not None else 0.0,
                "e2e_s": clock - arrivals[rid] if timed_by is not None else 0.0,
                "steps": len(passes),
                "critical_path_tokens": len(passes),
                "theoretical_speedup": out_tokens / len(passes),
                "peak_live_kv_tokens": max(p.live for p in passes),
                "peak_kv_bytes": 0,
                "status": "ok",
                "stop_reason": "eos",
                "error": "",
                "events": "[]",
            }
        )
        graphs[rid] = {
            "directed": True,
            "multigraph": False,
            "graph": {},
            "links": [],
            "nodes": [{"id": "prompt", "kind": "prompt", "stream": -1, "tokens": prompts[rid]}],
        }
    tables: dict[str, pa.Table] = {
        "requests": table_from_rows("requests", req_rows),
        "steps": table_from_rows("steps", step_rows),
        "tokens": table_from_rows("tokens", tok_rows),
    }
    meta = {
        "kind": "measured",
        "system": system,
        "model": MODEL_META,
        "device": device or {"name": "toy", "type": "cpu", "threads": 2},
        "created_at": "2026-01-01T00:00:00+00:00",
        "task": "toy",
        "knobs": {},
    }
    return write_trace(path, meta, tables, graphs)


def toy_part(capacity_bytes: int = 2**30, **fields):
    """A made-up part on which every forward pass takes exactly 1 s (all rooflines ~0, 1 s overhead)."""
    # no chip layout (num_sms=None): GEMMs use the plain roofline, ~0 here, not the tile model
    return override(
        "h100-sxm",
        name="toy-part",
        peak_flops_per_s=1e30,
        hbm_bytes_per_s=1e30,
        launch_overhead_s=0.0,
        hbm_capacity_bytes=capacity_bytes,
        num_sms=None,
        **fields,
    )


def one_second_cost(hardware, model) -> CostModel:
    params = dataclasses.replace(CostParams.prior(hardware), step_overhead_s=1.0)
    return CostModel(hardware, model, params)


class LinearCost:
    """A cost object with round numbers: 1 s per pass + 0.25 s per query token (the replay's `cost` protocol)."""

    def step_time_s(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        return 1.0 + 0.25 * query_tokens
