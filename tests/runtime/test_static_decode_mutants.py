"""Mutation-round tests of runtime/static_decode.py: behaviour test_static_decode.py did not pin
(each kills a hand-made mutant that survived it: a capacity of exactly the model's positions, the
prompt bounds, `max_tokens` tokens and no more, the trace mode compiled). Eager, tiny random Llama."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install 'solm[hf]')")

from runtime.hf_adapter import build_arch
from runtime.static_decode import StaticDecoder


@pytest.fixture(scope="module")
def model():
    return build_arch("tiny-llama", seed=2)


def test_a_capacity_of_every_position_is_allowed(model):
    assert StaticDecoder(model, model.cfg.max_positions).capacity == model.cfg.max_positions


def test_a_prompt_must_leave_room_and_not_be_empty(model):
    dec = StaticDecoder(model, capacity=4)
    for prompt in ([], [1, 2, 3, 4]):
        with pytest.raises(ValueError, match="does not fit"):
            dec.prefill(prompt)
    assert dec.prefill([1, 2, 3]).shape[0] == 1


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_returns_max_tokens_tokens(model, n):
    assert len(StaticDecoder(model, capacity=16).greedy([1, 2, 3], n)) == n


def test_trace_mode_wraps_the_step_and_eager_does_not(model):
    eager = StaticDecoder(model, 8)
    assert eager.step_fn == eager._step
    traced = StaticDecoder(model, 8, mode="trace")
    assert traced.step_fn != traced._step


def test_greedy_refuses_a_continuation_that_does_not_fit(model):
    """Was (a bug): `greedy(prompt, 0)` returned one token, and a continuation past the capacity
    wrote out of bounds (IndexError from index_copy_ on the CPU, a device assert on a GPU)."""
    dec = StaticDecoder(model, capacity=4)
    assert len(dec.greedy([1, 2], 3)) == 3  # the last decode writes slot 3, the last one
    for n in (0, 4):
        with pytest.raises(ValueError, match="do not fit the capacity 4"):
            dec.greedy([1, 2], n)
