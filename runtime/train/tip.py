"""TIP training recipe: SFT on register-annotated worked solutions, with the runtime's visibility.

A sequence is `<bos> prompt <sep> <reg_i>step<reg_j>step ... #answer <eos>`; registers come from
the annotation generator (`runtime.lang.tip.annotate`, greedy + Belady, R = 5). Its mask is
`tip_visibility`, built by the same parser the engine runs, so a token never sees a step that was
dead when it was generated: exactly what the `tip` engine shows it at inference. Positions are
plain (a dead step keeps its position ids; it is only invisible).

A quarter of the sequences (`dense_fraction`) are trained with the plain causal mask instead, so
the same checkpoint is also a fair *dense* model: the dense, StreamingLLM, H2O and rolling-window
baselines run this very model, and the comparison is between eviction policies, not models.

Reproduce the shipped checkpoint (see checkpoints/README.md):
    solm train --system tip --threads 1 --out checkpoints/tip-tiny
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from runtime.lang.tip import DEFAULT_REGISTERS, annotate, tip_visibility
from runtime.tasks import Example, get_task
from runtime.tokenizer import Tokenizer
from runtime.train.recipes import Recipe
from runtime.train.sft import IGNORE, TrainConfig, TrainSeq


def tip_seq(tok: Tokenizer, ex: Example, registers: int = DEFAULT_REGISTERS, dense: bool = False) -> TrainSeq:
    """One training sequence; loss on every output token and the <eos>."""
    ann = annotate(ex.meta["steps"], ex.meta["deps"], registers, ex.meta["final"])
    prefix = [tok.bos_id, *tok.encode(ex.prompt), tok.token_id("<sep>")]
    out = tok.encode(ann.text)
    ids = prefix + out + [tok.eos_id]
    targets = [IGNORE] * (len(prefix) - 1) + out + [tok.eos_id] + [IGNORE]
    mask = None if dense else tip_visibility(ids, len(prefix), tok, registers)[0]
    return TrainSeq(ids=ids, positions=list(range(len(ids))), targets=targets, mask=mask)


def _build(tok: Tokenizer, ex: Example, task: str) -> TrainSeq:
    return tip_seq(tok, ex)


@dataclass
class TipRecipe(Recipe):
    def sampler(self, tok: Tokenizer, seed: int) -> Callable[[random.Random, int], list[TrainSeq]]:
        registers = int(self.extra.get("registers", DEFAULT_REGISTERS))
        dense_fraction = float(self.extra.get("dense_fraction", 0.25))
        pools = {t: get_task(t).examples("train", self.train_examples // len(self.tasks), seed) for t in self.tasks}
        cache: dict[tuple[str, int, bool], TrainSeq] = {}  # masks are pure functions of the example

        def sample(rng: random.Random, n: int) -> list[TrainSeq]:
            # one task per batch: its sequences have similar lengths, so little padding
            task = rng.choice(self.tasks)
            out = []
            for _ in range(n):
                i, dense = rng.randrange(len(pools[task])), rng.random() < dense_fraction
                if (task, i, dense) not in cache:
                    cache[(task, i, dense)] = tip_seq(tok, pools[task][i], registers, dense)
                out.append(cache[(task, i, dense)])
            return out

        return sample


# var_tracking has 2,000 distinct prompts and tree_reduce 2,160 (about 1,800 and 1,940 in the train
# splits), so 1,500 per task.
RECIPE = TipRecipe(
    "tip",
    ("var_tracking", "nested_arith", "tree_reduce"),
    "tiny-4l",
    TrainConfig(steps=1500, batch_size=32, lr=3e-3, warmup_steps=50),
    _build,
    train_examples=4500,
    eval_examples=64,
    max_tokens=256,
    extra={"registers": DEFAULT_REGISTERS, "dense_fraction": 0.25},
)
