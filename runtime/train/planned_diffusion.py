"""Planned Diffusion training: one hybrid loss on one model (arXiv 2510.18087, section 3).

    solm train --system planned_diffusion --threads 1 --out checkpoints/pd-tiny
    solm train --system planned_diffusion --stage ar --threads 1 --out checkpoints/pd-ar

Each training sequence is laid out exactly as the engine lays it out (prompt, plan entries, then
`<async>` span `</async>` per entry, then `<sync/>` or `<eos>`, plain positions) and masked with
`hybrid_mask`, the function the engine uses. The loss (`hybrid_loss`) is autoregressive
cross-entropy on the plan and free text (the last `</topic>` predicts the round's end token, which
sits after the spans) plus masked-diffusion cross-entropy on span tokens: one t ~ U(eps, 1) per
sequence, each span token masked with probability t, masked tokens weighted 1/t, and the sum
divided by the number of AR targets plus span tokens (the ELBO normalisation of the official
trainer). Span tags are never masked. Spans are padded with `[PAD]` to their promise, and a
promise is one unit longer at random (`bump`), so spans end in 0-19 `[PAD]`s.

The mixture also holds, from the same examples:
- `dense`: the same PD sequence under the dense mask (siblings see each other), so the engine's
  `block_sparse=False` switch is a trained setting, not an ablation out of distribution;
- `mdm`: plain masked diffusion, the whole answer in one span of random length (answer plus up to
  `mdm_max_len`), no plan: the `masked_diffusion` baseline runs on the same weights.

Stage `ar` is the autoregressive baseline: the same answers without any tag, causal, plain
positions, evaluated with the `sequential` engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from profiler.errors import UsageError
from runtime.engines.diffusion_common import EPS, Seg, hybrid_mask
from runtime.lang.planned_diffusion import ASYNC, ASYNC_END, MASK, PAD, SYNC, UNIT, Round, annotate, entry_text
from runtime.model import TinyLM
from runtime.tasks import Example
from runtime.train.recipes import Recipe, _plain
from runtime.train.sft import IGNORE, TrainConfig, TrainSeq

TASKS = ("word_facts", "map_numbers", "list_stats", "copy_line")


def prefix_ids(tok, prompt: str) -> list[int]:
    """What the engines feed first: <bos> prompt <sep> (as `Engine.prompt_ids`)."""
    return [tok.bos_id, *tok.encode(prompt), tok.token_id("<sep>")]


def lay_out(tok, prompt: str, rounds: list[Round], unit: int = UNIT) -> tuple[list[int], list[Seg]]:
    """Token ids and segments of the laid-out sequence (clean: spans hold their content + [PAD])."""
    ids, segs = prefix_ids(tok, prompt), []
    segs.append(Seg("ar", len(ids)))
    a, b, pad = tok.token_id(ASYNC), tok.token_id(ASYNC_END), tok.token_id(PAD)

    def add(kind: str, xs: list[int]) -> None:
        if not xs:
            return
        if kind == "ar" and segs[-1].kind == "ar":
            segs[-1] = Seg("ar", segs[-1].length + len(xs))
        else:
            segs.append(Seg(kind, len(xs)))
        ids.extend(xs)

    for r in rounds:
        add("ar", list(r.text) + tok.encode("".join(entry_text(s.topic, s.units) for s in r.spans)))
        for s in r.spans:
            body = list(s.content)[: s.units * unit]
            add("span", [a, *body, *[pad] * (s.units * unit - len(body)), b])
        if r.end == "sync":
            add("sync", [tok.token_id(SYNC)])
        else:
            add("ar", [tok.eos_id])
    return ids, segs


def hybrid_seq(
    tok, ids: list[int], segs: list[Seg], n_prefix: int, rng: random.Random, block_sparse: bool = True
) -> TrainSeq:
    """Noised inputs, targets, weights and mask of one laid-out sequence (see module doc)."""
    T = len(ids)
    kinds = [s.kind for s in segs for _ in range(s.length)]
    tags = {tok.token_id(ASYNC), tok.token_id(ASYNC_END)}
    inputs, targets, weights = list(ids), [IGNORE] * T, [0.0] * T
    ar_idx = [i for i in range(T) if kinds[i] != "span"]
    for j, nxt in zip(ar_idx, ar_idx[1:]):  # AR: predict the next AR token, skipping spans
        if j >= n_prefix - 1:
            targets[j], weights[j] = ids[nxt], 1.0
    t = (1 - EPS) * rng.random() + EPS
    mask_id = tok.token_id(MASK)
    for i in range(T):
        if kinds[i] == "span" and ids[i] not in tags:
            weights[i] = 1.0  # counts in the denominator even when not masked
            if rng.random() < t:
                inputs[i], targets[i], weights[i] = mask_id, ids[i], 1.0 / t
    return TrainSeq(
        ids=inputs, positions=list(range(T)), targets=targets, mask=hybrid_mask(segs, block_sparse), weights=weights
    )


def hybrid_loss(model: TinyLM, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Sum of CE x weight over targets, divided by the count of AR targets and span tokens."""
    ids, pos, tgt, w, mask = batch
    logits = model.forward_dense(ids, pos, mask)  # (B, T, V)
    per_tok = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=IGNORE, reduction="none")
    w = w.flatten()
    return (per_tok * w * (tgt.flatten() != IGNORE)).sum() / (w > 0).sum().clamp(min=1)


