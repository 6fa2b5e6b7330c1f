"""What every engine shares: requests in, `Step` records out, a `Completion` at the end.

An engine is a generator (`Engine.run(request)`): it yields one `Step` per forward pass and
returns a `Completion` (the generator's return value). It never writes files and never times
itself; the profiler's recorder wraps the step stream and does both.

Per-token bookkeeping is a list of `TokenRecord`s: each generated token's stream, position, KV
slot, the streams it could see and the step it was evicted at, filled in as the engine learns
them (a token's slot is known when it is fed back, its eviction later still).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from profiler.errors import UsageError
from runtime.kv import PagedKVStore, RequestKV
from runtime.model import TinyLM, check_fits
from runtime.sampling import SamplingConfig
from runtime.tokenizer import Tokenizer

if TYPE_CHECKING:  # the transformers adapter is an optional extra
    from runtime.hf_adapter import HFCausalLM


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
    host_s: float = float("nan")  # the engine's own work in the pass (`inputs()` + `after()`), not the forward
    forward_s: float = float("nan")  # the pass's forward alone (the model's call; device synchronised)

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
            "host_s": self.host_s,
            "forward_s": self.forward_s,
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


@dataclass
class PassInputs:
    """The query rows one request puts in the next forward pass.

    `cols` are the request's own KV slots its rows may look at (T,); `vis[r, t]` says whether row r
    sees `cols[t]` (R, T). A server concatenates the rows of many requests into one pass; a row never
    sees another request's slots. `skip` leading rows have their logits unused (a recompute's replay,
    or every row of a prefill chunk); `replayed` leading rows are a recompute's replay, whose
    attention was scored when they first ran (H2O does not count it again).
    """

    ids: list[int]
    positions: list[int]
    slots: list[int]  # where each row's K/V is written
    cols: np.ndarray  # (T,) int64
    vis: np.ndarray  # (R, T) bool
    phase: str
    attention: bool = False  # the request wants the attention each slot received (H2O)
    skip: int = 0
    replayed: int = 0

    @property
    def rows(self) -> int:
        return len(self.ids)

    @property
    def kv_read(self) -> int:
        """Sum over the request's rows (replay rows excluded) of the slots each row sees."""
        return int(self.vis[self.skip :].sum())


def causal_inputs(ids: list[int], positions: list[int], slots: list[int], phase: str, start: int = 0) -> PassInputs:
    """`slots[start:]` are new tokens, each seeing every slot before it and itself (a prefill)."""
    T, R = len(slots), len(slots) - start
    vis = np.tri(T, dtype=bool)[start:] if R != 1 else np.ones((1, T), dtype=bool)
    return PassInputs(ids, positions, slots[start:], np.asarray(slots, dtype=np.int64), vis, phase)


def prepend(replay: PassInputs | None, inp: PassInputs) -> PassInputs:
    """A recompute's replay rows (`replay`) in front of the request's next rows (the columns are
    the union of both, each slot once)."""
    if replay is None or not replay.rows:
        return inp
    extra = np.setdiff1d(replay.cols, inp.cols, assume_unique=True)
    cols = np.concatenate([inp.cols, extra])
    where = {int(c): j for j, c in enumerate(cols)}
    R1, R2 = replay.rows, inp.rows
    vis = np.zeros((R1 + R2, len(cols)), dtype=bool)
    vis[:R1, [where[int(c)] for c in replay.cols]] = replay.vis
    vis[R1:, : len(inp.cols)] = inp.vis
    return PassInputs(
        replay.ids + inp.ids,
        replay.positions + inp.positions,
        replay.slots + inp.slots,
        cols,
        vis,
        inp.phase,
        inp.attention,
        skip=R1,
        replayed=R1,
    )


