"""What every engine shares: requests in, `Step` records out, a `Completion` at the end.

An engine is a generator (`Engine.run(request)`): it yields one `Step` per forward pass and
returns a `Completion` (the generator's return value). It never writes files and never times
itself; the profiler's recorder wraps the step stream and does both.

Per-token bookkeeping is a list of `TokenRecord`s: each generated token's stream, position, KV
slot, the streams it could see and the step it was evicted at, filled in as the engine learns
them (a token's slot is known when it is fed back, its eviction later still).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np
import torch

from profiler.errors import UsageError
from runtime.kv import PagedKVStore
from runtime.model import TinyLM
from runtime.sampling import SamplingConfig
from runtime.tokenizer import Tokenizer

@dataclass(frozen=True)
class Request:
    request_id: int
    prompt: str


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 128
    stop_tokens: tuple[int, ...] = ()
    sampling: SamplingConfig = SamplingConfig()
    page_size: int = 16

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise UsageError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.page_size < 1:
            raise UsageError(f"page_size must be >= 1, got {self.page_size}")


@dataclass
class Step:
    """One forward pass. Column names match `steps.parquet` (timing is the recorder's)."""

    request_id: int
    step_index: int
    phase: str
    streams: tuple[int, ...]  # streams with a query row in this pass
    query_tokens: int
    kv_tokens_read: int  # sum over query rows of the slots each row could see
    live_kv_tokens: int  # after the step
    kv_bytes_allocated: int  # after the step
    emitted: tuple[int, ...] = ()  # token ids produced by this pass
    evicted_tokens: int = 0
    freed_kv_bytes: int = 0
    note: str = ""

    def as_row(self) -> dict:
        return {
            "request_id": self.request_id,
            "step_index": self.step_index,
            "phase": self.phase,
            "streams": ",".join(map(str, self.streams)),
            "active_streams": len(self.streams),
            "query_tokens": self.query_tokens,
            "kv_tokens_read": self.kv_tokens_read,
            "live_kv_tokens": self.live_kv_tokens,
            "kv_bytes_allocated": self.kv_bytes_allocated,
            "emitted_tokens": len(self.emitted),
            "evicted_tokens": self.evicted_tokens,
            "freed_kv_bytes": self.freed_kv_bytes,
            "note": self.note,
        }


@dataclass
class TokenRecord:
    token_id: int
    stream: int
    step_index: int
    position_id: int
    kind: str = "content"  # content, tag, plan, mask, pad
    kv_slot: int = -1  # -1: its K/V was never written (e.g. the final <eos>)
    visible_streams: tuple[int, ...] = ()
    evicted_at_step: int = -1


@dataclass
class Completion:
    request_id: int
    prompt_tokens: int
    output_ids: list[int]  # final text order
    text: str
    tokens: list[TokenRecord]  # final text order
    graph: dict  # networkx node-link dict of the chunk DAG
    critical_path_tokens: int
    steps: int
    peak_live_kv_tokens: int
    peak_kv_bytes: int
    status: str = "ok"  # ok, truncated, error
    stop_reason: str = ""
    error: str = ""
    events: list[dict] = field(default_factory=list)  # recorded fallbacks and guard hits

    @property
    def theoretical_speedup(self) -> float:
        return len(self.output_ids) / max(1, self.critical_path_tokens)


class Engine:
    """Base: holds the model, tokenizer and settings; subclasses implement `run`."""

    name = "base"
    default_model = ""  # shipped checkpoint `solm capture` uses when --model is not given
    default_task = ""

    def __init__(self, model: TinyLM, tokenizer: Tokenizer, config: GenerationConfig = GenerationConfig()) -> None:
        self.model = model
        self.tok = tokenizer
        self.config = config
        self.device = model.embed.weight.device

    def new_store(self) -> PagedKVStore:
        return self.model.new_kv_store(page_size=self.config.page_size)

    def prompt_ids(self, request: Request) -> list[int]:
        if hasattr(self.tok, "chat_ids"):  # a real model's tokenizer: its own chat template
            return self.tok.chat_ids(request.prompt)
        return [self.tok.bos_id, *self.tok.encode(request.prompt), self.tok.token_id("<sep>")]

    def is_stop(self, token_id: int) -> bool:
        return (token_id == self.tok.eos_id or token_id in self.config.stop_tokens
                or token_id in getattr(self.tok, "stop_ids", ()))  # a real model may have several

    def run(self, request: Request) -> Generator[Step, None, Completion]:
        raise NotImplementedError

    def generate(self, request: Request) -> Completion:
        """Run to the end without recording (tests, quick use)."""
        return drain(self.run(request))[1]

    def tensor(self, xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.long, device=self.device)


def drain(gen: Generator[Step, None, Completion]) -> tuple[list[Step], Completion]:
    """Run an engine's step generator (`Engine.run`, a structure replay) to the end: its steps and
    the completion it returns."""
    steps: list[Step] = []
    while True:
        try:
            steps.append(next(gen))
        except StopIteration as stop:
            return steps, stop.value


def visibility_rows(rows: list[list[int]], num_slots: int, device: torch.device) -> torch.Tensor:
    """Bool (R, S) from per-row lists of visible slots (built in numpy: a per-row torch index
    assignment cost about 4x as much, a visible share of a tiny model's pass)."""
    vis = np.zeros((len(rows), num_slots), dtype=bool)
    for r, slots in enumerate(rows):
        vis[r, slots] = True
    return torch.from_numpy(vis).to(device)


def linear_graph(prompt_tokens: int, output_tokens: int) -> dict:
    """Chunk DAG of a request with no parallel structure: prompt -> main."""
    return {
        "directed": True,
        "multigraph": False,
        "graph": {},
        "nodes": [
            {"id": "prompt", "kind": "prompt", "stream": -1, "tokens": prompt_tokens},
            {"id": "main:0", "kind": "main", "stream": 0, "tokens": output_tokens},
        ],
        "links": [{"source": "prompt", "target": "main:0"}],
    }