@dataclass
class PDRecipe(Recipe):
    """The hybrid recipe; `extra` holds the mixture: dense / mdm fractions, bump, mdm_max_len."""

    def make_seq(self, tok, ex: Example, rng: random.Random, kind: str = "pd") -> TrainSeq:
        n_prefix = len(prefix_ids(tok, ex.prompt))
        x = self.extra
        if kind == "mdm":
            answer = tok.encode(ex.answer)
            n = len(answer) + rng.randint(0, max(0, x["mdm_max_len"] - len(answer)))
            rounds = [Round((), (), "eos")]
            ids, segs = lay_out(tok, ex.prompt, rounds)
            a, b, pad = tok.token_id(ASYNC), tok.token_id(ASYNC_END), tok.token_id(PAD)
            span = [a, *answer[:n], *[pad] * (n - min(n, len(answer))), b]
            ids, segs = ids[:n_prefix] + span, [Seg("ar", n_prefix), Seg("span", len(span))]
            return hybrid_seq(tok, ids, segs, n_prefix, rng)
        rounds = annotate(ex.meta, tok, rng, bump=x["bump"])
        ids, segs = lay_out(tok, ex.prompt, rounds)
        return hybrid_seq(tok, ids, segs, n_prefix, rng, block_sparse=rng.random() >= x["dense"])

    def sampler(self, tok, seed: int) -> Callable[[random.Random, int], list[TrainSeq]]:
        from runtime.tasks import get_task

        per = self.train_examples // len(self.tasks)
        pools = {t: get_task(t).examples("train", per, seed) for t in self.tasks}
        flat = [ex for exs in pools.values() for ex in exs]

        def sample(rng: random.Random, n: int) -> list[TrainSeq]:
            """One kind of sequence per batch (plain diffusion, or PD of one task), so sequences of
            a batch have similar lengths and little compute goes to collate padding."""
            if rng.random() < self.extra["mdm"]:
                return [self.make_seq(tok, rng.choice(flat), rng, "mdm") for _ in range(n)]
            pool = pools[rng.choice(self.tasks)]
            return [self.make_seq(tok, rng.choice(pool), rng, "pd") for _ in range(n)]

        return sample

    def prepare(self, model: TinyLM, tok, seed: int, progress: bool):
        """(batch sampler, loss) for `solm train` (recipes that bring their own loss)."""
        return self.sampler(tok, seed), hybrid_loss

    def for_stage(self, stage: str, lam: float | None = None) -> Recipe:
        if lam is not None:  # was: accepted and ignored (no stage here has a reward to weigh)
            raise UsageError("--lambda weighs a preference stage's reward: planned_diffusion has none")
        if stage in ("", "pd"):
            return self
        if stage == "ar":
            return Recipe(
                "planned_diffusion",
                self.tasks,
                self.preset,
                AR_TRAIN,
                _plain,
                train_examples=self.train_examples,
                eval_examples=self.eval_examples,
                max_tokens=self.max_tokens,
                extra={"eval_system": "sequential"},
            )
        raise UsageError(f"--stage: planned_diffusion stages are: pd (default), ar; got {stage!r}")


AR_TRAIN = TrainConfig(steps=1000, batch_size=16, lr=3e-3)
RECIPE = PDRecipe(
    "planned_diffusion",
    TASKS,
    "tiny-4l",
    TrainConfig(steps=800, batch_size=16, lr=3e-3),
    train_examples=20000,
    eval_examples=16,
    max_tokens=256,
    extra={"dense": 0.15, "mdm": 0.1, "bump": 0.15, "mdm_max_len": 150},
)

__all__ = ["RECIPE", "PDRecipe", "hybrid_loss", "hybrid_seq", "lay_out", "prefix_ids"]