class RequestState:
    """One request in flight: `inputs()` -> the query rows of its next pass (allocating the slots they
    write), a forward pass elsewhere, `after(logits, attention)` -> the pass's `Step`; `done` once the
    request has finished, `completion()` its result. `release()` frees every page it holds (it finished
    or was preempted); `readmit()` after a preemption makes the next pass re-prefill what it held
    (vLLM's RECOMPUTE). `Engine.run` drives one alone; `runtime.server` drives many over one pool."""

    eng: Engine  # the engine that runs it (each state class names its own engine class)
    kv: RequestKV
    n: int  # prompt tokens
    done: bool = False
    passes_done: int = 0  # passes whose `after` ran (a server counts them)
    recomputes: int = 0  # readmissions after a preemption
    recompute_tokens: int = 0  # tokens re-prefilled by them
    prompt_owner: Hashable | None = None  # the store owner of the prompt's pages
    inp: PassInputs  # the rows of the pass in flight (a re-prefill's replay first), set by inputs()
    _replay: PassInputs | None = None

    def inputs(self) -> PassInputs:
        inp = self.next_inputs()
        replay, self._replay = self._replay, None
        self.inp = prepend(replay, inp)  # what `after` reads its rows from
        return self.inp

    # ------------------------------------------------------------------ chunked prefill
    def prompt_tokens(self) -> int:
        return self.n

    def max_kv_tokens(self) -> int:
        """The most KV tokens the request may hold at once (a server's peak reservation)."""
        return self.n + self.eng.config.max_tokens

    def prompt_left(self) -> int:
        """Prompt tokens of the next pass that may still run ahead in chunks (0: none, or the
        next pass is no prompt prefill)."""
        return 0

    def prompt_chunk(self, k: int) -> PassInputs:
        """The next `k` prompt tokens' prefill, ahead of the first pass (nothing sampled)."""
        raise NotImplementedError

    def restart_prefill(self) -> None:
        """Forget a partial (chunked) prefill whose pages were freed: the prompt starts over."""
        raise NotImplementedError

    def replay_rows(self) -> int:
        return self._replay.rows if self._replay is not None else 0

    def chunk_inputs(self, k: int) -> PassInputs:
        """A chunk of `k` rows of the re-prefill (if one is pending) or of the prompt's prefill: its
        K/V are written, its logits unused (`skip` = every row)."""
        rp = self._replay
        if rp is None:
            inp = self.prompt_chunk(k)
        else:
            inp = PassInputs(rp.ids[:k], rp.positions[:k], rp.slots[:k], rp.cols, rp.vis[:k], "prefill", replayed=k)
            self._replay = (
                PassInputs(rp.ids[k:], rp.positions[k:], rp.slots[k:], rp.cols, rp.vis[k:], "prefill")
                if k < rp.rows
                else None
            )
        inp.skip = inp.rows
        return inp

    def preempted(self) -> None:
        """Its pages were freed by a preemption: a replay still pending (preempted again before its
        re-prefill ran) is dropped, the next readmission builds it anew; a prompt prefill cut short
        starts over."""
        self._replay = None
        if not self.passes_done:
            self.restart_prefill()

    def next_inputs(self) -> PassInputs:
        raise NotImplementedError

    def after(self, logits: torch.Tensor, attention: torch.Tensor | None) -> Step:
        raise NotImplementedError

    def after_chunk(self, attention: torch.Tensor | None) -> None:
        """A chunk of the prompt's prefill ran (nothing sampled): the attention its rows gave each
        slot, for a request that asked for it (a run alone sees the whole prompt's in its prefill)."""

    def completion(self) -> Completion:
        raise NotImplementedError

    def next_rows(self) -> int:
        """Query rows of the next pass, without allocating anything; a recompute's replay rows are not
        counted (the server adds them: `replay + next_rows()`)."""
        raise NotImplementedError

    def next_new_slots(self) -> dict:
        """Slots the next pass allocates, by owner (a request's store owners), without allocating."""
        raise NotImplementedError

    def held(self) -> list[tuple[int, int, np.ndarray]]:
        """What a recompute re-prefills, in feed order: (token id, position, indices into this list
        the token sees, itself included). Tokens dead by now are included (their K/V shaped the
        living ones) and freed again after the replay."""
        raise NotImplementedError

    def remap(self, new_slots: list[int]) -> None:
        """After a readmission: `held()`'s tokens now live at `new_slots`."""
        raise NotImplementedError

    def dead_after_replay(self) -> list[int]:
        """Slots of the replay that hold tokens evicted before the preemption (freed after it)."""
        return []

    def release(self) -> int:
        return self.kv.release()

    def readmit(self) -> int:
        """Allocate slots for everything held before the preemption and queue its replay. Tokens."""
        held = self.held()
        if not held:
            return 0
        slots = self.kv.allocate_replay([h[0] for h in held], self.replay_owners())
        self.remap(slots)
        ids, pos = [h[0] for h in held], [h[1] for h in held]
        vis = np.zeros((len(held), len(held)), dtype=bool)
        for r, (_, _, sees) in enumerate(held):
            vis[r, sees] = True
        self._replay = PassInputs(ids, pos, list(slots), np.asarray(slots, dtype=np.int64), vis, "prefill")
        self.recomputes += 1
        self.recompute_tokens += len(held)
        return len(held)

    def replay_owners(self) -> list:
        """Store owner of each held token (so a readmitted request's pages group as before)."""
        return [None] * len(self.held())


