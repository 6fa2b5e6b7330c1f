"""`HFTokenizer`: a real model's own tokenizer and chat template behind the interface the engines
use of the project's byte tokenizer (`runtime.tokenizer.Tokenizer`): ids of bos / eos / pad,
`encode`, `decode`, `token_text`, `token_id`, `vocab_size`, plus `chat_ids`, which engines call
instead of the byte tokenizer's `<bos> prompt <sep>` framing.

A real model speaks no PASTA / TIP / plan tags: `token_id` of a tag it does not have is a KeyError
naming the tag, so an engine that needs them fails at once with a clear message.
"""

from __future__ import annotations


class HFTokenizer:
    def __init__(self, hf_tokenizer, eos_ids: tuple[int, ...] = ()) -> None:
        self.hf = hf_tokenizer
        eos = hf_tokenizer.eos_token_id
        self.eos_id = int(eos if eos is not None else eos_ids[0])
        self.stop_ids = frozenset({self.eos_id, *eos_ids})
        bos = hf_tokenizer.bos_token_id
        self.bos_id = int(bos) if bos is not None else self.eos_id
        pad = hf_tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_id
        self._special = frozenset(int(i) for i in hf_tokenizer.all_special_ids)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def chat_ids(self, user: str, system: str | None = None) -> list[int]:
        """The prompt as the model was tuned to see it: its chat template with the assistant turn
        opened (plain text with bos when the model has no template)."""
        if not self.has_chat_template:
            return [self.bos_id, *self.encode(user)]
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        out = self.hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(i) for i in ids]

    def followup_text(self, first_user: str, assistant: str, next_user: str) -> str:
        """The template's text that follows an assistant reply `assistant` to `first_user` (as
        `chat_ids(first_user)` framed it) to open a second user turn `next_user` and the
        assistant's answer to it. ValueError when the template does not extend the first turn
        (a template that rewrites earlier turns)."""
        if not self.has_chat_template:
            return f"\n\n{next_user}\n\n"
        first = (
            self.hf.apply_chat_template(
                [{"role": "user", "content": first_user}], add_generation_prompt=True, tokenize=False
            )
            + assistant
        )
        full = self.hf.apply_chat_template(
            [
                {"role": "user", "content": first_user},
                {"role": "assistant", "content": assistant},
                {"role": "user", "content": next_user},
            ],
            add_generation_prompt=True,
            tokenize=False,
        )
        if not full.startswith(first):
            raise ValueError("the chat template does not extend the first turn (it rewrites earlier turns)")
        return full[len(first) :]

    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        return [int(i) for i in self.hf.encode(text, add_special_tokens=False)]

    def decode(self, ids, *, skip_control: bool = False) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_control)

    def token_text(self, token_id: int) -> str:
        return self.hf.decode([int(token_id)])

    def token_id(self, tag: str) -> int:
        i = self.hf.convert_tokens_to_ids(tag)
        if i is None or (i == self.hf.unk_token_id and tag != self.hf.unk_token):
            raise KeyError(f"token {tag!r} is not in this model's vocabulary (a real model speaks no solm tags)")
        return int(i)

    def is_special(self, token_id: int) -> bool:
        return int(token_id) in self._special


def tokenizer_for(model, structure_replay: bool = False):
    """The tokenizer engines use with `model`: a real model's own (`model.tokenizer`, full logits),
    except under structure replay, where the reference trace's ids are the byte tokenizer's (its
    tags drive the engine), so the byte tokenizer is used and the logits are restricted to its ids
    (every one a valid id of the real vocabulary; the pass still computes the full lm_head)."""
    from runtime.tokenizer import Tokenizer

    own = getattr(model, "tokenizer", None)
    if own is None:
        return Tokenizer()
    if structure_replay:
        model.logits_vocab = Tokenizer().vocab_size
        return Tokenizer()
    model.logits_vocab = None
    return own
