"""runtime/structure_replay.py: tests that kill the mutants a mutation round found the rest of the
suite let through (each test names the mutant it kills: the code as it would be, mutated)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from torch import nn

from profiler.errors import UsageError
from runtime.engines import GenerationConfig, get_engine
from runtime.structure_replay import ForcedLogits, Replayer, Script, _forced_pasta, check_token_ids, scripts_of

VOCAB = 6


class _Inner(nn.Module):
    """A model behind the one primitive: `rows` rows of logits rising along the vocabulary (its own
    choice: the last id), with `attn` beside them where given."""

    cfg = "the inner model's cfg"
    embed = "the inner model's embedding"
    kv_bytes_per_token = 12

    def __init__(self, rows: int = 3, attn=None) -> None:
        super().__init__()
        self.rows, self.attn = rows, attn

    def forward(self, *args, **kw):
        logits = torch.arange(self.rows * VOCAB, dtype=torch.float32).reshape(self.rows, VOCAB)
        return (logits, self.attn) if self.attn is not None else logits

    def new_kv_store(self, *a, **kw):
        return ("store", a, kw)

    def num_parameters(self) -> int:
        return 42


def test_scripts_are_in_request_order_and_each_in_token_order_whatever_the_tables_order():
    """Tables read back in any row order: one Script per request by request id, its output ids and
    each stream's ids by token index, its answer the `reference` ("" where missing) (kills S01,
    S02, S04: a table's row order taken as is; S06: the prompt taken for the answer)."""
    requests = pd.DataFrame({"request_id": [1, 0], "prompt": ["p1", "p0"], "reference": [None, "r0"]})
    tokens = pd.DataFrame(
        {
            "request_id": [1, 0, 0, 1, 0, 0],
            "token_index": [1, 2, 0, 0, 3, 1],
            "stream": [0, 1, 0, 0, 1, 0],
            "token_id": [11, 22, 20, 10, 23, 21],
        }
    )
    s0, s1 = scripts_of(requests, tokens)
    assert (s0.request_id, s0.prompt, s0.answer, s0.output_ids) == (0, "p0", "r0", [20, 21, 22, 23])
    assert s0.streams == {0: [20, 21], 1: [22, 23]}
    assert (s1.request_id, s1.prompt, s1.answer, s1.output_ids, s1.streams) == (1, "p1", "", [10, 11], {0: [10, 11]})


def _script(rid, ids):
    return Script(rid, "p", "", ids, {0: ids})


def test_token_ids_are_checked_against_the_models_width_in_every_script():
    """Ids 0..width-1 pass; width, -1 (a simulated trace's mark) and a bad id in a later script are
    each one UsageError naming it and the model's range (kills S07: the width itself let through;
    S08: a negative id let through; S09: the range said as 0..width; S10: the first script only)."""
    check_token_ids([_script(0, [0, 5]), _script(1, [3])], 6, "t")
    for ids, bad in (([1, 6], 6), ([-1, 2], -1)):
        with pytest.raises(
            UsageError, match=rf"--structure-from t: request 1 has token id {bad}, outside this model's 0\.\.5 "
        ):
            check_token_ids([_script(0, [0, 1]), _script(1, ids)], 6, "t")


def test_forced_logits_put_every_row_on_the_next_scripted_token_then_the_fallback():
    """Each pass: every row's mass on the script's next token (the rest at -1e9), one token per
    pass, then the fallback once the script is spent (kills S11: one past the script's end read;
    S12: the script never advancing; S13: the other ids left at 0; S14: the last row only)."""
    forced = ForcedLogits(_Inner(rows=3), fallback=5, script=[2, 0])
    for want in (2, 0, 5, 5):
        out = forced()
        assert out.shape == (3, VOCAB) and out.argmax(-1).tolist() == [want] * 3
        assert (out[:, want] == 0).all() and (out.sum(-1) == -1e9 * (VOCAB - 1)).all()


