"""TIP's annotation language: thought registers (thesis arXiv 2609.14850, ch. 4).

Every reasoning step opens with a register tag `<reg_i>` (i < R, one token each). Reusing
register i declares the step it held dead: no later token reads it. The prompt is always live.

This module holds the three things both the runtime and training need, so the two cannot drift:

- `annotate`: the annotation generator. Given a worked solution split into steps and the step
  DAG, assign registers greedily; a register whose step has no future use (dead, or never used)
  is free, and when none is free evict the step whose next use is furthest away (Belady). Among
  free registers, one holding a dead step is preferred: reusing it frees that step's KV now.
- `RegisterParser`: the incremental parser the engine runs over the model's own tokens. It never
  raises: a register tag >= R (or any other stray token) is content of the current step, and an
  out-of-range tag is recorded as an event.
- `tip_visibility`: the (T, T) mask training uses, built by the same parser, so a token never
  sees a step that was dead when it was generated (exactly what the engine shows it).

Why R = 5 by default: a step's register is chosen before the step is written, so R must cover
the most steps pending at once plus the one being written. `var_tracking` has two pending (3
registers), `nested_arith` at depth 3 three (4), `tree_reduce` four from 8 terms on: while it
combines G and H it still holds A..D and E..F, and G and H themselves (5). With fewer, Belady must
evict a step that is still needed (`Annotation.forced_evictions` > 0) and the model cannot compute
from it. More registers cost nothing: free registers holding dead steps are always reused first,
so unused ones stay empty (tested per task at its minimum and one less).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from runtime.tokenizer import Tokenizer

DEFAULT_REGISTERS = 5
MAX_REGISTERS = 16  # the tokenizer's <reg_0> ... <reg_15>
PROMPT_STREAM = -1  # the prompt (always live)
PREAMBLE_STREAM = 0  # tokens before the first register tag (never killed)


def reg_tag(i: int) -> str:
    return f"<reg_{i}>"


def check_registers(r: int) -> int:
    if not 1 <= int(r) <= MAX_REGISTERS:
        raise ValueError(f"registers must be 1..{MAX_REGISTERS} (the tokenizer has <reg_0>..<reg_15>), got {r}")
    return int(r)


# ---------------------------------------------------------------------- annotation generator
@dataclass(frozen=True)
class Annotation:
    text: str  # "<reg_0>step<reg_1>step...final"
    registers: tuple[int, ...]  # register of each step
    killed: tuple[int, ...]  # step each step's tag kills (-1: none)
    forced_evictions: int  # live steps Belady had to evict (0 when R is large enough)


def annotate(
    steps: Sequence[str], deps: Sequence[Sequence[int]], registers: int = DEFAULT_REGISTERS, final: str = ""
) -> Annotation:
    """Greedy register assignment with Belady eviction over a step DAG (`deps[k]`: steps k reads).

    The final answer reads the last step, so the last step stays live to the end.
    """
    R = check_registers(registers)
    n = len(steps)
    if len(deps) != n:
        raise ValueError(f"{n} steps but {len(deps)} dependency lists")
    uses: list[list[int]] = [[] for _ in range(n)]
    for k, ds in enumerate(deps):
        for j in ds:
            if not 0 <= j < k:
                raise ValueError(f"step {k} depends on step {j}, which is not an earlier step")
            uses[j].append(k)
    if n:
        uses[n - 1].append(n)  # the answer line

    def next_use(j: int, k: int) -> float:
        return min((u for u in uses[j] if u >= k), default=math.inf)

    holder: list[int] = [-1] * R  # step each register holds (-1: empty)
    regs, killed, forced = [], [], 0
    for k in range(n):
        # key: (next use, prefer a dead step over an empty register, lowest index)
        def key(r: int) -> tuple[float, int, int]:
            j = holder[r]
            return (next_use(j, k) if j >= 0 else math.inf, 1 if j >= 0 else 0, -r)  # noqa: B023 (used in this iteration)

        r = max(range(R), key=key)
        if holder[r] >= 0 and next_use(holder[r], k) < math.inf:
            forced += 1
        killed.append(holder[r])
        holder[r] = k
        regs.append(r)
    text = "".join(reg_tag(r) + s for r, s in zip(regs, steps)) + final
    return Annotation(text, tuple(regs), tuple(killed), forced)


# ---------------------------------------------------------------------- incremental parser
@dataclass(frozen=True)
class TokenEffect:
    """What one token did: the stream it belongs to, whether it opened a step, what it killed."""

    stream: int
    kind: str  # "tag" or "content"
    killed_stream: int = -1  # step declared dead by this tag (-1: none)
    event: dict | None = None


@dataclass
class RegisterParser:
    """Per-request parser state: which step each register holds, which steps are dead.

    Dispatch: token id -> handler through one table (`_handlers`); every other token is content.
    """

    tok: Tokenizer
    registers: int = DEFAULT_REGISTERS
    holder: dict[int, int] = field(default_factory=dict)  # register -> step stream
    stream_register: dict[int, int] = field(default_factory=dict)  # step stream -> register
    dead: set[int] = field(default_factory=set)
    current: int = PREAMBLE_STREAM
    n_tokens: int = 0
    events: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_registers(self.registers)
        self._handlers: dict[int, Callable[[int], TokenEffect]] = {
            self.tok.token_id(reg_tag(i)): (lambda i: lambda t: self._on_register(i))(i)  # noqa: B023 (i bound by the outer lambda)
            for i in range(MAX_REGISTERS)
        }

    def feed(self, token_id: int) -> TokenEffect:
        handler = self._handlers.get(int(token_id), self._on_content)
        effect = handler(int(token_id))
        self.n_tokens += 1
        return effect

    def _on_content(self, token_id: int) -> TokenEffect:
        return TokenEffect(self.current, "content")

    def _on_register(self, i: int) -> TokenEffect:
        if i >= self.registers:
            ev = {
                "kind": "unknown_register",
                "register": i,
                "registers": self.registers,
                "token_index": self.n_tokens,
                "action": "ignored (kept as content of the current step)",
            }
            self.events.append(ev)
            return TokenEffect(self.current, "content", event=ev)
        killed = self.holder.get(i, -1)
        if killed >= 0:
            self.dead.add(killed)
        self.current = max([PREAMBLE_STREAM, *self.stream_register]) + 1
        self.holder[i] = self.current
        self.stream_register[self.current] = i
        return TokenEffect(self.current, "tag", killed_stream=killed)


def tip_visibility(
    ids: Sequence[int], n_prompt: int, tok: Tokenizer, registers: int = DEFAULT_REGISTERS
) -> tuple[torch.Tensor, list[int]]:
    """Training mask (T, T) bool and each token's stream for `prompt + output` ids.

    Row t sees column s iff s <= t and s's stream was not dead when t was fed (a tag that kills
    a step does not see it). Prompt columns are always visible.
    """
    T = len(ids)
    parser = RegisterParser(tok, registers)
    streams = [PROMPT_STREAM] * n_prompt
    death: dict[int, int] = {}  # stream -> index of the tag that killed it
    for t in range(n_prompt, T):
        effect = parser.feed(ids[t])
        streams.append(effect.stream)
        if effect.killed_stream >= 0:
            death.setdefault(effect.killed_stream, t)
    col_death = torch.tensor([death.get(s, T) for s in streams])  # (T,)
    rows = torch.arange(T)[:, None]
    mask = torch.ones((T, T), dtype=torch.bool).tril() & (col_death[None, :] > rows)
    return mask, streams


# ---------------------------------------------------------------------- text-level view
_TAG = re.compile(r"<reg_([^>]{0,8})>")


def split_steps(text: str, registers: int = DEFAULT_REGISTERS) -> tuple[list[tuple[int, str]], list[dict]]:
    """Decoded text -> [(register, step text)] and events. Never raises: a tag whose index is
    not a number < `registers` stays in the text and is recorded; text before any tag is (-1, ...)."""
    out: list[tuple[int, str]] = []
    events: list[dict] = []
    reg, buf, pos = -1, [], 0
    for m in _TAG.finditer(text):
        raw = m.group(1)
        valid = raw.isdigit() and len(raw) <= 2 and int(raw) < registers
        if not valid:
            events.append({"kind": "unknown_register", "tag": m.group(0), "offset": m.start()})
            continue
        buf.append(text[pos : m.start()])
        if reg >= 0 or "".join(buf):
            out.append((reg, "".join(buf)))
        reg, buf, pos = int(raw), [], m.end()
    buf.append(text[pos:])
    if reg >= 0 or "".join(buf):
        out.append((reg, "".join(buf)))
    return out, events
