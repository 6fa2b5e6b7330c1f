"""Byte-level tokenizer with a registry of special tag tokens.

Ids 0..255 are raw bytes. Ids from 256 up are special tokens: control tokens (`<bos>`, `<eos>`,
`<pad>`, `[MASK]`, `[PAD]`) and the annotation tags of the three systems (PASTA-LANG, TIP
registers, the planned-diffusion plan language). Each tag is one token, so an engine sees a whole
tag the moment the model emits it, and a parser never has to reassemble a tag from bytes.

The vocabulary is fixed by `SPECIAL_TOKENS` (append-only: ids are stable across releases, so a
checkpoint keeps working when a later system adds tags). `Tokenizer.vocab_size` is what a model
config must be sized for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

BYTE_TOKENS = 256
PROMISE_TOPIC_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"  # topics with a fused promise opening

# Append only: a token's id is BYTE_TOKENS + its index here.
SPECIAL_TOKENS: tuple[str, ...] = (
    # control
    "<bos>",
    "<eos>",
    "<pad>",
    "<sep>",
    "[MASK]",
    "[PAD]",
    # PASTA-LANG. A promise `<promise topic="T" tokens="N"/>` is `<promise topic="`, the topic's bytes,
    # then one token for `" tokens="N"/>` when N is a multiple of 10 up to 100 (the coarse lengths the
    # paper found best); any other N is spelled in bytes and still parses.
    '<promise topic="',
    *(f'" tokens="{n}"/>' for n in range(10, 101, 10)),
    "<async>",
    "</async>",
    "<sync/>",
    # TIP thought registers (R <= 16)
    *(f"<reg_{i}>" for i in range(16)),
    # Planned Diffusion plan language
    "<promise>",
    "-<topic>",
    "</topic>",
    # Planned Diffusion, fused (renamed from reserved slots 0-9): an entry's opening
    # `<promise>-<topic>` and its closing ` N</topic>` for N = 1..9 are one token each, so an entry
    # with a one-byte topic costs 3 autoregressive passes instead of 6. The surface text is
    # unchanged; other numbers are spelled in bytes and still parse.
    "<promise>-<topic>",
    *(f" {n}</topic>" for n in range(1, 10)),
    # reserved for later systems (rename in place; never reorder)
    *(f"<reserved_{i}>" for i in range(10, 16)),
    # PASTA-LANG, fused: a promise's opening and a one-character topic in [a-z0-9] are one token
    # (`<promise topic="c`), so a promise with such a topic and a multiple-of-10 length costs 2
    # autoregressive passes instead of 3. The surface text is unchanged; any other topic is spelled
    # after the plain `<promise topic="` and still parses.
    *(f'<promise topic="{c}' for c in PROMISE_TOPIC_CHARS),
)


@dataclass
class Tokenizer:
    """Bytes plus whole-token tags. `encode` finds tags in text greedily (longest first)."""

    specials: tuple[str, ...] = SPECIAL_TOKENS
    _id_of: dict[str, int] = field(init=False, repr=False)
    _pattern: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._id_of = {tok: BYTE_TOKENS + i for i, tok in enumerate(self.specials)}
        alternatives = sorted(self.specials, key=len, reverse=True)
        self._pattern = re.compile("(" + "|".join(re.escape(t) for t in alternatives) + ")")

    @property
    def vocab_size(self) -> int:
        return BYTE_TOKENS + len(self.specials)

    def token_id(self, tag: str) -> int:
        """Id of a special token; KeyError naming the token if it is not registered."""
        try:
            return self._id_of[tag]
        except KeyError:
            raise KeyError(f"unknown special token {tag!r}") from None

    @property
    def bos_id(self) -> int:
        return self._id_of["<bos>"]

    @property
    def eos_id(self) -> int:
        return self._id_of["<eos>"]

    @property
    def pad_id(self) -> int:
        return self._id_of["<pad>"]

    @property
    def mask_id(self) -> int:
        return self._id_of["[MASK]"]

    def is_special(self, token_id: int) -> bool:
        return token_id >= BYTE_TOKENS

    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        """Text to ids. With `specials`, registered tags become single tokens."""
        if not specials:
            return list(text.encode("utf-8"))
        ids: list[int] = []
        for piece in self._pattern.split(text):
            if not piece:
                continue
            if piece in self._id_of:
                ids.append(self._id_of[piece])
            else:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: list[int] | tuple[int, ...], *, skip_control: bool = False) -> str:
        """Ids to text. Invalid UTF-8 from a model is replaced, never raised."""
        out: list[str] = []
        buf = bytearray()
        control = {"<bos>", "<eos>", "<pad>"}
        for i in ids:
            i = int(i)
            if i < BYTE_TOKENS:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            k = i - BYTE_TOKENS
            tok = self.specials[k] if 0 <= k < len(self.specials) else f"<unk_{i}>"
            if not (skip_control and tok in control):
                out.append(tok)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_text(self, token_id: int) -> str:
        """Text of one token for trace rows (a lone byte may be part of a multi-byte char)."""
        return self.decode([token_id])