def test_forced_logits_keep_the_models_own_last_row_only_when_asked_and_pass_attention_on():
    """`keep_logits`: the model's own last-row logits of each pass (kills S15: the first row;
    S16: kept without being asked); an attention output comes back beside the forced logits
    (kills S17: dropped); the script is the wrapper's own copy (kills S18: the caller's list)."""
    attn = torch.ones(2)
    script = [1]
    kept = ForcedLogits(_Inner(rows=3, attn=attn), fallback=0, script=script, keep_logits=True)
    script.append(4)
    logits, got = kept()
    assert got is attn and logits.argmax(-1).tolist() == [1, 1, 1]
    assert len(kept.own_logits) == 1 and kept.own_logits[0].tolist() == [12.0, 13, 14, 15, 16, 17]
    assert kept()[0].argmax(-1).tolist() == [0, 0, 0]  # the script as given: [1], then the fallback
    plain = ForcedLogits(_Inner(), fallback=0, script=[1])
    plain()
    assert plain.own_logits == []


def test_forced_logits_stand_in_for_the_model_they_wrap():
    """The wrapper answers for its model: cfg, embedding, KV bytes, KV store, parameter count
    (kills S29, S30: a count of its own)."""
    f = ForcedLogits(_Inner(), fallback=0)
    assert (f.cfg, f.embed, f.kv_bytes_per_token, f.num_parameters()) == (_Inner.cfg, _Inner.embed, 12, 42)
    assert f.new_kv_store(3, page_size=4) == ("store", (3,), {"page_size": 4})


def test_a_replayer_refuses_a_system_it_cannot_replay(tiny_model, tok):
    """kills S20: the check skipped, an engine built that no script drives."""
    with pytest.raises(
        ValueError, match="structure replay supports sequential, tip, pasta, planned_diffusion, not 'skeleton'"
    ):
        Replayer("skeleton", tiny_model, tok, GenerationConfig())


def test_a_replayed_token_model_falls_back_to_eos_and_starts_each_script_afresh(tiny_model, tok):
    """Past its script a sequential or TIP replay is forced to <eos>, and each request starts at
    its script's first token (kills S19: another fallback; S21: the index left where the last
    request ended)."""
    rp = Replayer("sequential", tiny_model, tok, GenerationConfig(max_tokens=8))
    assert rp.forced.fallback == tok.eos_id
    rp.forced.i = 7  # where a request before ended
    rp.run(SimpleNamespace(), _script(3, [5, 6]))
    assert (rp.forced.script, rp.forced.i) == ([5, 6], 0)


def test_a_planned_diffusion_replay_forces_the_ar_streams_plan_and_refuses_one_that_does_not_round_trip(
    tiny_model, tok
):
    """The plan is stream 0's text, and it must encode back to the same ids (kills S23: another
    stream's; S24: the round trip unchecked, '<eos>' spelt in bytes forced as one special token)."""
    rp = Replayer("planned_diffusion", tiny_model, tok, GenerationConfig(max_tokens=8))
    plan = tok.encode("a b")
    rp.run(SimpleNamespace(), Script(0, "p", "", plan + [99], {0: plan, 1: [99]}))
    assert rp.engine.forced_plan == "a b"
    with pytest.raises(ValueError, match="request 4: the plan does not round-trip through the tokenizer"):
        rp.run(SimpleNamespace(), Script(4, "p", "", [], {0: list(b"<eos>")}))


def test_a_replayed_pasta_stream_takes_its_next_scripted_token_then_its_end(tok):
    """Per stream: its reference token at the stream's next index; past its script <eos> for the
    main stream and the async end for a thread (kills S25, S26: the ends swapped or both <eos>;
    S27: a stream's last token cut; S28: the index one ahead; S22: no script given)."""
    from runtime.lang.pasta import ASYNC_END

    forced = _forced_pasta(get_engine("pasta"))
    me = SimpleNamespace(script={0: [10, 11], 2: [30]}, tok=tok)
    lay = SimpleNamespace(
        streams={0: SimpleNamespace(outs=[]), 2: SimpleNamespace(outs=[]), 5: SimpleNamespace(outs=[])}
    )
    assert forced.choose(me, lay, [0, 2], None, None) == [10, 30]
    lay.streams[0].outs, lay.streams[2].outs = [10], [30]
    assert forced.choose(me, lay, [0, 2, 5], None, None) == [11, tok.token_id(ASYNC_END), tok.token_id(ASYNC_END)]
    lay.streams[0].outs = [10, 11]
    assert forced.choose(me, lay, [0], None, None) == [tok.eos_id]
    rp = Replayer.__new__(Replayer)
    rp.system, rp.engine = "pasta", SimpleNamespace(script={}, run=lambda request: request)
    rp.run("req", Script(0, "p", "", [], {0: [7]}))
    assert rp.engine.script == {0: [7]}
