"""The Planned Diffusion plan language (arXiv 2510.18087): annotation generator and incremental parser.

Surface form, as the official code writes it (the tokenizer fuses `<promise>-<topic>` into one
token and ` N</topic>` for N = 1..9 into one; the parser reads a fused token as its parts, so
`<promise>`, `-<topic>`, bytes and `</topic>` written separately parse the same):

    <promise>-<topic>a 3</topic><promise>-<topic>b 2</topic><sync/>ini AB<eos>

A *round* is a run of plan entries `<promise>-<topic>` TOPIC N `</topic>` ended by `<sync/>` (plan
again after the spans, seeing them) or by end of sequence. Each entry promises a span of N x 10
tokens (N x length_scale at inference). The runtime lays the round out as

    plan entries, then <async> [MASK]*len </async> per entry, then the round's end token

so the end token is *predicted* by the last `</topic>` (autoregressively) but *placed* after the
spans, as in the official training labels. Text outside entries is ordinary autoregressive
content (the closing line after `<sync/>`, or a whole answer with no parallel structure). `[PAD]`
fills a span whose content is shorter than its promise.

`annotate` turns a task example's dependence structure (`meta`: parts, topics, closing) into
rounds; `PlanParser` reads the model's plan tokens one at a time and never raises: an entry with
no number gets one unit, a huge number is clamped, a stray `</topic>` or diffusion tag is dropped,
an entry that never closes is closed, and a round that never ends is cut at `max_plan_tokens`.
Every such case is reported as an event string. Output is bounded: at most `max_spans` entries a
round, each at most `max_span_tokens` long.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.tokenizer import Tokenizer

PROMISE, TOPIC, TOPIC_END = "<promise>", "-<topic>", "</topic>"
ASYNC, ASYNC_END, SYNC = "<async>", "</async>", "<sync/>"
MASK, PAD = "[MASK]", "[PAD]"
UNIT = 10  # tokens per plan unit (the official code's default; `length_scale` overrides it)
MAX_DIGITS = 4  # digits read from an entry's number (the rest is ignored)


def entry_text(topic: str, units: int) -> str:
    return f"{PROMISE}{TOPIC}{topic} {units}{TOPIC_END}"


def units_for(content_tokens: int, unit: int = UNIT) -> int:
    """The smallest whole number of units that holds the content."""
    return max(1, math.ceil(content_tokens / unit))


# ---------------------------------------------------------------------------- annotation generator
@dataclass(frozen=True)
class Span:
    topic: str
    units: int
    content: tuple[int, ...]  # token ids without padding


@dataclass(frozen=True)
class Round:
    """Free AR text, then plan entries (one span each), then the end token (`sync` or `eos`)."""

    text: tuple[int, ...]
    spans: tuple[Span, ...]
    end: str


def annotate(
    meta: dict, tok: Tokenizer, rng: random.Random | None = None, bump: float = 0.0, unit: int = UNIT
) -> list[Round]:
    """Rounds from a task example's dependence structure: one span per independent part, `<sync/>`,
    then the closing line as AR text. A prompt with no parts is one AR round (the model learns not
    to plan). With `rng`, each span's promise is one unit longer with probability `bump` (random
    `[PAD]` tails, so the model learns that content ends where it ends, not where the span does)."""
    parts, topics, closing = meta.get("parts") or [], meta.get("topics") or [], meta.get("closing", "")
    closing_ids = tuple(tok.encode(closing))
    if not parts:
        return [Round(closing_ids, (), "eos")]
    spans = []
    for i, part in enumerate(parts):
        ids = tuple(tok.encode(part))
        n = units_for(len(ids), unit) + (1 if rng is not None and rng.random() < bump else 0)
        spans.append(Span(str(topics[i]) if i < len(topics) else str(i), n, ids))
    return [Round((), tuple(spans), "sync"), Round(closing_ids, (), "eos")]


def answer_of(rounds: list[Round], tok: Tokenizer) -> str:
    """The plain answer the rounds spell (what a scorer sees)."""
    ids: list[int] = []
    for r in rounds:
        ids += list(r.text)
        for s in r.spans:
            ids += list(s.content)
    return tok.decode(ids)


# ---------------------------------------------------------------------------- incremental parser
@dataclass(frozen=True)
class Entry:
    """A closed plan entry: its topic, its number of units and the span length it promises."""

    topic: str
    units: int
    length: int


@dataclass(frozen=True)
class RoundEnd:
    kind: str  # "sync", "eos" or "guard" (plan cut at max_plan_tokens)


@dataclass
class Parsed:
    kind: str  # token kind for the trace: "plan", "content", "tag"
    entry: Entry | None = None
    end: RoundEnd | None = None
    events: list[str] = field(default_factory=list)


@dataclass
class PlanParser:
    """Reads plan tokens one at a time (`feed`); `round_entries` holds the open round's entries.

    State is "text" (between entries) or "entry" (inside one). One handler per (state, tag), a
    default handler per state for everything else."""

    tok: Tokenizer
    length_scale: float = UNIT
    max_plan_tokens: int = 96  # tokens of one round before the guard ends it
    max_spans: int = 8
    max_span_tokens: int = 64
    max_entry_tokens: int = 16  # an entry still open after this many tokens is closed
    state: str = "text"
    buf: list[int] = field(default_factory=list)
    round_entries: list[Entry] = field(default_factory=list)
    round_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.length_scale > 0:
            raise ValueError(f"length_scale must be > 0, got {self.length_scale}")
        t = self.tok.token_id
        self.ids = {name: t(name) for name in (PROMISE, TOPIC, TOPIC_END, ASYNC, ASYNC_END, SYNC, MASK, PAD)}
        self.eos = self.tok.eos_id
        stray = {self.ids[n] for n in (ASYNC, ASYNC_END, MASK, PAD)} | {self.tok.bos_id, self.tok.pad_id}
        self.handlers: dict[tuple[str, int], Callable[[int], Parsed]] = {
            ("text", self.ids[PROMISE]): self._open,
            ("text", self.ids[TOPIC]): self._open,
            ("text", self.ids[TOPIC_END]): lambda _: Parsed("plan", events=["stray </topic>"]),
            ("text", self.ids[SYNC]): lambda _: self._end("sync"),
            ("text", self.eos): lambda _: self._end("eos"),
            ("entry", self.ids[TOPIC]): self._topic_tag,
            ("entry", self.ids[TOPIC_END]): lambda _: self._close(),
            ("entry", self.ids[PROMISE]): self._reopen,
            ("entry", self.ids[SYNC]): lambda _: self._close_then_end("sync"),
            ("entry", self.eos): lambda _: self._close_then_end("eos"),
        }
        for s in stray:
            self.handlers[("text", s)] = lambda _: Parsed("tag", events=["stray diffusion tag in plan"])
            self.handlers[("entry", s)] = lambda _: Parsed("plan", events=["stray diffusion tag in entry"])
        self.defaults = {"text": lambda tid: Parsed("content"), "entry": self._body}
        # fused tokens -> the tokens they spell (see runtime.tokenizer)
        self.fused: dict[int, list[int]] = {t(PROMISE + TOPIC): [self.ids[PROMISE], self.ids[TOPIC]]}
        for n in range(1, 10):
            self.fused[t(f" {n}{TOPIC_END}")] = [*f" {n}".encode(), self.ids[TOPIC_END]]

    def feed(self, token_id: int) -> Parsed:
        """Classify one plan token; report a closed entry or the end of the round."""
        token_id = int(token_id)
        self.round_tokens += 1
        if token_id in self.fused:  # one model token, parsed as its parts
            parts = [self.handlers.get((self.state, p), self.defaults[self.state])(p) for p in self.fused[token_id]]
            kinds = {x.kind for x in parts}
            out = Parsed(
                "plan" if "plan" in kinds else parts[-1].kind,
                entry=next((x.entry for x in parts if x.entry), None),
                end=next((x.end for x in parts if x.end), None),
                events=[e for x in parts for e in x.events],
            )
        else:
            out = self.handlers.get((self.state, token_id), self.defaults[self.state])(token_id)
        if out.end is None and self.round_tokens >= self.max_plan_tokens:
            if self.state == "entry":
                closed = self._close()
                out.entry = out.entry or closed.entry
                out.events += closed.events
            out.end = RoundEnd("guard")
            out.events.append("max_plan_tokens")
            self._reset_round()
        return out

    def pop_round(self) -> list[Entry]:
        """The finished round's entries (the engine calls this when `feed` reports its end)."""
        entries, self.round_entries = self.round_entries, []
        return entries

    # ------------------------------------------------------------------ handlers
    def _open(self, _: int) -> Parsed:
        self.state, self.buf = "entry", []
        return Parsed("plan")

    def _topic_tag(self, _: int) -> Parsed:
        return Parsed("plan", events=[] if not self.buf else ["-<topic> inside a topic"])

    def _reopen(self, tid: int) -> Parsed:
        closed = self._close()
        self._open(tid)
        return Parsed("plan", entry=closed.entry, events=["unclosed entry", *closed.events])

    def _body(self, tid: int) -> Parsed:
        self.buf.append(tid)
        if len(self.buf) >= self.max_entry_tokens:
            closed = self._close()
            return Parsed("plan", entry=closed.entry, events=["entry_too_long", *closed.events])
        return Parsed("plan")

    def _close(self) -> Parsed:
        self.state = "text"
        text = self.tok.decode([b for b in self.buf if b < 256])
        self.buf = []
        events: list[str] = []
        topic, _, number = text.rstrip().rpartition(" ")
        digits = number if number.isdigit() else ""
        if not digits:  # no separate number: take trailing digits, else one unit
            stripped = text.rstrip()
            tail = len(stripped) - len(stripped.rstrip("0123456789"))
            digits, topic = (stripped[-tail:], stripped[:-tail]) if tail else ("", stripped)
            events.append("no number" if not digits else "number not separated")
        units = int(digits[:MAX_DIGITS]) if digits else 1
        length = int(units * self.length_scale)
        if length > self.max_span_tokens or len(digits) > MAX_DIGITS:
            events.append(f"span length {length} clamped to {self.max_span_tokens}")
            length = self.max_span_tokens
        if length < 1:
            events.append("zero-length span")
            length = 1
        if len(self.round_entries) >= self.max_spans:
            return Parsed("plan", events=[*events, "too many spans: entry dropped"])
        entry = Entry(topic.strip(), units, length)
        self.round_entries.append(entry)
        return Parsed("plan", entry=entry, events=events)

    def _end(self, kind: str) -> Parsed:
        self._reset_round()
        return Parsed("tag", end=RoundEnd(kind))

    def _close_then_end(self, kind: str) -> Parsed:
        closed = self._close()
        out = self._end(kind)
        out.entry, out.events = closed.entry, ["unclosed entry", *closed.events]
        return out

    def _reset_round(self) -> None:
        self.state, self.buf, self.round_tokens = "text", [], 0
