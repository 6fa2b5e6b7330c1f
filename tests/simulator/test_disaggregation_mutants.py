"""simulator/cluster/disaggregation.py: what the cluster tests left unpinned (a mutation round:
34 mutants, 27 killed by tests/simulator/test_cluster*.py, 3 equivalent, 4 killed here).

Equivalent: the decode side's config carrying the prefill pool's capacity (each replica's config
takes its own pool from the cluster); a transfer on one part timed on the decode part (the two
are one part there: a different one sends over the network); marking a request with nothing to
decode as owned by no decode replica (owners start at -1)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.cluster.disaggregation import _split_cost, transfer_link
from simulator.cluster.parallel import Parallelism
from simulator.cluster.run import ClusterConfig, simulate
from simulator.hardware import get_hardware
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig
from simulator.workload import load_workload
from tests.simulator.toy_traces import MODEL_META, one_second_cost, seq, toy_part, write_toy_trace

MODEL = ModelSpec.from_trace_meta(MODEL_META)  # 2 layers


def _disagg(tmp_path, requests, pd, **cluster):
    hw = toy_part(interconnect_bytes_per_s=1e9)
    prompts = [r[0].q for r in requests]
    w = load_workload(write_toy_trace(tmp_path / "t", requests, prompts, arrivals=[0.0] * len(requests)))
    config = ClusterConfig(disaggregate=pd, **cluster)
    return simulate(w, hw, MODEL, ReplayConfig(max_seqs=4), config, params=one_second_cost(hw, MODEL).params)


def test_every_rank_of_a_replica_decides_the_link():
    """Three GPUs a replica (PP 3), 2:1 on 8-GPU H100 nodes: prefill GPUs 0-5, decode GPUs 6-8.
    Rank 0's transfers (0 -> 6, 3 -> 6) stay in node 0; rank 2's reach GPU 8, in node 1: the
    deployment's KV crosses the network (not the NVLink of rank 0's pairs)."""
    h100 = get_hardware("h100-sxm")
    assert h100.gpus_per_node == 8
    assert transfer_link(h100, h100, 3, 2, 1) == "network"
    assert transfer_link(h100, h100, 2, 2, 1) != "network"  # GPUs 0-5: one node


def test_the_mean_transfer_is_the_mean(tmp_path):
    """Two KVs of 4 and 40 tokens: the mean transfer time is the mean of the two, not the longer."""
    res = _disagg(tmp_path, [seq(4, 2), seq(40, 2)], (1, 1))
    seconds = [end - start for _, start, end in res.extra["kv_transfers"]]
    assert len(seconds) == 2 and seconds[0] != seconds[1]
    assert res.metrics["mean_kv_transfer_ms"] == pytest.approx(1e3 * np.mean(seconds))


def test_decode_virtual_engines_are_numbered_within_their_replica(tmp_path):
    """1:2 with PP 2 interleaved: four requests over two decode replicas of two engines each; each
    request's decode engine is 0 or 1 of its replica (not the engine's index across replicas)."""
    res = _disagg(tmp_path, [seq(4, 3)] * 4, (1, 2), parallelism=Parallelism(pp=2, schedule="interleave"))
    assert sorted(set(res.requests["decode_replica"])) == [0, 1]
    assert set(res.requests["decode_virtual_engine"]) <= {0, 1}


def test_no_output_tokens_no_price_per_million():
    """Priced sides but no output token (every request failed): the cost per million output tokens
    is unknown (None), not 0 dollars."""
    h100 = dataclasses.replace(get_hardware("h100-sxm"), price_per_gpu_hour=3.0)
    a100 = dataclasses.replace(get_hardware("a100-80g"), price_per_gpu_hour=2.0)
    figures = _split_cost({"duration_s": 3600.0, "total_output_tokens": 0}, 1, 1, 1, h100, a100)
    assert figures["cost_per_million_output_tokens"] is None and figures["cost_usd"] == pytest.approx(5.0)