class Engine:
    """Base: holds the model, tokenizer and settings; subclasses implement `start` (a request's
    `RequestState`); `run` drives it alone over its own store, one forward pass at a time.
    """

    name = "base"
    default_model = ""  # shipped checkpoint `solm capture` uses when --model is not given
    default_task = ""

    def __init__(
        self, model: TinyLM | HFCausalLM, tokenizer: Tokenizer, config: GenerationConfig = GenerationConfig()
    ) -> None:
        self.model = model
        self.tok = tokenizer
        self.config = config
        self.device = model.embed.weight.device

    def new_store(self) -> PagedKVStore:
        return self.model.new_kv_store(page_size=self.config.page_size)

    def prompt_ids(self, request: Request) -> list[int]:
        """The request's prompt as the model reads it, checked to fit the model with room for one
        generated token (UsageError: the user's checkpoint is too small for the task)."""
        if hasattr(self.tok, "chat_ids"):  # a real model's tokenizer: its own chat template
            ids = list(self.tok.chat_ids(request.prompt))
        else:
            ids = [self.tok.bos_id, *self.tok.encode(request.prompt), self.tok.token_id("<sep>")]
        check_fits(self.model.cfg, len(ids) + 1, max(ids), f"a prompt of {len(ids)} tokens")
        return ids

    def is_stop(self, token_id: int) -> bool:
        return (
            token_id == self.tok.eos_id
            or token_id in self.config.stop_tokens
            or token_id in getattr(self.tok, "stop_ids", ())
        )  # a real model may have several

    def start(self, request: Request, kv: RequestKV) -> RequestState:
        raise NotImplementedError

    def run(self, request: Request) -> Generator[Step, None, Completion]:
        st = self.start(request, RequestKV(self.new_store(), request.request_id))
        while True:
            t0 = time.perf_counter()
            inp = st.inputs()
            t1 = time.perf_counter()
            logits, attn = self.forward([inp], st.kv.store)
            if self.device.type == "cuda":
                torch.cuda.synchronize()  # `after` reads the logits: without it, it would wait for the forward
            t2 = time.perf_counter()
            step = st.after(logits, attn)
            step.host_s = (t1 - t0) + (time.perf_counter() - t2)
            step.forward_s = t2 - t1
            yield step
            if st.done:
                return st.completion()

    def forward(self, inputs: list[PassInputs], store: PagedKVStore) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward pass over the rows of `inputs` (one request each) with the mask over the pool:
        logits (R, V) and, when a request asks for it, the attention each slot received (S,)."""
        ids = [i for inp in inputs for i in inp.ids]
        pos = [p for inp in inputs for p in inp.positions]
        slots = [s for inp in inputs for s in inp.slots]
        vis = pool_visibility(inputs, store.num_slots, self.device)
        t = torch.from_numpy(np.array([ids, pos, slots], dtype=np.int64)).to(self.device)
        if any(inp.attention for inp in inputs):
            return self.model(t[0], t[1], t[2], vis, store, return_attention=True)
        return self.model(t[0], t[1], t[2], vis, store), None

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


def pool_visibility(inputs: list[PassInputs], num_slots: int, device: torch.device) -> torch.Tensor:
    """Bool (R, S) over the whole pool from each request's rows over its own slots."""
    vis = np.zeros((sum(inp.rows for inp in inputs), num_slots), dtype=bool)
    r = 0
    for inp in inputs:
        vis[r : r + inp.rows, inp.cols] = inp.vis
        r += inp.rows
    return torch.from_numpy(vis).to(device)


def visibility_rows(rows: list[list[int]], num_slots: int, device: torch.device) -> torch.Tensor:
    """Bool (R, S) from per-row lists of visible slots (built in numpy: a per-row torch index
    assignment cost about 4x as much, a visible share of a tiny model's pass)."""
    vis = np.zeros((len(rows), num_slots), dtype=bool)
    for r, slots in enumerate(rows):
        vis[r, slots] = True
    return torch.from_numpy(vis).to(device)
