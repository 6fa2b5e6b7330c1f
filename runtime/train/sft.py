"""Supervised fine-tuning over `TrainSeq`s: AdamW, warmup + cosine decay, deterministic from a seed.

A `TrainSeq` carries everything the model must see as the runtime will show it: token ids, the
position id of each token, the (T, T) visibility mask (None = causal) and the target of each
position (-100 = no loss). Systems differ only in how they build these sequences.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from profiler.errors import UsageError
from runtime.model import TinyLM, check_fits

IGNORE = -100


@dataclass
class TrainSeq:
    ids: list[int]
    positions: list[int]
    targets: list[int]  # same length as ids; IGNORE = no loss at this position
    mask: torch.Tensor | None = None  # (T, T) bool; None = causal
    weights: list[float] | None = None  # per-position loss weight (None = 1)


def collate(batch: list[TrainSeq], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Pad to the longest: ids, positions, targets, weights (B, T) and mask (B, T, T)."""
    T = max(len(s.ids) for s in batch)
    B = len(batch)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    tgt = torch.full((B, T), IGNORE, dtype=torch.long)
    w = torch.zeros((B, T))
    mask = torch.eye(T, dtype=torch.bool).repeat(B, 1, 1)  # pad rows see themselves only
    for b, s in enumerate(batch):
        n = len(s.ids)
        ids[b, :n] = torch.tensor(s.ids)
        pos[b, :n] = torch.tensor(s.positions)
        tgt[b, :n] = torch.tensor(s.targets)
        w[b, :n] = torch.tensor(s.weights) if s.weights is not None else 1.0
        mask[b, :n, :n] = s.mask if s.mask is not None else torch.ones((n, n), dtype=torch.bool).tril()
    return ids, pos, tgt, w, mask


@dataclass
class TrainConfig:
    steps: int = 3000
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        frac = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def loss_of(model: TinyLM, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    ids, pos, tgt, w, mask = batch
    logits = model.forward_dense(ids, pos, mask)
    per_tok = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=IGNORE, reduction="none")
    weight = w.flatten() * (tgt.flatten() != IGNORE)
    return (per_tok * weight).sum() / weight.sum().clamp(min=1.0)


def train(
    model: TinyLM,
    sample_batch: Callable[[random.Random, int], list[TrainSeq]],
    cfg: TrainConfig,
    pad_id: int,
    progress: bool = True,
    loss_fn: Callable[[TinyLM, tuple[torch.Tensor, ...]], torch.Tensor] = loss_of,
) -> dict:
    """Train in place. Returns a log: final loss (mean of the last 50 steps), steps, seconds."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    model.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, desc="train", unit="step", leave=False, disable=None)
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = cfg.lr_at(step)
        batch = collate(sample_batch(rng, cfg.batch_size), pad_id)
        ids, pos, tgt = batch[:3]  # a model too small for the recipe's sequences: one line, before a step
        check_fits(model.cfg, int(pos.max()) + 1, int(max(ids.max(), tgt.max())), "a training sequence")
        loss = loss_fn(model, batch)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):  # was: trained on to the end, saved NaN weights, exit 0 ("final loss nan")
            raise UsageError(
                f"the training loss is {losses[-1]} at step {step + 1} of {cfg.steps}: diverged "
                f"(--lr {cfg.lr:g} too high for this model); nothing saved"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if bar:
            bar.update(1)
            if step % 50 == 0:
                bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}")
            if bar.disable and (step + 1) % max(1, cfg.steps // 10) == 0:  # not a terminal (a log file): 10 lines
                print(
                    f"train step {step + 1}/{cfg.steps} loss {sum(losses[-50:]) / len(losses[-50:]):.4f} "
                    f"{time.perf_counter() - t0:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    if bar:
        bar.close()
    model.eval()
    tail = losses[-50:]
    return {"steps": cfg.steps, "final_loss": sum(tail) / len(tail), "train_s": time.perf_counter() - t0}
