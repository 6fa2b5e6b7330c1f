"""Shared fixtures: tiny random models on CPU, a small captured trace."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# Property tests judge results, never speed: no per-example deadline and no "too slow" health
# check, which a loaded 2-core machine trips at random (a mutation round saw one such flaky failure
# while three rounds shared the cores). A test's own @settings still sets its example count.
settings.register_profile("solm", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("solm")


@pytest.fixture(scope="session")
def tok():
    from runtime.tokenizer import Tokenizer

    return Tokenizer()


@pytest.fixture(scope="session")
def tiny_model():
    from runtime.model import ModelConfig, TinyLM

    return TinyLM(ModelConfig.from_name("tiny-2l"), seed=1).eval()


@pytest.fixture(scope="session")
def small_trace(tmp_path_factory):
    """A real capture of 3 requests with an untrained preset (fast, exercises every column)."""
    from runtime.capture import CaptureConfig, capture

    out = tmp_path_factory.mktemp("traces") / "seq"
    capture(CaptureConfig(system="sequential", model="tiny-2l", n=3, max_tokens=12, page_size=4), out, progress=False)
    return out
