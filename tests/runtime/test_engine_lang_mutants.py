"""The engine base (`runtime.engines.base`), the tiny model (`runtime.model`) and the three
structure languages (`runtime.lang.pasta`, `.tip`, `.planned_diffusion`), pinned where a
mutation-testing round found them untested.

The round: 70 mutants (base 21, model 13, lang/pasta 11, lang/tip 12, lang/planned_diffusion 13),
run against the tests that exercise these modules (base and model: test_model_kv, test_sequential,
test_server_mutants, test_tip_mutants, test_same_scheduler; the languages: test_pasta_lang,
test_tip_lang, test_pd_lang, test_pd_mask). 46 were killed by those tests, 23 survived and are
killed by this file, 1 is equivalent, no bug was found:

- survivors, by module: base 10 (GenerationConfig's max_tokens bound, Step.as_row's emitted count,
  theoretical_speedup's divisor, PassInputs.kv_read's skipped rows, a replay chunk's `replayed`,
  `skip` and end, the prompt's room for one generated token and its largest id, a pass asking for
  attention when any request does); model 10 (check_fits' two bounds, d_ff's rounding up, the
  n_kv_heads check, from_dict ignoring unknown keys, RMSNorm's mean square, RoPE's frequencies and
  its rotation's sign, grouped attention scoring only groups that ask, SiLU); lang 3 (PASTA's eager
  closing before `<sync/>`, a prompt without parts is never annotated, a thread's `<async>` is a
  nested one). The network's arithmetic is pinned twice: the shipped `sequential-tiny` still
  reverses words (RMSNorm, RoPE), and TinyLM equals transformers' Llama on its weights (SwiGLU:
  with GELU the words still come out right, the logits move by about 5; skipped without
  transformers).
- equivalent: `annotate` (TIP) without the answer line's use of the last step. `next_use` is asked
  only of steps a register holds before step k is assigned, never of the last step, so the
  assignment cannot change. (The round's run counted it killed; against the same four files alone
  it passes: that failure was load-dependent, not the mutant.)
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from profiler.errors import UsageError
from runtime.engines import GenerationConfig, Request, SequentialEngine
from runtime.engines.base import (
    Completion,
    PassInputs,
    RequestState,
    Step,
    causal_inputs,
    pool_visibility,
    prepend,
    visibility_rows,
)
from runtime.kv import KVLayout, PagedKVStore, RequestKV
from runtime.lang import pasta, planned_diffusion, tip
from runtime.lang.pasta import ASYNC, ASYNC_END, PROMISE_OPEN, SYNC, Fork, Inline, PastaParser, promise_close
from runtime.lang.planned_diffusion import PlanParser, entry_text
from runtime.model import Group, ModelConfig, causal_mask, check_fits
from runtime.tokenizer import Tokenizer

TOK = Tokenizer()


# ---------------------------------------------------------------------------- engine base
def test_generation_config_refuses_zero_tokens_and_zero_pages():
    GenerationConfig(max_tokens=1, page_size=1)
    for kw in ({"max_tokens": 0}, {"page_size": 0}):
        with pytest.raises(UsageError):
            GenerationConfig(**kw)


def test_step_row_counts_streams_and_emitted_tokens_apart():
    row = Step(3, 1, "decode", (0, 2, 5), 3, 10, 12, 4096, emitted=(7, 8)).as_row()
    assert (row["streams"], row["active_streams"], row["emitted_tokens"]) == ("0,2,5", 3, 2)


def test_theoretical_speedup_is_tokens_over_the_critical_path():
    def comp(n, cp):
        return Completion(0, 3, list(range(n)), "", [], {}, cp, 1, 0, 0)

    assert comp(6, 3).theoretical_speedup == 2.0 and comp(6, 6).theoretical_speedup == 1.0
    assert comp(4, 0).theoretical_speedup == 4.0  # no critical path recorded: never a division by 0


def test_kv_read_leaves_out_the_skipped_rows():
    vis = np.array([[1, 1, 0], [1, 1, 1]], dtype=bool)
    inp = PassInputs([1, 2], [0, 1], [0, 1], np.arange(3), vis, "decode", skip=1)
    assert inp.kv_read == 3 and PassInputs([1, 2], [0, 1], [0, 1], np.arange(3), vis, "decode").kv_read == 5


def test_causal_inputs_write_only_the_new_slots_each_seeing_what_came_before():
    inp = causal_inputs([5, 6, 7, 8], [0, 1, 2, 3], [10, 11, 12, 13], "prefill", start=2)
    assert inp.slots == [12, 13] and inp.cols.tolist() == [10, 11, 12, 13]
    assert inp.vis.tolist() == [[True, True, True, False], [True, True, True, True]]
    one = causal_inputs([5, 6, 7], [0, 1, 2], [4, 5, 6], "decode", start=2)
    assert one.slots == [6] and one.vis.tolist() == [[True, True, True]]


def test_prepend_puts_the_replay_first_over_the_union_of_columns():
    replay = PassInputs([1, 2], [0, 1], [5, 9], np.array([5, 9]), np.array([[1, 0], [1, 1]], dtype=bool), "prefill")
    vis = np.array([[1, 0, 1]], dtype=bool)
    inp = PassInputs([3], [2], [7], np.array([5, 6, 7]), vis, "decode", attention=True)
    out = prepend(replay, inp)
    assert (out.ids, out.positions, out.slots) == ([1, 2, 3], [0, 1, 2], [5, 9, 7])
    assert out.cols.tolist() == [5, 6, 7, 9] and (out.skip, out.replayed) == (2, 2)
    assert out.phase == "decode" and out.attention
    assert out.vis.astype(int).tolist() == [[1, 0, 0, 0], [1, 0, 0, 1], [1, 0, 1, 0]]
    assert out.kv_read == 2
    assert prepend(None, inp) is inp


class FakeState(RequestState):
    """A request state with a scripted held list and prompt chunks (what `RequestState` itself does)."""

    def __init__(self, held=(), n=4, max_tokens=6):
        self.eng = SimpleNamespace(config=GenerationConfig(max_tokens=max_tokens))
        self.kv = RequestKV(PagedKVStore(KVLayout(1, 1, 2), page_size=4), request_id=0)
        self.n, self._held, self.restarts, self.chunks = n, list(held), 0, []

    def held(self):
        return self._held

    def remap(self, new_slots):
        self.remapped = list(new_slots)

    def restart_prefill(self):
        self.restarts += 1

    def prompt_chunk(self, k):
        self.chunks.append(k)
        return causal_inputs([0] * k, list(range(k)), list(range(k)), "prefill")


def test_readmit_queues_the_held_tokens_replay_and_counts_it():
    st = FakeState(held=[(7, 0, [0]), (8, 1, [0, 1]), (9, 4, [0, 2])])
    assert st.max_kv_tokens() == 4 + 6
    assert st.readmit() == 3 and (st.recomputes, st.recompute_tokens) == (1, 3)
    assert st.replay_rows() == 3 and st.remapped == st._replay.slots
    assert st._replay.vis.astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    assert st._replay.positions == [0, 1, 4]
    assert FakeState().readmit() == 0


def test_replay_chunks_are_skipped_rows_then_the_prompt_resumes():
    st = FakeState(held=[(7, 0, [0]), (8, 1, [0, 1]), (9, 2, [0, 1, 2])])
    st.readmit()
    a = st.chunk_inputs(2)
    assert a.ids == [7, 8] and (a.skip, a.replayed) == (2, 2) and st.replay_rows() == 1
    b = st.chunk_inputs(1)
    assert b.ids == [9] and (b.skip, b.replayed) == (1, 1) and st.replay_rows() == 0
    c = st.chunk_inputs(2)  # the replay is spent: the next chunk is the prompt's own
    assert st.chunks == [2] and c.skip == 2 and c.replayed == 0


def test_preemption_drops_the_replay_and_restarts_only_an_unfinished_prefill():
    st = FakeState(held=[(7, 0, [0])])
    st.readmit()
    st.preempted()
    assert st.replay_rows() == 0 and st.restarts == 1
    st.passes_done = 1
    st.preempted()
    assert st.restarts == 1


class FakeModel:
    """What `Engine.prompt_ids` reads of a model: its config and its embedding's device."""

    def __init__(self, **cfg):
        self.cfg = ModelConfig(**cfg)
        self.embed = torch.nn.Embedding(1, 1)


