"""Training code under hand mutants (a mutation round on runtime/train and the skeleton engine):
each test pins what a model is trained on (which tokens, which positions, which visibility, which
loss weight) or how a recipe is looked up and refused, on hand-built examples small enough to
check exactly."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
import torch.nn.functional as F

from profiler.errors import UsageError
from runtime.registry import UnknownName
from runtime.tasks import Example, get_task
from runtime.train import pasta, planned_diffusion, recipes, sft, tip
from runtime.train.sft import IGNORE, TrainConfig, TrainSeq

# --- recipes.py -------------------------------------------------------------------------------


def test_causal_seq_trains_on_the_answer_and_eos_only(tok):
    seq = recipes.causal_seq(tok, "hi", [120, 121])
    prefix = [tok.bos_id, *tok.encode("hi"), tok.token_id("<sep>")]
    assert seq.ids == [*prefix, 120, 121, tok.eos_id]
    assert seq.positions == list(range(len(prefix) + 3))
    # the <sep> row predicts the first answer token; the <eos> row predicts nothing
    assert seq.targets == [IGNORE] * (len(prefix) - 1) + [120, 121, tok.eos_id, IGNORE]
    assert seq.mask is None and seq.weights is None


def test_recipe_sampler_splits_examples_evenly_and_draws_at_random(tok):
    seen = []

    def build(tok, ex, task):
        seen.append((task, ex.prompt))
        return TrainSeq([0], [0], [IGNORE])

    r = recipes.Recipe("x", ("reverse_words", "copy_line"), "tiny-2l", TrainConfig(), build, train_examples=6)
    sample = r.sampler(tok, 0)
    rng = random.Random(0)
    assert len(sample(rng, 5)) == 5
    for _ in range(40):
        sample(rng, 5)
    per_task = {t: len({p for u, p in set(seen) if u == t}) for t in r.tasks}
    assert per_task == {"reverse_words": 3, "copy_line": 3}  # 6 examples, 3 per task, all drawn


def test_recipe_without_a_builder_is_refused(tok):
    r = recipes.Recipe("x", ("reverse_words",), "tiny-2l", TrainConfig(), None, train_examples=2)
    with pytest.raises(TypeError, match="the x recipe has no per-example builder"):
        r.sampler(tok, 0)


def test_unknown_recipe_names_the_valid_ones():
    with pytest.raises(UnknownName, match=r"unknown training recipe 'nope'; valid training recipes: .*sequential"):
        recipes.get_recipe("nope")
    assert recipes.get_recipe("planned_diffusion") is planned_diffusion.RECIPE
    assert recipes.get_recipe("tip") is tip.RECIPE and recipes.get_recipe("pasta") is pasta.RECIPE


def _recorded_train(name: str) -> dict:
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "checkpoints" / name / "config.json"
    return json.loads(root.read_text())["info"]["train"]


@pytest.mark.parametrize(
    "name,cfg",
    [
        ("sequential-tiny", recipes.SEQUENTIAL.train),
        ("pasta-sft", pasta.RECIPE.train),
        ("pasta-fast", pasta.STAGES["preference"]["train"]),
    ],
)
def test_shipped_defaults_are_the_settings_the_checkpoints_were_trained_with(name, cfg):
    """checkpoints/README.md: the shipped commands reproduce the checkpoints with the defaults."""
    rec = _recorded_train(name)
    got = dataclasses.asdict(cfg)
    assert {k: got[k] for k in ("steps", "batch_size", "lr", "warmup_steps", "weight_decay", "grad_clip")} == {
        k: rec[k] for k in ("steps", "batch_size", "lr", "warmup_steps", "weight_decay", "grad_clip")
    }


# --- sft.py -----------------------------------------------------------------------------------


def test_collate_pads_with_no_loss_and_self_only_visibility():
    m = torch.tensor([[True, False], [True, True]])
    a = TrainSeq([5, 6, 7], [0, 1, 2], [6, 7, IGNORE])
    b = TrainSeq([8, 9], [3, 4], [IGNORE, 9], mask=~m, weights=[0.5, 2.0])
    ids, pos, tgt, w, mask = sft.collate([a, b], pad_id=1)
    assert ids.tolist() == [[5, 6, 7], [8, 9, 1]]
    assert pos.tolist() == [[0, 1, 2], [3, 4, 0]]
    assert tgt.tolist() == [[6, 7, IGNORE], [IGNORE, 9, IGNORE]]
    assert w.tolist() == [[1.0, 1.0, 1.0], [0.5, 2.0, 0.0]]
    assert mask[0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]  # causal
    assert mask[1].tolist() == [[False, True, False], [False, False, False], [False, False, True]]  # pad: itself


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    cfg = TrainConfig(steps=10, lr=1.0, warmup_steps=4)
    assert [cfg.lr_at(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert cfg.lr_at(4) == pytest.approx(1.0)  # cosine starts at the peak
    assert cfg.lr_at(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cfg.lr_at(10) == pytest.approx(0.1) and cfg.lr_at(50) == pytest.approx(0.1)  # floor, never rises


class FixedLogits(torch.nn.Module):
    """A stand-in model whose dense forward returns the same logits (B, T, V) whatever it is fed."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(logits.clone())

    def forward_dense(self, ids, pos, mask):
        return self.logits


