"""Counts (GPUs, replicas, threads, layers, seeds) are whole numbers: `profiler.errors.is_count`, the
one check every constructor that takes one uses. A bool is an int subclass, so `True` used to pass
`isinstance(v, int)` as a count of 1 (`CostModel(tensor_parallel=True)`, `ReplayConfig(max_seqs=True)`)
and `False` as 0 where 0 means "the default"."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from profiler.errors import is_count
from runtime.engines.pasta import PastaEngine
from runtime.engines.sot import SotEngine
from simulator.cluster.parallel import Parallelism
from simulator.cluster.run import ClusterConfig
from simulator.comm import collective_time_s
from simulator.cost import CostModel
from simulator.hardware import get_hardware
from simulator.models import get_model
from simulator.replay import ReplayConfig


@pytest.mark.parametrize(
    ("value", "low", "ok"),
    [
        (1, 1, True),
        (np.int64(3), 1, True),
        (np.int32(0), 0, True),
        (0, 1, False),
        (-1, 0, False),
        (True, 1, False),
        (False, 0, False),
        (np.bool_(True), 1, False),  # not an Integral: refused too
        (2.0, 1, False),
        ("2", 1, False),
        (None, 1, False),
    ],
)
def test_is_count(value, low, ok):
    assert is_count(value, low) is ok


def _cost_model(value):
    CostModel(get_hardware("a100-80g"), get_model("llama-3-8b"), tensor_parallel=value)


def _model_layers(value):
    dataclasses.replace(get_model("llama-3-8b"), n_layers=value)


def _hardware_sms(value):
    dataclasses.replace(get_hardware("h100-sxm"), num_sms=value)


def _gpus_per_node(value):
    dataclasses.replace(get_hardware("h100-sxm"), gpus_per_node=value)


CONSTRUCTORS = {
    "CostModel tensor_parallel": _cost_model,
    "ReplayConfig max_seqs": lambda v: ReplayConfig(max_seqs=v),
    "ReplayConfig block_size": lambda v: ReplayConfig(block_size=v),
    "ReplayConfig concurrency": lambda v: ReplayConfig(concurrency=v),
    "Parallelism tp": lambda v: Parallelism(tp=v),
    "Parallelism micro_batches": lambda v: Parallelism(micro_batches=v),
    "ClusterConfig replicas": lambda v: ClusterConfig(replicas=v),
    "ClusterConfig disaggregate": lambda v: ClusterConfig(disaggregate=(v, 1)),
    "collective_time_s workers": lambda v: collective_time_s("all_reduce", 1 << 20, v, get_hardware("h100-sxm")),
    "ModelSpec n_layers": _model_layers,
    "HardwareSpec num_sms": _hardware_sms,
    "HardwareSpec gpus_per_node": _gpus_per_node,
}


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
def test_true_is_no_count(name):
    """Each takes 2 and refuses True (which used to be read as 1) with a ValueError naming the value."""
    CONSTRUCTORS[name](2)
    with pytest.raises(ValueError, match="True"):
        CONSTRUCTORS[name](True)


def test_seed_false_is_no_seed():
    ReplayConfig(seed=0)
    with pytest.raises(ValueError, match="seed"):
        ReplayConfig(seed=False)


@pytest.mark.parametrize("knob", ["max_threads", "max_chunk_tokens"])
def test_pasta_knobs_refuse_true(tiny_model, tok, knob):
    with pytest.raises(ValueError, match=knob):
        PastaEngine(tiny_model, tok, **{knob: True})


def test_pasta_max_total_tokens_refuses_false(tiny_model, tok):
    """False is no token budget (0, "twice max_tokens", is spelt 0)."""
    assert PastaEngine(tiny_model, tok, max_total_tokens=0).max_total_tokens > 0
    with pytest.raises(ValueError, match="max_total_tokens"):
        PastaEngine(tiny_model, tok, max_total_tokens=False)


@pytest.mark.parametrize("knob", ["skeleton_max_tokens", "point_max_tokens", "max_points"])
def test_sot_knobs_refuse_true(tiny_model, tok, knob):
    with pytest.raises(ValueError, match=knob):
        SotEngine(tiny_model, tok, **{knob: True})