def test_prompt_must_fit_with_room_for_one_generated_token():
    prompt = "reverse: ab"
    ids = SequentialEngine(FakeModel(), TOK).prompt_ids(Request(0, prompt))
    n = len(ids)
    assert len(SequentialEngine(FakeModel(max_positions=n + 1), TOK).prompt_ids(Request(0, prompt))) == n
    with pytest.raises(UsageError, match="positions"):
        SequentialEngine(FakeModel(max_positions=n), TOK).prompt_ids(Request(0, prompt))
    with pytest.raises(UsageError, match="vocabulary"):  # the prompt's largest id (a tag) lies outside
        SequentialEngine(FakeModel(vocab_size=max(ids)), TOK).prompt_ids(Request(0, prompt))


def test_check_fits_bounds_are_inclusive_of_the_last_id_and_position():
    cfg = ModelConfig(vocab_size=100, max_positions=50)
    check_fits(cfg, 50, 99, "x")
    with pytest.raises(UsageError):
        check_fits(cfg, 51, 99, "x")
    with pytest.raises(UsageError):
        check_fits(cfg, 50, 100, "x")


def test_a_pass_of_two_requests_keeps_each_ones_rows_and_attention(tiny_model, tok):
    store = tiny_model.new_kv_store(page_size=4)
    a, b = store.allocate(3, owner="a"), store.allocate(2, owner="b")
    ia = causal_inputs(tok.encode("abc"), [0, 1, 2], a, "prefill")
    ib = causal_inputs(tok.encode("xy"), [0, 1], b, "prefill")
    ib.attention = True
    vis = pool_visibility([ia, ib], store.num_slots, torch.device("cpu")).numpy()
    assert vis.shape == (5, store.num_slots)
    assert [sorted(np.flatnonzero(r).tolist()) for r in vis] == [a[:1], a[:2], a, b[:1], b]
    eng = SequentialEngine(tiny_model, tok)
    logits, attn = eng.forward([ia, ib], store)
    assert logits.shape[0] == 5 and attn is not None and attn[b].sum() > 0
    assert eng.forward([ib, ia], store)[1] is not None