def test_loss_of_is_the_weighted_mean_over_target_positions():
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 6)
    tgt = torch.tensor([[IGNORE, 2, 3, IGNORE]])
    w = torch.tensor([[1.0, 1.0, 2.0, 0.0]])
    batch = (torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long), tgt, w, None)
    ce = [-F.log_softmax(logits[0, t], -1)[k] for t, k in ((1, 2), (2, 3))]
    want = (1.0 * ce[0] + 2.0 * ce[1]) / 3.0  # IGNORE rows (weight 1 or not) are not in the denominator
    assert sft.loss_of(FixedLogits(logits), batch).item() == pytest.approx(want.item(), rel=1e-5)


def _constant_loss_train(monkeypatch, cfg: TrainConfig):
    """Run `sft.train` with a loss equal to the step index (so the log's mean is checkable) and
    record, at every optimizer step, each parameter group's lr and weight decay."""
    from runtime.model import ModelConfig, TinyLM

    model = TinyLM(ModelConfig.from_name("tiny-2l"), seed=1)
    seen: list[list[tuple[float, float, int]]] = []
    orig = torch.optim.AdamW.step

    def step(self, *a, **k):
        seen.append([(g["lr"], g["weight_decay"], sorted({p.dim() for p in g["params"]})) for g in self.param_groups])
        return orig(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    n = iter(range(10**6))

    def loss_fn(m, batch):
        return sum((p * 0).sum() for p in m.parameters()) + float(next(n))

    seq = TrainSeq([1, 2, 3], [0, 1, 2], [2, 3, IGNORE])
    log = sft.train(model, lambda rng, k: [seq] * k, cfg, pad_id=0, progress=False, loss_fn=loss_fn)
    return model, log, seen


def test_train_steps_with_the_scheduled_lr_and_decays_matrices_only(monkeypatch):
    cfg = TrainConfig(steps=60, batch_size=1, lr=1.0, warmup_steps=3)
    _, log, seen = _constant_loss_train(monkeypatch, cfg)
    assert [s[0][0] for s in seen] == [cfg.lr_at(i) for i in range(60)]
    decay, no_decay = seen[0]
    assert decay[1:] == (cfg.weight_decay, [2]) and no_decay[1:] == (0.0, [1])  # matrices decay, vectors not
    assert log["steps"] == 60 and log["final_loss"] == sum(range(10, 60)) / 50  # mean of the last 50


def test_train_is_deterministic_from_its_seed(tok):
    from runtime.model import ModelConfig, TinyLM

    def run():
        torch.manual_seed(123 + random.randrange(1000))  # whatever the global state, the seed decides
        model = TinyLM(ModelConfig.from_name("tiny-2l"), seed=1)
        p = torch.nn.Parameter(torch.zeros(()))
        model.register_parameter("noise_probe", p)

        def loss_fn(m, batch):
            return sft.loss_of(m, batch) + (torch.randn(()) * m.noise_probe) ** 2 + m.noise_probe

        seq = TrainSeq([1, 2, 3], [0, 1, 2], [2, 3, IGNORE])
        sft.train(
            model, lambda rng, k: [seq] * k, TrainConfig(steps=2, batch_size=1, warmup_steps=1), 0, False, loss_fn
        )
        return [q.detach().clone() for q in model.parameters()]

    for x, y in zip(run(), run()):
        assert torch.equal(x, y)


# --- pasta.py ---------------------------------------------------------------------------------


def _gold(tok, name="word_facts", style="fine"):
    from runtime.lang.pasta import annotate

    ex = get_task(name).examples("test", 1)[0]
    return ex, pasta.prompt_ids(tok, ex.prompt), tok.encode(annotate(ex.meta, tok, style)) + [tok.eos_id]


def test_to_seq_trains_on_each_sampled_token_once_and_never_on_forced_tags(tok):
    ex, prompt, answer = _gold(tok)
    lay, _ = pasta.replay(tok, prompt, answer)
    sampled = sorted(o.token_id for s in lay.streams.values() for o in s.outs if not o.forced)
    seq = pasta.to_seq(tok, prompt, answer)
    assert sorted(t for t in seq.targets if t != IGNORE) == sampled
    assert len(sampled) == len(answer) - len(ex.meta["parts"])  # one forced <async> per thread
    assert seq.targets[: len(prompt) - 1] == [IGNORE] * (len(prompt) - 1) and seq.weights is None
    assert pasta.to_seq(tok, prompt, answer, weight=0.5).weights == [0.5] * len(seq.ids)
    # an SFT sequence is the annotated answer and its <eos>, which main's last row learns to write
    sft_seq = pasta.annotated_seq(tok, ex, "fine")
    assert sft_seq.ids == seq.ids and sft_seq.targets == seq.targets and seq.targets.count(tok.eos_id) == 1


def test_replay_refuses_an_answer_without_the_forced_async(tok):
    _, prompt, answer = _gold(tok)
    lay, _ = pasta.replay(tok, prompt, answer)
    first_forced = next(i for i, t in enumerate(answer) if t == lay.async_id)
    with pytest.raises(ValueError, match="expected the forced <async>"):
        pasta.replay(tok, prompt, answer[:first_forced] + [120] + answer[first_forced + 1 :])


def test_pack_first_fit_longest_first_block_diagonal():
    full = torch.ones((3, 3), dtype=torch.bool)
    a = TrainSeq([1, 1, 1, 1], [0, 1, 2, 3], [1, 1, 1, IGNORE])
    b = TrainSeq([2, 2, 2], [5, 6, 7], [2, 2, IGNORE], mask=full)
    c = TrainSeq([3], [9], [IGNORE])
    d = TrainSeq([4, 4], [0, 1], [4, IGNORE])
    rows = pasta.pack([c, d, b, a])
    assert [r.ids for r in rows] == [[1, 1, 1, 1], [2, 2, 2, 3], [4, 4]]
    bc = rows[1]
    assert bc.positions == [5, 6, 7, 9] and bc.targets == [2, 2, IGNORE, IGNORE]
    want = torch.zeros((4, 4), dtype=torch.bool)
    want[:3, :3], want[3, 3] = True, True
    assert torch.equal(bc.mask, want)
    assert torch.equal(rows[0].mask, torch.ones((4, 4), dtype=torch.bool).tril())  # None = causal


def test_seq_logp_and_dpo_loss_by_hand():
    torch.manual_seed(0)
    V = 5
    logits = torch.randn(4, 3, V)
    ref_logits = torch.randn(4, 3, V)
    tgt = torch.tensor([[1, 2, IGNORE], [IGNORE, 0, 4], [3, IGNORE, IGNORE], [2, 2, 2]])
    z = torch.zeros(4, 3, dtype=torch.long)
    batch = (z, z, tgt, torch.ones(4, 3), None)

    def by_hand(lg):
        lp = [
            sum(F.log_softmax(lg[b, t], -1)[k] for t, k in enumerate(tgt[b].tolist()) if k != IGNORE) for b in range(4)
        ]
        return torch.stack(lp), torch.tensor([sum(k != IGNORE for k in row) for row in tgt.tolist()])

    lp, n = pasta.seq_logp(FixedLogits(logits), batch)
    want_lp, want_n = by_hand(logits)
    torch.testing.assert_close(lp, want_lp)
    assert n.tolist() == want_n.tolist() == [2, 2, 1, 3]
    ref_lp, _ = by_hand(ref_logits)
    beta = 0.3
    margin = (want_lp[:2] - ref_lp[:2]) - (want_lp[2:] - ref_lp[2:])  # chosen (first half) vs rejected
    want = -(want_lp[:2].sum() / 4) - F.logsigmoid(beta * margin).mean()
    got = pasta.dpo_loss(FixedLogits(ref_logits), beta)(FixedLogits(logits), batch)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_reward_quality_halves_exact_and_similarity():
    assert pasta.reward_quality(1.0, "ab", "xy") == pytest.approx(0.5)
    assert pasta.reward_quality(0.0, "ab", "ab") == pytest.approx(0.5)


def test_for_stage_checks_stage_and_lambda():
    with pytest.raises(UsageError, match=r"pasta stages are: sft, preference, sequential; got 'x'"):
        pasta.RECIPE.for_stage("x")
    with pytest.raises(UsageError, match="not with --stage sequential"):
        pasta.RECIPE.for_stage("sequential", lam=1.0)
    r = pasta.RECIPE.for_stage("preference", lam=0.5)
    assert r.lam == 0.5 and r.stage == "preference" and r.max_tokens == 128
    assert pasta.RECIPE.for_stage("preference").lam == pasta.RECIPE.lam


def test_pools_weight_tasks():
    r = dataclasses.replace(pasta.RECIPE, tasks=("word_facts", "copy_line"), train_examples=30)
    got = [t for t, _ in r.pools(0)]
    assert got.count("word_facts") == 20 and got.count("copy_line") == 10  # copy_line weighs 0.5


def test_sequential_stage_samples_plain_answers_and_sft_annotated_ones(tok):
    from runtime.lang.pasta import PastaParser

    opens = set(PastaParser(tok).open_ids)
    for stage, annotated in (("sequential", False), ("sft", True)):
        r = dataclasses.replace(pasta.RECIPE.for_stage(stage), train_examples=8, styles={"fine": 1.0})
        sample, loss_fn = r.prepare(None, tok, 0, progress=False)
        assert loss_fn is sft.loss_of
        seqs = sample(random.Random(0), 6)
        assert any(i in opens for s in seqs for i in s.ids) == annotated, stage


def test_preference_batches_hold_chosen_then_rejected(tok, tiny_model, monkeypatch):
    def seq(k):
        return TrainSeq([k], [0], [IGNORE])

    pairs = [(seq(1), seq(2)), (seq(3), seq(4))]
    monkeypatch.setattr(pasta, "preference_pairs", lambda *a: (pairs, {"pairs": 2}))
    r = dataclasses.replace(pasta.RECIPE.for_stage("preference"), extra={})
    sample, _ = r.prepare(tiny_model, tok, 0, progress=False)
    one = sample(random.Random(0), 1)  # even a batch of one holds a pair
    assert len(one) == 2 and (one[0].ids[0], one[1].ids[0]) in {(1, 2), (3, 4)}
    four = [s.ids[0] for s in sample(random.Random(0), 4)]
    assert len(four) == 4 and all(b - a == 1 for a, b in zip(four[:2], four[2:]))
    assert r.extra["pairs"] == {"pairs": 2}


def test_pack_keeps_each_sequences_loss_weights():
    """Was: packing dropped `weights` (every packed position then weighed 1)."""
    a = TrainSeq([1, 2, 3], [0, 1, 2], [2, 3, IGNORE], weights=[0.5, 2.0, 1.0])
    b = TrainSeq([4, 5], [0, 1], [5, IGNORE])
    c = TrainSeq([6] * 5, list(range(5)), [6] * 4 + [IGNORE])  # the longest sets the row length
    alone, row = pasta.pack([a, b, c])
    assert alone.ids == c.ids and alone.weights is None
    assert row.ids == [1, 2, 3, 4, 5] and row.weights == [0.5, 2.0, 1.0, 1.0, 1.0]


def test_preference_statistics_stay_with_their_recipe(tok, tiny_model, monkeypatch):
    """Was: `prepare` wrote the pairs' statistics into the `extra` dict that every `for_stage` copy
    shares with the module's RECIPE, so a later sft run in the same process recorded them too."""
    monkeypatch.setattr(pasta, "preference_pairs", lambda *a: ([(TrainSeq([1], [0], [IGNORE]),) * 2], {"pairs": 1}))
    before = dict(pasta.RECIPE.extra)
    r = pasta.RECIPE.for_stage("preference")
    r.prepare(tiny_model, tok, 0, progress=False)
    assert r.extra["pairs"] == {"pairs": 1}
    assert pasta.RECIPE.extra == before and "pairs" not in pasta.RECIPE.for_stage("sft").extra


def test_candidate_engines_greedy_then_structure_then_samples(tiny_model, tok):
    r = dataclasses.replace(pasta.RECIPE, structure_samples=2, samples_per_prompt=2)
    kinds = [type(pasta._candidate_engine(r, tiny_model, tok, 0, 0, k)).__name__ for k in range(5)]
    assert kinds == ["PastaEngine", "StructureSampler", "StructureSampler", "PastaEngine", "PastaEngine"]


def test_candidates_drop_failed_and_cut_answers(tok, monkeypatch):
    from types import SimpleNamespace

    outcomes = [("ok", []), ("ok", ["chunk_cut"]), ("ok", ["max_threads"]), ("length", []), ("ok", ["other"])]

    class Fake:
        def __init__(self, k):
            self.k = k

        def generate(self, req):
            status, events = outcomes[self.k]
            return SimpleNamespace(
                status=status,
                events=[{"event": e} for e in events],
                text="x",
                tokens=[],
                output_ids=[self.k],
                theoretical_speedup=1.0,
            )

    monkeypatch.setattr(pasta, "_candidate_engine", lambda r, m, t, s, i, k: Fake(k))
    r = dataclasses.replace(pasta.RECIPE, structure_samples=2, samples_per_prompt=2)
    ex = get_task("word_facts").examples("test", 1)[0]
    cands = pasta._candidates(r, None, tok, 0, 0, "word_facts", ex, tok.token_id("<sync/>"))
    assert [c["ids"] for c in cands] == [[0], [4]]


# --- planned_diffusion.py ---------------------------------------------------------------------


class Draws:
    """A `random.Random` stand-in whose `random()` returns scripted values."""

    def __init__(self, *xs: float) -> None:
        self.xs = list(xs)

    def random(self) -> float:
        return self.xs.pop(0)


def test_hybrid_seq_ar_targets_skip_spans_and_masked_span_tokens_weigh_one_over_t(tok):
    from runtime.engines.diffusion_common import EPS, Seg, hybrid_mask

    a, b, pad, sync = (tok.token_id(x) for x in ("<async>", "</async>", "[PAD]", "<sync/>"))
    ids = [tok.bos_id, 104, tok.token_id("<sep>"), 120, 121, a, 65, 66, pad, b, sync]
    segs = [Seg("ar", 5), Seg("span", 5), Seg("sync", 1)]
    seq = planned_diffusion.hybrid_seq(tok, ids, segs, 3, Draws(0.5, 0.1, 0.9, 0.2))
    t = (1 - EPS) * 0.5 + EPS
    M = tok.token_id("[MASK]")
    # AR from the <sep> row on; the last AR row before the span predicts the <sync/> after it
    assert seq.targets == [IGNORE, IGNORE, 120, 121, sync, IGNORE, 65, IGNORE, pad, IGNORE, IGNORE]
    assert seq.ids == [*ids[:6], M, 66, M, b, sync]  # draws 0.1 and 0.2 < t: masked; the tags never
    assert seq.weights[:5] == [0.0, 0.0, 1.0, 1.0, 1.0] and seq.weights[9:] == [0.0, 0.0]
    assert seq.weights[5] == 0.0 and seq.weights[7] == 1.0  # unmasked span token: 1 (in the denominator)
    assert seq.weights[6] == seq.weights[8] == pytest.approx(1 / t, rel=1e-12)
    assert seq.positions == list(range(11)) and torch.equal(seq.mask, hybrid_mask(segs, True))


def test_hybrid_loss_divides_by_ar_targets_and_span_tokens():
    torch.manual_seed(1)
    logits = torch.randn(1, 4, 6)
    tgt = torch.tensor([[2, IGNORE, 3, IGNORE]])
    w = torch.tensor([[1.0, 1.0, 4.0, 0.0]])  # row 1: an unmasked span token (no target, but counted)
    z = torch.zeros(1, 4, dtype=torch.long)
    ce = [-F.log_softmax(logits[0, t], -1)[k] for t, k in ((0, 2), (2, 3))]
    want = (ce[0] + 4.0 * ce[1]) / 3
    got = planned_diffusion.hybrid_loss(FixedLogits(logits), (z, z, tgt, w, None))
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_lay_out_pads_spans_to_their_units_and_merges_ar_text(tok):
    from runtime.engines.diffusion_common import Seg
    from runtime.lang.planned_diffusion import Round, Span, entry_text

    a, b, pad, sync = (tok.token_id(x) for x in ("<async>", "</async>", "[PAD]", "<sync/>"))
    rounds = [
        Round((120,), (Span("a", 1, (65, 66, 67)), Span("b", 1, (68, 69, 70, 71))), "sync"),
        Round((), (), "eos"),
    ]
    ids, segs = planned_diffusion.lay_out(tok, "p", rounds, unit=3)
    prefix = planned_diffusion.prefix_ids(tok, "p")
    plan = [120, *tok.encode(entry_text("a", 1) + entry_text("b", 1))]
    assert ids == [*prefix, *plan, a, 65, 66, 67, b, a, 68, 69, 70, b, sync, tok.eos_id]  # exact fit; cut at 3
    assert segs == [Seg("ar", len(prefix) + len(plan)), Seg("span", 5), Seg("span", 5), Seg("sync", 1), Seg("ar", 1)]
    ids, _ = planned_diffusion.lay_out(tok, "p", [Round((), (Span("a", 2, (65,)),), "eos")], unit=3)
    assert ids[-9:] == [a, 65, pad, pad, pad, pad, pad, b, tok.eos_id]  # 2 units of 3: 1 token, 5 [PAD]s


def _pd_example():
    return Example(
        "facts: ab,cd",
        "ab up AB rev ba len 2\ncd up CD rev dc len 2\nini AC",
        {"parts": ["ab up AB rev ba len 2\n", "cd up CD rev dc len 2\n"], "topics": ["a", "c"], "closing": "ini AC"},
    )


def test_mdm_sequence_is_the_answer_in_one_span_padded_up_to_max_len(tok):
    ex = _pd_example()
    answer = tok.encode(ex.answer)
    n = len(planned_diffusion.prefix_ids(tok, ex.prompt))
    a, b, pad = (tok.token_id(x) for x in ("<async>", "</async>", "[PAD]"))
    r = dataclasses.replace(planned_diffusion.RECIPE, extra={**planned_diffusion.RECIPE.extra, "mdm_max_len": 0})
    seq = r.make_seq(tok, ex, random.Random(0), "mdm")
    assert len(seq.ids) == n + len(answer) + 2  # max len below the answer: no padding at all
    lens = set()
    r = dataclasses.replace(r, extra={**r.extra, "mdm_max_len": len(answer) + 2})
    for s in range(30):
        rng = random.Random(s)
        seq = r.make_seq(tok, ex, rng, "mdm")
        lens.add(len(seq.ids) - n - 2)
        assert seq.ids[n] == a and seq.ids[-1] == b
        assert all(
            x == pad
            for x, y in zip(seq.ids[n + 1 + len(answer) : -1], seq.targets[n + 1 + len(answer) : -1])
            if y == IGNORE
        )
    assert lens == {len(answer), len(answer) + 1, len(answer) + 2}


def test_dense_fraction_chooses_the_mask(tok):
    ex = _pd_example()
    masks = {}
    for dense in (0.0, 1.0):
        r = dataclasses.replace(planned_diffusion.RECIPE, extra={**planned_diffusion.RECIPE.extra, "dense": dense})
        masks[dense] = r.make_seq(tok, ex, random.Random(5), "pd").mask
    # the block-sparse mask (dense 0) is strictly inside the dense one (siblings see each other)
    assert bool((masks[0.0] <= masks[1.0]).all()) and not torch.equal(masks[0.0], masks[1.0])


def test_mdm_fraction_chooses_the_kind_of_batch(tok):
    for mdm, has_plan in ((0.0, True), (1.0, False)):
        r = dataclasses.replace(
            planned_diffusion.RECIPE, train_examples=8, extra={**planned_diffusion.RECIPE.extra, "mdm": mdm}
        )
        sample = r.sampler(tok, 0)
        rng = random.Random(0)
        for _ in range(3):
            # a PD sequence ends its last round with <eos>; a plain diffusion one with its span's </async>
            assert all((s.ids[-1] == tok.eos_id) == has_plan for s in sample(rng, 2)), mdm


def test_pd_stages_and_loss(tok):
    r = planned_diffusion.RECIPE
    assert r.for_stage("") is r and r.for_stage("pd") is r
    ar = r.for_stage("ar")
    assert ar.train == planned_diffusion.AR_TRAIN and ar.build is recipes._plain and ar.tasks == r.tasks
    with pytest.raises(UsageError, match="planned_diffusion stages are: pd"):
        r.for_stage("x")
    with pytest.raises(UsageError, match="planned_diffusion has none"):
        r.for_stage("pd", lam=1.0)
    _, loss_fn = dataclasses.replace(r, train_examples=4).prepare(None, tok, 0, False)
    assert loss_fn is planned_diffusion.hybrid_loss


# --- tip.py -----------------------------------------------------------------------------------


def test_tip_seq_targets_positions_and_mask(tok):
    from runtime.lang.tip import annotate, tip_visibility

    ex = get_task("var_tracking").examples("test", 1)[0]
    prefix = [tok.bos_id, *tok.encode(ex.prompt), tok.token_id("<sep>")]
    for registers in (5, 2):
        out = tok.encode(annotate(ex.meta["steps"], ex.meta["deps"], registers, ex.meta["final"]).text)
        seq = tip.tip_seq(tok, ex, registers)
        assert seq.ids == [*prefix, *out, tok.eos_id]
        assert seq.targets == [IGNORE] * (len(prefix) - 1) + [*out, tok.eos_id, IGNORE]
        assert seq.positions == list(range(len(seq.ids)))
        assert torch.equal(seq.mask, tip_visibility(seq.ids, len(prefix), tok, registers)[0])
        assert not bool(seq.mask.tril().all())  # some step is dead, hence invisible to later tokens
        dense = tip.tip_seq(tok, ex, registers, dense=True)
        assert dense.mask is None and dense.ids == seq.ids and dense.targets == seq.targets


def test_tip_sampler_dense_fraction(tok):
    for frac, dense in ((1.0, True), (0.0, False)):
        r = dataclasses.replace(tip.RECIPE, train_examples=6, extra={"registers": 5, "dense_fraction": frac})
        seqs = [s for _ in range(3) for s in r.sampler(tok, 0)(random.Random(0), 4)]
        assert all((s.mask is None) == dense for s in seqs), frac


def test_replay_skips_the_async_forced_after_a_nested_promise(tiny_model, tok):
    """A promise inside a chunk is written inline: the interpreter forces its `<async>`, so the
    replay must skip that token in the answer, as it does for a thread's first token."""
    from runtime.engines import GenerationConfig, Request
    from runtime.engines.pasta import MAIN, PastaEngine
    from runtime.lang.pasta import ASYNC_END, PROMISE_OPEN, SYNC, promise_close

    P, C, E = tok.token_id(PROMISE_OPEN), tok.token_id(promise_close(10)), tok.token_id(ASYNC_END)
    scripts = {MAIN: [P, *b"a", C, tok.token_id(SYNC), *b"ok"], 1: [P, *b"x", C, *b"yz", E, *b"w", E]}

    class Nested(PastaEngine):
        def choose(self, lay, sids, logits, sample):
            out = []
            for sid in sids:
                n = sum(1 for o in lay.streams[sid].outs if not o.forced)
                out.append(scripts[sid][n] if n < len(scripts[sid]) else tok.eos_id)
            return out

    c = Nested(tiny_model, tok, GenerationConfig(max_tokens=64)).generate(Request(0, "facts: ab"))
    assert c.status == "ok" and [e["event"] for e in c.events] == ["nested_promise"]
    prompt = pasta.prompt_ids(tok, "facts: ab")
    lay, targets = pasta.replay(tok, prompt, c.output_ids)
    # the engine's rows, but the final <eos> and the thread's closing </async> (never fed)
    last = max(i for i, t in enumerate(c.tokens) if t.stream == 1)
    rows = [(t.token_id, t.position_id) for i, t in enumerate(c.tokens[:-1]) if i != last]
    assert [(f.token_id, f.position) for f in lay.fed[len(prompt) :]] == rows
    assert len(targets) == len(c.output_ids) - 2  # sampled tokens only: two <async>s were forced


def test_rank_ignores_float_noise_between_equal_rewards():
    def cand(speedup):
        return {"structure": "all", "q": 1.0, "speedup": speedup}

    assert 0.1 + 0.2 != 0.3
    assert pasta.rank_candidates([("t", None, [cand(0.1 + 0.2), cand(0.3)])], 0.0, 0.5)[0] == [None]


# --- engines/skeleton.py ----------------------------------------------------------------------


@pytest.mark.parametrize("sync", [True, False])
def test_skeleton_plans_then_expands_every_point_at_once(tiny_model, tok, sync):
    """The skeleton (3 promises) is decoded alone, as `plan`; when main reaches `<sync/>`, or its
    `<eos>` when it writes none, the three points advance together; then main closes."""
    from runtime.engines import GenerationConfig
    from tests.runtime.test_pasta_engine import ScriptedSkeleton, main_script, run_steps

    script = main_script(tok) if sync else main_script(tok)[:-3]  # without `<sync/>ok`
    steps, c = run_steps(ScriptedSkeleton(tiny_model, tok, GenerationConfig(max_tokens=64), script=script))
    assert c.status == "ok"
    want = [("prefill", (0,))] + [("decode", (0,))] * 2 + [("plan", (0,))] * 7 + [("decode", (1, 2, 3))] * 6
    if sync:
        want += [("sync", (0,)), ("decode", (0,)), ("decode", (0,))]
    assert [(s.phase, tuple(s.streams)) for s in steps] == want


def test_rank_mixes_own_and_expected_quality_by_structure_weight():
    # one candidate per structure, so the expected quality is the candidate's own: the reward is
    # speedup + lam * q, whatever the weight (fast and wrong 1.0 + 0; slow and right 0 + 0.8)
    per_prompt = [
        ("t", None, [{"structure": "a", "q": 0.0, "speedup": 1.0}, {"structure": "b", "q": 1.0, "speedup": 0.0}])
    ]
    assert pasta.rank_candidates(per_prompt, 0.8, 0.5)[0] == [(0, 1)]
    assert pasta.rank_candidates(per_prompt, 1.2, 0.5)[0] == [(1, 0)]


def test_structure_of_calls_eager_only_text_written_just_before_sync():
    from types import SimpleNamespace

    def row(stream, kind):
        return SimpleNamespace(stream=stream, kind=kind)

    sync = 999
    # <sync/> first (nothing before it), then a chunk and main's closing text: not eager
    c = SimpleNamespace(tokens=[row(0, "tag"), row(1, "content"), row(0, "content")], output_ids=[sync, 97, 98])
    assert pasta.structure_of(c, 1, sync) == "all"
    c = SimpleNamespace(tokens=[row(1, "content"), row(0, "content"), row(0, "tag")], output_ids=[97, 98, sync])
    assert pasta.structure_of(c, 2, sync) == "some+eager"
