"""Mutation-round tests of runtime/sampling.py: behaviour test_tokenizer_sampling.py did not pin
(each kills a hand-made mutant that survived it: the settings' other bounds, each row shifted by its
own max, float32 arithmetic on half-precision logits, one token per row)."""

from __future__ import annotations

import pytest
import torch

from profiler.errors import UsageError
from runtime.sampling import Sampler, SamplingConfig


@pytest.mark.parametrize("kw", [{"temperature": -0.5}, {"top_p": 1.5}])
def test_negative_temperature_and_top_p_above_one_are_usage_errors(kw):
    with pytest.raises(UsageError):
        SamplingConfig(**kw)


def test_a_tiny_temperature_takes_each_rows_top_token():
    """Each row is shifted by its own max: a row whose logits all lie below another row's max is
    not sent to -inf everywhere (NaN probabilities) at a temperature that underflows."""
    logits = torch.tensor([[100.0, 1.0, 2.0], [1.0, 3.0, 2.0]])
    s = Sampler(SamplingConfig(temperature=1e-37, seed=0))
    for _ in range(5):
        assert s(logits).tolist() == [0, 1]


def test_half_precision_logits_sample_as_their_float32_values():
    """The nucleus is computed in float32: bf16 logits (a bf16 model's) keep the same tokens as the
    same values in float32. Here token 0 has probability 0.6225 in float32 (its mass before token 1
    is 0.625 in bf16 arithmetic), so top_p 0.6235 keeps both tokens."""
    logits = torch.tensor([[0.0, -0.5]], dtype=torch.bfloat16)
    cfg = SamplingConfig(temperature=1.0, top_p=0.6235, seed=0)
    s = Sampler(cfg)
    drawn = {int(s(logits)[0]) for _ in range(100)}
    assert drawn == {0, 1}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_token_per_row(temperature):
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    out = Sampler(SamplingConfig(temperature=temperature, top_p=0.9))(logits)
    assert out.shape == (3,) and out.dtype == torch.int64
