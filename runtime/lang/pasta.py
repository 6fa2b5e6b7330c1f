"""PASTA-LANG (arXiv 2502.11517): the annotation generator and the incremental parser.

Surface form, in *final order* (each promise is followed at once by the chunk it promised):

    <promise topic="a" tokens="30"/><async>chunk a</async><promise topic="b" tokens="20"/><async>chunk b</async><sync/>closing

A promise reserves `tokens` position ids for its chunk and forks an async thread; the main thread
goes on at the offset after the reservation. `<async>` is forced by the interpreter (never
sampled): it is the thread's first token. `</async>` ends the thread; `<sync/>` makes the main
thread wait for every open thread and then see all their tokens. With the tokenizer's single-token
tags a promise with a one-character topic in [a-z0-9] and a multiple-of-10 length costs 2 tokens
(`<promise topic="c`, `" tokens="30"/>`); any other topic costs 2 + its bytes.

The parser reads one stream's tokens as the model emits them (`PastaParser.feed`) and answers with
one IR node per token: what kind of token it is (tag / content) and what the interpreter must do.
Malformed annotation never raises: a promise with no topic, a bad token count, a promise inside a
chunk, or one over the thread limit is *inlined* (its chunk is decoded in the same stream, i.e.
sequentially); stray closes and syncs are ignored; each case is reported as an event string.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

from runtime.tokenizer import PROMISE_TOPIC_CHARS, Tokenizer

PROMISE_OPEN = '<promise topic="'
ASYNC, ASYNC_END, SYNC = "<async>", "</async>", "<sync/>"
STYLES = ("fine", "coarse", "none", "eager")
MAX_RESERVE = 100  # largest token count a promise may reserve
MAX_TOPIC_BYTES = 32  # a promise still open after this many bytes is abandoned


def promise_close(n: int) -> str:
    return f'" tokens="{n}"/>'


def reserve_for(chunk_tokens: int) -> int:
    """Coarse length estimate (a multiple of 10, the paper's best setting) that leaves room for the
    forced `<async>` plus `chunk_tokens` content tokens before the main thread's next position."""
    return min(MAX_RESERVE, 10 * math.ceil((chunk_tokens + 1) / 10))


# ---------------------------------------------------------------------------- annotation generator
def annotate(meta: dict, tok: Tokenizer, style: str = "fine") -> str:
    """PASTA-LANG target (final order) from a task example's dependence structure.

    `fine`: one promise per independent part; `coarse`: one per pair of parts; `none`: the plain
    answer. The closing part follows `<sync/>`, except in `eager`: one promise per part and the
    closing part written by the main thread *before* `<sync/>`, while the chunks are decoded, from
    the prompt alone (faster, and right only where the closing part does not need the chunks' text:
    the speed/quality choice the preference stage trades). Prompts with no parts are always plain.
    """
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    parts, topics, closing = meta["parts"], meta["topics"], meta["closing"]
    if style == "none" or not parts:
        return "".join(parts) + closing
    groups = (
        [[i, i + 1][: len(parts) - i] for i in range(0, len(parts), 2)]
        if style == "coarse"
        else [[i] for i in range(len(parts))]
    )
    out = []
    for g in groups:
        chunk = "".join(parts[i] for i in g)
        out.append(
            PROMISE_OPEN + topics[g[0]] + promise_close(reserve_for(len(tok.encode(chunk)))) + ASYNC + chunk + ASYNC_END
        )
    return "".join(out) + (closing + SYNC if style == "eager" else SYNC + closing)


def sample_style(rng: random.Random, meta: dict, weights: dict[str, float]) -> str:
    if not meta["parts"]:
        return "none"
    names = list(weights)
    return rng.choices(names, [weights[n] for n in names])[0]


def strip(text: str) -> str:
    """Final text of a well-formed final-order annotation: the tags and promises removed."""
    text = re.sub(r'<promise topic="[^"]*" tokens="\d+"/>', "", text)
    return text.replace(ASYNC, "").replace(ASYNC_END, "").replace(SYNC, "")


# ---------------------------------------------------------------------------- parser IR
@dataclass(frozen=True)
class Fork:
    topic: str
    tokens: int


@dataclass(frozen=True)
class Inline:
    """Decode the promised chunk in this stream (fallback to sequential); the interpreter forces
    `<async>` next and the chunk ends at the matching `</async>`."""

    reason: str


@dataclass(frozen=True)
class Finish:
    """This thread is done (its `</async>` is not fed to the model)."""


@dataclass(frozen=True)
class Sync:
    """The main thread waits for every open thread, then sees all their tokens."""


@dataclass(frozen=True)
class End:
    """End of the answer (main thread; waits for open threads first)."""


Action = Fork | Inline | Finish | Sync | End | None


@dataclass(frozen=True)
class Parsed:
    kind: str  # "tag" or "content"
    action: Action = None
    event: str = ""  # non-empty: a malformed annotation and what was done about it


@dataclass
class StreamSyntax:
    """Per-stream parser state."""

    role: str  # "main" or "thread"
    mode: str = "text"  # "text" or "topic" (inside `<promise topic="...`)
    depth: int = 0  # open inline chunks (fallbacks) in this stream
    topic: bytearray = field(default_factory=bytearray)


_SPELLED_CLOSE = re.compile(rb'^(.*)" tokens="([^"]*)"/>$', re.DOTALL)


class PastaParser:
    """Incremental PASTA-LANG parser: `feed(state, token)` for each sampled token of a stream."""

    def __init__(self, tok: Tokenizer, max_reserve: int = MAX_RESERVE, max_topic_bytes: int = MAX_TOPIC_BYTES) -> None:
        self.tok = tok
        self.max_reserve, self.max_topic_bytes = max_reserve, max_topic_bytes
        self.open_id = tok.token_id(PROMISE_OPEN)
        self.async_id, self.end_id, self.sync_id = tok.token_id(ASYNC), tok.token_id(ASYNC_END), tok.token_id(SYNC)
        self.close_n = {tok.token_id(promise_close(n)): n for n in range(10, 101, 10)}
        # fused openings (`<promise topic="c`): the topic's first byte comes with the tag
        self.open_topic = {tok.token_id(PROMISE_OPEN + c): c.encode() for c in PROMISE_TOPIC_CHARS}
        self.open_ids = frozenset({self.open_id, *self.open_topic})
        self._text = {
            **{i: self._open for i in self.open_ids},
            self.async_id: self._async,
            self.end_id: self._async_end,
            self.sync_id: self._sync,
            tok.eos_id: self._eos,
            **{c: self._stray_close for c in self.close_n},
        }

    def new_stream(self, role: str) -> StreamSyntax:
        return StreamSyntax(role)

    def begin_inline(self, st: StreamSyntax) -> None:
        """The interpreter forced `<async>` into this stream after an `Inline`."""
        st.depth += 1

    def feed(self, st: StreamSyntax, token: int, can_fork: bool = True) -> Parsed:
        if st.mode == "topic":
            return self._topic(st, token, can_fork)
        handler = self._text.get(token)
        return handler(st, token) if handler else Parsed("content")

    # -- text mode (one handler per tag)
    def _open(self, st: StreamSyntax, token: int) -> Parsed:
        st.mode, st.topic = "topic", bytearray(self.open_topic.get(token, b""))
        return Parsed("tag")

    def _async(self, st: StreamSyntax, token: int) -> Parsed:
        st.depth += 1  # an `<async>` nobody promised: decode it inline
        return Parsed("tag", None, "async_without_promise" if st.role == "main" and st.depth == 1 else "nested_async")

    def _async_end(self, st: StreamSyntax, token: int) -> Parsed:
        if st.depth:
            st.depth -= 1
            return Parsed("tag")
        if st.role == "thread":
            return Parsed("tag", Finish())
        return Parsed("tag", None, "close_without_async")

    def _sync(self, st: StreamSyntax, token: int) -> Parsed:
        if st.role == "main" and st.depth == 0:
            return Parsed("tag", Sync())
        return Parsed("tag", None, "sync_inside_chunk")

    def _eos(self, st: StreamSyntax, token: int) -> Parsed:
        event = "unclosed_async" if st.depth else ""
        if st.role == "thread":
            return Parsed("content", Finish(), event or "eos_inside_chunk")
        return Parsed("content", End(), event)

    def _stray_close(self, st: StreamSyntax, token: int) -> Parsed:
        return Parsed("tag", None, "close_without_promise")

    # -- topic mode
    def _topic(self, st: StreamSyntax, token: int, can_fork: bool) -> Parsed:
        if token in self.close_n:
            return self._promise(st, bytes(st.topic), self.close_n[token], can_fork)
        if self.tok.is_special(token):  # the promise was interrupted: abandon it, read the token as text
            st.mode = "text"
            handler = self._text.get(token)
            p = handler(st, token) if handler else Parsed("content")
            return Parsed(p.kind, p.action, p.event or "unclosed_promise")
        st.topic.append(token)
        if st.topic.endswith(b'"/>'):
            m = _SPELLED_CLOSE.match(bytes(st.topic))
            count = int(m.group(2)) if m and m.group(2).isdigit() else -1
            return self._promise(st, m.group(1) if m else b"", count, can_fork)
        if len(st.topic) > self.max_topic_bytes:
            st.mode = "text"
            return Parsed("tag", None, "unclosed_promise")
        return Parsed("tag")

    def _promise(self, st: StreamSyntax, topic: bytes, count: int, can_fork: bool) -> Parsed:
        st.mode = "text"
        if not topic.strip():
            return Parsed("tag", Inline("promise_without_topic"), "promise_without_topic")
        if not 1 <= count <= self.max_reserve:
            return Parsed("tag", Inline("bad_token_count"), "bad_token_count")
        if st.role == "thread" or st.depth:
            return Parsed("tag", Inline("nested_promise"), "nested_promise")
        if not can_fork:
            return Parsed("tag", Inline("max_threads"), "max_threads")
        return Parsed("tag", Fork(topic.decode("utf-8", errors="replace"), count))
