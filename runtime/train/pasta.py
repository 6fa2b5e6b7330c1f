"""PASTA training (arXiv 2502.11517, sec. 3): SFT on annotated answers with the interpreter's exact
visibility and positions, then preference optimisation over the model's own annotated samples.

Stages (`solm train --system pasta --stage S`):

    sft          annotated targets from `runtime.lang.pasta.annotate`, a mix of styles (one promise
                 per part, one per pair of parts, none, and eager: the closing part before
                 `<sync/>`) so the model has structures to choose between; each sequence is laid
                 out by replaying the answer through the engine's own `Layout`, so a chunk token
                 sees only the prompt, the main thread up to its promise and its own chunk, and
                 the main thread sees chunks only after `<sync/>`.
    preference   from `--init` (the SFT model): sample annotated answers per training prompt with
                 the `pasta` engine (greedy, structural samples, whole samples; see
                 `preference_pairs`), score each by theoretical speedup + lambda * quality (half its
                 own, half its structure's mean over the stage: `rank_candidates`), and train on
                 (best, worst) pairs: SFT on the best plus a DPO pairwise loss against the frozen
                 initial model. Two lambdas give two models at different speed/quality points.
    sequential   the baseline: the same examples with annotations removed, causal, plain positions.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from profiler.errors import UsageError
from runtime.engines.pasta import MAIN, Layout, PastaEngine
from runtime.lang.pasta import SYNC, PastaParser, annotate, sample_style
from runtime.model import TinyLM
from runtime.tasks import Example, get_task
from runtime.tasks.parallel import ALL_TASKS
from runtime.tokenizer import Tokenizer
from runtime.train.recipes import Recipe, causal_seq
from runtime.train.sft import IGNORE, TrainConfig, TrainSeq, loss_of

SFT_STYLES = {"fine": 0.6, "coarse": 0.1, "none": 0.15, "eager": 0.15}
TASK_WEIGHTS = {"word_facts": 1.0, "map_numbers": 1.0, "list_stats": 1.0, "copy_line": 0.5}


def prompt_ids(tok: Tokenizer, prompt: str) -> list[int]:
    return [tok.bos_id, *tok.encode(prompt), tok.token_id("<sep>")]


def replay(tok: Tokenizer, prompt: list[int], answer: list[int]) -> tuple[Layout, dict[int, int]]:
    """Lay out a final-order PASTA-LANG answer (ending in `<eos>`) as the engine would decode it.
    Returns the layout and the target of each fed row (the next token its stream sampled)."""
    lay = Layout(prompt, tok, max_threads=1 << 20, max_chunk_tokens=1 << 20)
    targets: dict[int, int] = {}
    stack, skip = [MAIN], 0
    for t in answer:
        if skip:  # a tag the interpreter forces (a thread's or an inline chunk's `<async>`)
            if t != lay.async_id:
                raise ValueError(f"expected the forced <async>, got token {t}")
            skip -= 1
            continue
        lay.feed_ready()
        sid = stack[-1]
        s = lay.streams[sid]
        targets[s.last_row] = t
        out = lay.advance(sid, t)
        if out.thread >= 0:
            stack.append(out.thread)
            skip = 1
        elif len(s.pending) == 2:  # inlined promise
            skip = 1
        if s.done and sid != MAIN:
            stack.pop()
    return lay, targets


def to_seq(tok: Tokenizer, prompt: list[int], answer: list[int], weight: float = 1.0) -> TrainSeq:
    lay, targets = replay(tok, prompt, answer)
    T = len(lay.fed)
    lens = [len(f.sees) for f in lay.fed]
    rows = np.repeat(np.arange(T), lens)
    cols = np.concatenate([np.asarray(f.sees) for f in lay.fed])
    mask = torch.zeros((T, T), dtype=torch.bool)
    mask[torch.from_numpy(rows), torch.from_numpy(cols)] = True
    return TrainSeq(
        ids=[f.token_id for f in lay.fed],
        positions=[f.position for f in lay.fed],
        targets=[targets.get(i, IGNORE) for i in range(T)],
        mask=mask,
        weights=[weight] * T if weight != 1.0 else None,
    )


def pack(seqs: list[TrainSeq]) -> list[TrainSeq]:
    """Pack sequences into rows no longer than the longest one (first fit, longest first), each a
    block of a block-diagonal mask with its own positions and loss weights: the same loss with less
    padding."""
    limit = max(len(s.ids) for s in seqs)
    rows: list[list[TrainSeq]] = []
    for s in sorted(seqs, key=lambda s: -len(s.ids)):
        row = next((r for r in rows if sum(len(x.ids) for x in r) + len(s.ids) <= limit), None)
        row.append(s) if row is not None else rows.append([s])
    out = []
    for r in rows:
        T = sum(len(x.ids) for x in r)
        mask, off = torch.zeros((T, T), dtype=torch.bool), 0
        for x in r:
            n = len(x.ids)
            mask[off : off + n, off : off + n] = (
                x.mask if x.mask is not None else torch.ones((n, n), dtype=torch.bool).tril()
            )
            off += n
        out.append(
            TrainSeq(
                [i for x in r for i in x.ids],
                [p for x in r for p in x.positions],
                [t for x in r for t in x.targets],
                mask,
                # per-position loss weights kept (1 where a sequence has none); None when no one has any
                None
                if all(x.weights is None for x in r)
                else [w for x in r for w in (x.weights if x.weights is not None else [1.0] * len(x.ids))],
            )
        )
    return out


def annotated_seq(tok: Tokenizer, ex: Example, style: str) -> TrainSeq:
    return to_seq(tok, prompt_ids(tok, ex.prompt), tok.encode(annotate(ex.meta, tok, style)) + [tok.eos_id])


def _plain(tok: Tokenizer, ex: Example, task: str) -> TrainSeq:
    return causal_seq(tok, ex.prompt, tok.encode(ex.answer))


def _fine(tok: Tokenizer, ex: Example, task: str) -> TrainSeq:
    return annotated_seq(tok, ex, "fine")


@dataclass
class PastaRecipe(Recipe):
    stage: str = "sft"
    styles: dict = dataclasses.field(default_factory=lambda: dict(SFT_STYLES))
    lam: float = 1.0  # preference: weight of quality in the reward
    samples_per_prompt: int = 2  # whole answers sampled at pref_temperature
    structure_samples: int = 4  # answers sampled at structure_temperature where a tag is a top-2 choice, else greedy
    pref_prompts: int = 96
    pref_temperature: float = 0.8
    structure_temperature: float = 2.0
    structure_weight: float = 0.5  # share of the structure's expected quality in the reward's quality
    dpo_beta: float = 0.1

    def for_stage(self, stage: str, lam: float | None = None) -> PastaRecipe:
        if stage not in STAGES:
            raise UsageError(f"--stage: pasta stages are: {', '.join(STAGES)}; got {stage!r}")
        if lam is not None and stage != "preference":  # was: accepted, and only the preference reward reads it
            raise UsageError(f"--lambda weighs the preference stage's reward: not with --stage {stage}")
        r = dataclasses.replace(self, **STAGES[stage])
        return dataclasses.replace(r, lam=lam) if lam is not None else r

    def pools(self, seed: int) -> list[tuple[str, Example]]:
        total = sum(TASK_WEIGHTS[t] for t in self.tasks)
        return [
            (t, ex)
            for t in self.tasks
            for ex in get_task(t).examples("train", int(self.train_examples * TASK_WEIGHTS[t] / total), seed)
        ]

    def sampler(self, tok: Tokenizer, seed: int) -> Callable[[random.Random, int], list[TrainSeq]]:
        flat = self.pools(seed)

        def sample(rng: random.Random, n: int) -> list[TrainSeq]:
            out = []
            for _ in range(n):
                t, ex = rng.choice(flat)
                out.append(
                    _plain(tok, ex, t)
                    if self.stage == "sequential"
                    else annotated_seq(tok, ex, sample_style(rng, ex.meta, self.styles))
                )
            return pack(out)

        return sample

    def prepare(self, model: TinyLM, tok: Tokenizer, seed: int, progress: bool = True):
        """(sample_batch, loss_fn) for `runtime.train.sft.train`."""
        if self.stage != "preference":
            return self.sampler(tok, seed), loss_of
        pairs, stats = preference_pairs(self, model, tok, seed, progress)
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        # a dict of this recipe's own: `for_stage`'s copies share the module RECIPE's `extra`, so
        # writing into it told every later recipe of the process (an sft run's checkpoint info too)
        # of these pairs
        self.extra = {**self.extra, "pairs": stats}

        def sample(rng: random.Random, n: int) -> list[TrainSeq]:
            chosen = [rng.choice(pairs) for _ in range(max(1, n // 2))]
            return [b for b, _ in chosen] + [w for _, w in chosen]

        return sample, dpo_loss(ref, self.dpo_beta)


STAGES: dict[str, dict[str, Any]] = {
    "sft": {"stage": "sft"},
    # 128 tokens: a word_facts answer (about 110 content tokens) fits, so its prompts take part;
    # lr 5e-5: at 1e-4 both lambdas' models were 3-4 points less accurate (docs/pasta.md)
    "preference": {
        "stage": "preference",
        "max_tokens": 128,
        "train": TrainConfig(steps=60, batch_size=16, lr=5e-5, warmup_steps=5),
    },
    "sequential": {"stage": "sequential", "extra": {"eval_system": "sequential"}},
}


def seq_logp(model: TinyLM, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed target log-probability per sequence (B,) and the token count per sequence (B,)."""
    ids, pos, tgt, _, mask = batch
    logits = model.forward_dense(ids, pos, mask)  # (B, T, V)
    valid = tgt != IGNORE
    lp = torch.gather(F.log_softmax(logits.float(), -1), -1, tgt.clamp(min=0)[..., None])[..., 0]
    return (lp * valid).sum(-1), valid.sum(-1)