# ---------------------------------------------------------------------------- tiny model
def test_model_config_rules():
    assert ModelConfig.from_name("tiny-4l").d_ff == 352 and ModelConfig.from_name("tiny-2l").d_ff == 192
    with pytest.raises(ValueError):
        ModelConfig(d_model=64, n_heads=4, n_kv_heads=3)
    cfg = ModelConfig.from_name("tiny-2l")
    assert ModelConfig.from_dict({**cfg.to_dict(), "from_a_newer_version": 1}) == cfg


@pytest.fixture(scope="module")
def shipped():
    from runtime.checkpoint import load_model

    return load_model("sequential-tiny")[0]


def test_the_shipped_sequential_model_still_reverses_words(shipped, tok):
    """The trained weights are a reference for the network's arithmetic (RMSNorm, RoPE, the final
    norm): a change to them breaks greedy decoding at once."""
    from runtime.tasks import get_task

    eng = SequentialEngine(shipped, tok, GenerationConfig(max_tokens=40))
    for ex in get_task("reverse_words").examples("test", 2):
        assert eng.generate(Request(0, ex.prompt)).text == ex.answer


def test_tinylm_is_llama(shipped, tok):
    """TinyLM with the shipped weights computes what transformers' Llama computes with them (an
    independent implementation of RMSNorm, rotate-half RoPE, grouped-query attention and SwiGLU).
    A GELU in place of SiLU still decodes the words right, but moves the logits by about 5."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install 'solm[hf]')")
    c = shipped.cfg
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.d_model,
            intermediate_size=c.d_ff,
            num_hidden_layers=c.n_layers,
            num_attention_heads=c.n_heads,
            num_key_value_heads=c.n_kv_heads,
            rms_norm_eps=c.norm_eps,
            rope_theta=c.rope_theta,
            max_position_embeddings=c.max_positions,
            tie_word_embeddings=False,
        )
    ).eval()
    q_rows, kv_rows = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    sd = {"model.embed_tokens.weight": shipped.embed.weight, "model.norm.weight": shipped.norm.weight}
    sd["lm_head.weight"] = shipped.lm_head.weight
    for i, b in enumerate(shipped.layers):
        q, k, v = b.wqkv.weight.split([q_rows, kv_rows, kv_rows])
        gate, up = b.w_gate_up.weight.chunk(2)
        for name, w in {
            "self_attn.q_proj": q,
            "self_attn.k_proj": k,
            "self_attn.v_proj": v,
            "self_attn.o_proj": b.wo.weight,
            "mlp.gate_proj": gate,
            "mlp.up_proj": up,
            "mlp.down_proj": b.w_down.weight,
            "input_layernorm": b.input_layernorm.weight,
            "post_attention_layernorm": b.post_attention_layernorm.weight,
        }.items():
            sd[f"model.layers.{i}.{name}.weight"] = w
    hf.load_state_dict(sd, strict=True)
    ids = torch.tensor([tok.encode("reverse: abc,defg,hi")])
    T = ids.shape[1]
    with torch.no_grad():
        ours = shipped.forward_dense(ids, torch.arange(T)[None], causal_mask(T)[None])
        ref = hf(ids).logits
    torch.testing.assert_close(ours, ref, atol=1e-3, rtol=1e-3)


def test_grouped_attention_matches_the_pool_mask_and_scores_only_groups_that_ask(tiny_model, tok):
    m = tiny_model
    kv = m.new_kv_store(page_size=4)
    a, b = kv.allocate(3, owner="a"), kv.allocate(3, owner="b")
    ids, pos = torch.tensor(tok.encode("abcxyz")), torch.tensor([0, 1, 2, 0, 1, 2])
    rows = [a[: i + 1] for i in range(3)] + [b[: i + 1] for i in range(3)]
    vis = visibility_rows(rows, kv.num_slots, "cpu")
    plain, every = m(ids, pos, torch.tensor(a + b), vis, kv, return_attention=True)
    groups = [
        Group(s, s + 3, torch.tensor(c), vis[s : s + 3, c][None, None], attention=(s == 0)) for s, c in ((0, a), (3, b))
    ]
    logits, per_slot = m(ids, pos, torch.tensor(a + b), None, kv, return_attention=True, groups=groups)
    torch.testing.assert_close(logits, plain, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(per_slot[a], every[a], atol=1e-4, rtol=1e-4)
    assert per_slot[b].abs().sum().item() == 0  # the group that did not ask is not scored


# ---------------------------------------------------------------------------- PASTA-LANG
META = {"parts": ["ab\n", "cd\n"], "topics": ["a", "b"], "closing": "end"}


def test_eager_writes_the_closing_before_the_sync_the_others_after():
    assert pasta.annotate(META, TOK, "eager").endswith("end" + SYNC)
    for style in ("fine", "coarse"):
        assert pasta.annotate(META, TOK, style).endswith(SYNC + "end")


def test_a_prompt_without_parts_is_always_plain():
    assert pasta.sample_style(random.Random(0), {"parts": []}, {"fine": 1.0}) == "none"


def feed(p, st, ids, can_fork=True):
    return [p.feed(st, t, can_fork) for t in ids]


def test_pasta_parser_reads_depth_and_role():
    p = PastaParser(TOK)
    a, e, s = TOK.token_id(ASYNC), TOK.token_id(ASYNC_END), TOK.token_id(SYNC)
    # an unpromised <async> opens an inline chunk: its </async> closes it silently, a <sync/> or an
    # <eos> inside it is reported, and a promise inside it is inlined
    main = p.new_stream("main")
    assert [r.event for r in feed(p, main, [a, s, e, e])] == [
        "async_without_promise",
        "sync_inside_chunk",
        "",
        "close_without_async",
    ]
    assert feed(p, p.new_stream("thread"), [a])[0].event == "nested_async"
    th = p.new_stream("thread")
    assert feed(p, th, [a, TOK.eos_id])[-1].event == "unclosed_async"
    main = p.new_stream("main")
    p.begin_inline(main)
    assert feed(p, main, TOK.encode('<promise topic="a" tokens="10"/>'))[-1].action == Inline("nested_promise")
    assert feed(p, main, [e])[0].event == "" and feed(p, main, [s])[0].action == pasta.Sync()


def test_pasta_parser_limits_are_inclusive():
    p = PastaParser(TOK)
    opening = [TOK.token_id(PROMISE_OPEN)]
    r = feed(p, p.new_stream("main"), opening + [97] * 32 + [TOK.token_id(promise_close(100))])
    assert r[-1].action == Fork("a" * 32, 100) and not any(x.event for x in r)
    r = feed(p, p.new_stream("main"), opening + [97] * 33)
    assert r[-1].event == "unclosed_promise"
    # a promise interrupted by another tag keeps that tag's own report
    r = feed(p, p.new_stream("main"), [*opening, 97, TOK.token_id(ASYNC)])
    assert r[-1].event == "async_without_promise"


# ---------------------------------------------------------------------------- TIP registers
def test_registers_go_up_to_the_tokenizers_sixteen():
    assert tip.check_registers(16) == 16 and tip.RegisterParser(TOK, 16).registers == 16


def test_belady_reuses_a_dead_steps_register_lowest_index_first():
    """A chain (each step reads the one before): registers 0 and 1 alternate, never 2..4."""
    a = tip.annotate(["s"] * 5, [(), (0,), (1,), (2,), (3,)], registers=5)
    assert a.registers == (0, 1, 0, 1, 0) and a.killed == (-1, -1, 0, 1, 2) and a.forced_evictions == 0


def test_register_parser_marks_the_killed_step_dead():
    p = tip.RegisterParser(TOK, 2)
    r0 = TOK.token_id(tip.reg_tag(0))
    effects = [p.feed(t) for t in [r0, 97, r0, 98]]
    assert [e.stream for e in effects] == [1, 1, 2, 2] and effects[2].killed_stream == 1 and p.dead == {1}


def test_the_killing_tag_no_longer_sees_the_step_it_kills():
    r0, r1 = TOK.token_id(tip.reg_tag(0)), TOK.token_id(tip.reg_tag(1))
    ids = [TOK.bos_id, r0, 97, r1, 98, r0, 99]  # the second <reg_0> (index 5) kills step 1
    mask, streams = tip.tip_visibility(ids, 1, TOK, registers=2)
    assert streams == [-1, 1, 1, 2, 2, 3, 3]
    assert mask[5].tolist() == [True, False, False, True, True, True, False]
    assert mask[4, :3].all()


def test_split_steps_keeps_the_preamble_and_refuses_the_register_count_itself():
    steps, events = tip.split_steps("pre<reg_0>a<reg_4>b<reg_3>c", registers=4)
    assert steps == [(-1, "pre"), (0, "a<reg_4>b"), (3, "c")]
    assert [e["tag"] for e in events] == ["<reg_4>"]


# ---------------------------------------------------------------------------- plan language
def test_plan_units_follow_the_annotation_unit():
    meta = {"parts": ["abcdefg"], "topics": ["x"], "closing": ""}
    assert planned_diffusion.annotate(meta, TOK, unit=5)[0].spans[0].units == 2


def plan(ids, **kw):
    p = PlanParser(TOK, **kw)
    return p, [p.feed(t) for t in ids]


def test_plan_entry_numbers_topics_and_clamps():
    p, out = plan(TOK.encode(entry_text(" ab", 3) + "<promise>-<topic>x12</topic><sync/>"))
    assert [(e.topic, e.units, e.length) for e in p.pop_round()] == [("ab", 3, 30), ("x", 12, 64)]
    assert "number not separated" in out[-2].events
    p, out = plan(TOK.encode("<promise>-<topic>y 99999999</topic><sync/>"), length_scale=0.001)
    [e] = p.pop_round()
    assert (e.units, e.length) == (9999, 64)  # more digits than MAX_DIGITS: clamped however small the scale


def test_an_entry_open_at_sync_or_too_long_is_closed_and_reported():
    p, out = plan(TOK.encode("<promise>-<topic>ab 2<sync/>"))
    assert out[-1].end.kind == "sync" and out[-1].entry.topic == "ab" and "unclosed entry" in out[-1].events
    p, out = plan(TOK.encode("<promise>-<topic>" + "a" * 8), max_entry_tokens=8)
    assert out[-1].entry is not None and "entry_too_long" in out[-1].events
    assert out[-2].entry is None


def test_the_guard_reports_the_entry_a_reopening_closed():
    ids = [TOK.token_id("<promise>-<topic>"), *b"a 3", TOK.token_id("<promise>")]
    p, out = plan(ids, max_plan_tokens=len(ids))
    assert out[-1].end.kind == "guard" and out[-1].entry.topic == "a" and out[-1].entry.units == 3


def test_each_round_gets_the_whole_plan_budget():
    one = TOK.encode(entry_text("a", 1) + "<sync/>")
    p, out = plan(one * 3, max_plan_tokens=len(one))
    assert [o.end.kind for o in out if o.end] == ["sync"] * 3
