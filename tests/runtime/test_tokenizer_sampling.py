from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from profiler.errors import UsageError
from runtime.sampling import Sampler, SamplingConfig
from runtime.tokenizer import BYTE_TOKENS, Tokenizer


def test_tags_are_single_tokens(tok):
    text = 'a<promise topic="x" tokens="10"/><async>b</async><sync/><reg_3>'
    ids = tok.encode(text)
    # a one-character topic in [a-z0-9] is fused with the promise's opening
    assert ids == [
        97,
        tok.token_id('<promise topic="x'),
        tok.token_id('" tokens="10"/>'),
        tok.token_id("<async>"),
        98,
        tok.token_id("</async>"),
        tok.token_id("<sync/>"),
        tok.token_id("<reg_3>"),
    ]
    assert tok.decode(ids) == text
    # any other topic is spelled after the plain opening
    other = '<promise topic="Xy" tokens="10"/>'
    assert tok.encode(other) == [tok.token_id('<promise topic="'), *b"Xy", tok.token_id('" tokens="10"/>')]
    assert tok.decode(tok.encode(other)) == other
    # a count that is not a multiple of 10 is spelled in bytes and still round-trips
    odd = '<promise topic="y" tokens="7"/>'
    assert tok.decode(tok.encode(odd)) == odd and len(tok.encode(odd)) > 3


@given(st.text(max_size=60))
def test_roundtrip_any_text(s):
    tok = Tokenizer()
    assert tok.decode(tok.encode(s)) == s


@given(st.lists(st.integers(min_value=0, max_value=BYTE_TOKENS + 200), max_size=40))
def test_decode_never_raises(ids):
    assert isinstance(Tokenizer().decode(ids), str)


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(4, 50)
    cfg = SamplingConfig(temperature=0.8, top_p=0.9, seed=3)
    a = [Sampler(cfg, request_id=5)(logits) for _ in range(1)]
    b = [Sampler(cfg, request_id=5)(logits) for _ in range(1)]
    assert torch.equal(a[0], b[0])
    s1, s2 = Sampler(cfg, 5), Sampler(cfg, 5)
    assert [s1(logits).tolist() for _ in range(5)] == [s2(logits).tolist() for _ in range(5)]
    assert torch.equal(Sampler(SamplingConfig())(logits), logits.argmax(-1))


def test_top_p_keeps_only_the_nucleus():
    logits = torch.tensor([[10.0, 9.0, -10.0, -10.0]])
    s = Sampler(SamplingConfig(temperature=1.0, top_p=0.5, seed=0))
    assert {int(s(logits)[0]) for _ in range(50)} == {0}


@pytest.mark.parametrize("top_p", [1e-300, 1e-46])
def test_top_p_below_float32s_least_keeps_the_top_token(top_p):
    """Was: `capture --temperature 1 --top-p 1e-300`: internal error (a bug), RuntimeError from
    torch.multinomial (1e-300 is 0 in float32, so no token was kept)."""
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    s = Sampler(SamplingConfig(temperature=1.0, top_p=top_p, seed=0))
    assert {int(s(logits)[0]) for _ in range(20)} == {1}


@pytest.mark.parametrize("temperature", [1e-320, 1e-37])
def test_a_tiny_temperature_samples_the_top_token(temperature):
    """Was: `capture --temperature 1e-320` exit 1, RuntimeError from torch.multinomial: 1e-320 is 0
    in float32 (0 / 0 = NaN), and at 1e-37 the logit 100 / T overflows (inf - inf = NaN)."""
    logits = torch.tensor([[1.0, 100.0, 2.0]])
    s = Sampler(SamplingConfig(temperature=temperature, seed=0))
    assert {int(s(logits)[0]) for _ in range(20)} == {1}


def drawn(cfg: SamplingConfig, logits: list[float], n: int = 200) -> set[int]:
    s = Sampler(cfg)
    return {int(s(torch.tensor([logits]))[0]) for _ in range(n)}


def test_top_p_is_the_smallest_set_reaching_p():
    """The nucleus: the most probable tokens until their mass reaches top_p, the token that
    crosses top_p included, none after a set that reaches it exactly."""
    logp = torch.tensor([0.6, 0.3, 0.1]).log().tolist()
    assert drawn(SamplingConfig(temperature=1.0, top_p=0.7), logp) == {0, 1}
    logp = torch.tensor([0.5, 0.25, 0.25]).log().tolist()
    assert drawn(SamplingConfig(temperature=1.0, top_p=0.5), logp) == {0}


def test_temperature_sharpens_and_flattens():
    assert drawn(SamplingConfig(temperature=0.05), [2.0, 1.0]) == {0}
    assert drawn(SamplingConfig(temperature=20.0), [2.0, 1.0]) == {0, 1}


def test_seed_and_request_id_give_distinct_streams():
    logits = torch.zeros(1, 1000)
    streams = [
        [int(s(logits)[0]) for _ in range(10)]
        for s in (
            Sampler(SamplingConfig(1.0, 1.0, 1), 0),
            Sampler(SamplingConfig(1.0, 1.0, 0), 1),
            Sampler(SamplingConfig(1.0, 1.0, 0), 0),
        )
    ]
    assert len({tuple(s) for s in streams}) == 3


@pytest.mark.parametrize("kw", [{"top_p": 0.0}, {"temperature": math.inf}, {"temperature": math.nan}])
def test_bad_sampling_settings_are_usage_errors(kw):
    with pytest.raises(UsageError):
        SamplingConfig(**kw)