def dpo_loss(ref: TinyLM, beta: float) -> Callable[[TinyLM, tuple[torch.Tensor, ...]], torch.Tensor]:
    """Batch = chosen sequences then rejected ones. Loss: NLL of the chosen (per token) plus DPO."""

    def loss(model: TinyLM, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        lp, n = seq_logp(model, batch)
        with torch.no_grad():
            ref_lp, _ = seq_logp(ref, batch)
        m = lp.shape[0] // 2
        margin = (lp[:m] - ref_lp[:m]) - (lp[m:] - ref_lp[m:])
        return -(lp[:m].sum() / n[:m].sum().clamp(min=1)) - F.logsigmoid(beta * margin).mean()

    return loss


def reward_quality(exact: float, reference: str, output: str) -> float:
    """Quality in the preference reward: the exact score softened by character similarity, so that
    samples of a weak model that are all wrong line by line are still ranked (the paper's judge is
    an LLM and soft too). Evaluation always uses the exact scorer."""
    return 0.5 * exact + 0.5 * difflib.SequenceMatcher(None, reference, output).ratio()


class StructureSampler(PastaEngine):
    """Greedy decoding except at structural choices: where a PASTA-LANG tag that changes the
    structure (a promise, `<sync/>`) is one of the two likeliest tokens, one of those two is sampled
    at `temperature`. The candidates then differ in structure (fork or write inline, close before or
    after the chunks) with greedy content, so their scores compare structures, not sampling noise."""

    def __init__(self, model: TinyLM, tok: Tokenizer, config, temperature: float, seed: int) -> None:
        super().__init__(model, tok, config)
        self.temperature, self.gen = temperature, torch.Generator().manual_seed(seed)
        # structural class of a token: any promise opening (plain or fused with its topic), `<sync/>`
        self.kind = {**{i: "promise" for i in PastaParser(tok).open_ids}, tok.token_id(SYNC): "sync"}

    def choose(self, lay, sids, logits, sample) -> list[int]:
        top = logits.float().topk(2, dim=-1)
        out = []
        for ids, values in zip(top.indices.tolist(), top.values):
            a, b = (self.kind.get(i, "text") for i in ids)
            pick = 0
            if a != b:  # a choice between structures (not between two topics or two bytes)
                pick = int(torch.multinomial((values / self.temperature).softmax(-1), 1, generator=self.gen))
            out.append(ids[pick])
        return out


def structure_of(c, n_parts: int, sync_id: int) -> str:
    """A candidate's annotation structure: `none` (no thread forked), `all` (a thread per part) or
    `some` (fewer, e.g. one per pair of parts), `+eager` when the main thread wrote text between the
    last chunk and `<sync/>` (the closing part written before it could see the chunks)."""
    forks = len({r.stream for r in c.tokens if r.stream > MAIN})
    if not forks:
        return "none"
    ids = c.output_ids
    at = ids.index(sync_id) if sync_id in ids else -1
    eager = at > 0 and c.tokens[at - 1].stream == MAIN and c.tokens[at - 1].kind == "content"
    return ("all" if forks >= n_parts else "some") + ("+eager" if eager else "")


def rank_candidates(per_prompt: list, lam: float, structure_weight: float):
    """Reward of each candidate (dicts with `structure`, `q`, `speedup`) of each prompt
    (`(task, example, candidates)`): speedup + lam * ((1 - w) * q + w * E[q | task, structure]),
    the expectation over every candidate of the stage. Returns, per prompt, the indices of its
    (best, worst) candidates or None when they score the same, the expectations and their counts."""
    groups: dict[tuple[str, str], list[float]] = {}
    for t, _, cands in per_prompt:
        for c in cands:
            groups.setdefault((t, c["structure"]), []).append(c["q"])
    expected = {key: float(np.mean(qs)) for key, qs in groups.items()}
    w, out = structure_weight, []
    for t, _, cands in per_prompt:
        rewards = [c["speedup"] + lam * ((1 - w) * c["q"] + w * expected[(t, c["structure"])]) for c in cands]
        order = sorted(range(len(cands)), key=lambda k: rewards[k])
        ok = len(cands) >= 2 and rewards[order[-1]] > rewards[order[0]] + 1e-6
        out.append((order[-1], order[0]) if ok else None)
    return out, expected, {k: len(v) for k, v in groups.items()}


def preference_pairs(r: PastaRecipe, model: TinyLM, tok: Tokenizer, seed: int, progress: bool) -> tuple[list, dict]:
    """Candidates per prompt: the greedy answer, `structure_samples` structural samples
    (`StructureSampler`) and `samples_per_prompt` whole samples; each scored by theoretical speedup
    + lambda * quality; keep (best, worst). With the greedy answer among the candidates a
    quality-weighted lambda keeps the SFT model's answers where they are best; the structural
    samples give each prompt answers of different speed whose quality differs only by structure.

    Quality in the reward is `(1 - structure_weight) * q + structure_weight * E[q | task, structure]`:
    the candidate's own (soft) quality mixed with the mean quality of every candidate of the same
    task family and structure (`structure_of`) in this stage. The model chooses a structure from the
    prompt alone and cannot see whether, on this prompt, the closing part would come out right
    without the chunks; per prompt an eager answer that happens to be right is the best under any
    lambda, so with the candidate's own quality alone both lambdas learn the same policy. The
    expected term is what a high lambda can act on: it keeps the structures that are right on
    average for a task and drops those that are right only by luck."""
    rng = random.Random(f"pasta-pref:{seed}")
    flat = r.pools(seed + 1)
    prompts = rng.sample(flat, min(r.pref_prompts, len(flat)))
    model.eval()
    sync_id = tok.token_id(SYNC)
    t0, per_prompt = time.perf_counter(), []
    for i, (t, ex) in enumerate(prompts):
        per_prompt.append((t, ex, _candidates(r, model, tok, seed, i, t, ex, sync_id)))
        if progress and i % 32 == 0:
            print(f"preference sampling {i}/{len(prompts)} ({time.perf_counter() - t0:.0f} s)", flush=True)
    best_worst, expected, counts = rank_candidates(per_prompt, r.lam, r.structure_weight)
    pairs, scores = [], []
    for (_t, ex, cands), bw in zip(per_prompt, best_worst):
        if bw is not None:
            best, worst = cands[bw[0]], cands[bw[1]]
            p = prompt_ids(tok, ex.prompt)
            pairs.append((to_seq(tok, p, best["ids"]), to_seq(tok, p, worst["ids"])))
            scores.append((best["q"], worst["q"], best["structure"]))
    if not pairs:
        raise RuntimeError("preference stage: no prompt gave two differently scored samples")
    stats = {
        "pairs": len(pairs),
        "prompts": len(prompts),
        "sampling_s": round(time.perf_counter() - t0, 1),
        "chosen_quality": round(float(np.mean([a for a, _, _ in scores])), 4),
        "rejected_quality": round(float(np.mean([b for _, b, _ in scores])), 4),
        "chosen_structures": dict(sorted(Counter(st for _, _, st in scores).items())),
        "expected_quality": {f"{t}/{st}": [round(expected[(t, st)], 4), counts[(t, st)]] for t, st in sorted(expected)},
    }
    return pairs, stats


def _candidate_engine(r: PastaRecipe, model: TinyLM, tok: Tokenizer, seed: int, i: int, k: int):
    """The engine of prompt i's k-th candidate: k = 0 the greedy answer, 1..structure_samples a
    `StructureSampler`, the rest whole samples at `pref_temperature`."""
    from runtime.engines import GenerationConfig
    from runtime.sampling import SamplingConfig

    if k <= r.structure_samples:
        cfg = GenerationConfig(max_tokens=r.max_tokens)
        if k == 0:
            return PastaEngine(model, tok, cfg)
        return StructureSampler(model, tok, cfg, r.structure_temperature, seed * 7919 + 1000 * i + k)
    cfg = GenerationConfig(max_tokens=r.max_tokens, sampling=SamplingConfig(r.pref_temperature, 1.0, seed * 7919 + k))
    return PastaEngine(model, tok, cfg)


def _candidates(
    r: PastaRecipe, model: TinyLM, tok: Tokenizer, seed: int, i: int, t: str, ex: Example, sync_id: int
) -> list[dict]:
    """Prompt i's scored candidates (structure, soft quality, speedup, output ids); those that hit
    the thread limit or cut a chunk are left out."""
    from runtime.engines import Request

    task, cands = get_task(t), []
    for k in range(1 + r.structure_samples + r.samples_per_prompt):
        c = _candidate_engine(r, model, tok, seed, i, k).generate(Request(i, ex.prompt))
        if c.status != "ok" or any(e["event"] in ("max_threads", "chunk_cut") for e in c.events):
            continue
        q = reward_quality(task.score(ex, c.text), ex.answer, c.text)
        cands.append(
            {
                "structure": structure_of(c, len(ex.meta["parts"]), sync_id),
                "q": q,
                "speedup": c.theoretical_speedup,
                "ids": c.output_ids,
            }
        )
    return cands


RECIPE = PastaRecipe(
    "pasta",
    ALL_TASKS,
    "tiny-4l",
    TrainConfig(steps=2000, batch_size=32, lr=3e-3),
    _fine,
    train_examples=20000,
    eval_examples=24,
    max_tokens=96,
)
