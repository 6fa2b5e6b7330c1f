"""Prefill/decode disaggregation (Splitwise, Patel et al. ISCA '24; DistServe, Zhong et al. OSDI '24).

What: P prefill replicas and D decode replicas (each TP x PP, the decode ones optionally on
another part), each with its own scheduler and KV pool, in one SimPy environment. A request is
routed to a prefill replica, runs its leading prefill passes there (the first token comes from
the last of them), then its KV, the live KV tokens after the prefill x the model's KV bytes per
token, is sent once to a decode replica chosen by the router, which admits it when the transfer
ends and runs the rest of its passes. The KV of one request is counted by *slots*, so a PASTA
fork's threads that share the prompt share its KV: it is sent once, not once per thread.

The transfer: each GPU of the prefill replica sends its shard (1/(tp x pp) of the bytes) to its
peer at once, a send/recv timed by `simulator.comm` over the slowest link such a pair crosses
(`transfer_link`: the NICs when the deployment does not fit one node or the sides are two parts,
PCIe between the bridged pairs of an NVLink-pairs node, else the node's fabric). A prefill replica's outbound link is a SimPy resource:
its transfers queue one after another (STYLE 11: links are objects with their own process).

Exactness: as for replicas (`replicas.ReplicaReplay`), a decode replica's stretch of passes is cut
at the pass in which a transferred request reaches it.
"""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import numpy as np
import simpy

from profiler.errors import UsageError
from simulator.cluster.parallel import ParallelCost, link_kwargs, memory_plan, slowest_link
from simulator.cluster.passes import leading_prefill_passes, slice_passes
from simulator.cluster.replicas import Cluster
from simulator.comm import collective_time_s
from simulator.hardware import HardwareSpec
from simulator.replay import ReplayConfig, resize, run_env
from simulator.workload import Workload


class DecodeCluster(Cluster):
    """Decode replicas: requests arrive when their KV transfer ends (no stream of their own)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.arrival_sorted_s = np.zeros(0)

    def pull_arrivals(self, upto: float) -> None:
        return None


def _transfer(env: simpy.Environment, link: simpy.Resource, decode: DecodeCluster, r: int, seconds: float, log: list):
    with link.request() as req:
        yield req
        start = env.now
        yield env.timeout(seconds)
    log.append((r, start, env.now))
    decode.arrive(r, env.now)


def simulate_disaggregated(workload, hardware, model, config, cluster, cost: ParallelCost, plan, params=None):
    """(ReplayResult, extra metrics, each replica's `pipeline.Pipeline` under the interleaved
    schedule or None) of a P:D deployment."""
    from simulator.simtrace import collect

    n_p, n_d = cluster.disaggregate
    par = cluster.parallelism
    w, n_pre, (pre_w, pre_shift), (dec_w, dec_shift) = _split_at_prefill(workload, config)
    decode_hw, decode_cost, decode_plan = _decode_side(cluster, hardware, model, config, cost, plan, params)
    env = simpy.Environment()
    pre_cfg = dataclasses.replace(config, num_requests=None, kv_capacity_bytes=plan.kv_capacity_bytes)
    dec_cfg = dataclasses.replace(pre_cfg, rate=None, concurrency=None, kv_capacity_bytes=decode_plan.kv_capacity_bytes)
    prefill, decode = _clusters(
        par.interleaved,
        model,
        cluster.router,
        env,
        _Side(pre_w, cost, hardware, pre_cfg, plan.kv_capacity_bytes, n_p),
        _Side(dec_w, decode_cost, decode_hw, dec_cfg, decode_plan.kv_capacity_bytes, n_d),
    )
    kv_bytes = w.live_kv_tokens[w.pass_starts + n_pre - 1].astype(float) * model.kv_bytes_per_token
    path = transfer_link(hardware, decode_hw, par.gpus, n_p, n_d)
    seconds = _transfer_seconds(kv_bytes / par.gpus, path, hardware, decode_hw)
    log: list[tuple[int, float, float]] = []
    no_decode = dec_w.n_passes == 0
    _connect(env, prefill, decode, n_p, seconds, log, no_decode)
    engines = prefill.start() + [env.process(d.engine()) for d in decode.replicas]
    run_env(env, env.all_of(engines))
    res = collect(_merge(w, prefill, decode, pre_shift, dec_shift, no_decode))
    pipelines = getattr(prefill, "pipelines", []) + getattr(decode, "pipelines", [])
    _label_replicas(res, prefill, decode, par)
    res.extra["kv_transfers"] = log
    extra = {
        "disaggregate": [n_p, n_d],
        "decode_hardware": decode_hw.name,
        **_transfer_figures(log, kv_bytes),
        "kv_transfer_across_nodes": path == "network",
        "kv_transfer_link": path,
        "decode_weight_bytes_per_gpu": decode_plan.weight_bytes_per_gpu,
        "decode_kv_pool_bytes_per_gpu": decode_plan.kv_pool_bytes_per_gpu,
        "decode_kv_capacity_tokens": decode_plan.kv_capacity_tokens,
    }
    if decode_hw.price_per_gpu_hour != hardware.price_per_gpu_hour:
        extra.update(_split_cost(res.metrics, n_p, n_d, par.gpus, hardware, decode_hw))
    return res, extra, pipelines or None


def _split_at_prefill(workload: Workload, config) -> tuple[Workload, np.ndarray, tuple, tuple]:
    """(the workload resized to the run, each request's leading prefill passes, (prefill workload,
    its index shift), (decode workload, its index shift)); UsageError if a request starts otherwise."""
    w = resize(workload, config)
    n_pre = leading_prefill_passes(w)
    if np.any(n_pre == 0):
        raise UsageError("--disaggregate: some requests do not start with a prefill pass")
    return w, n_pre, slice_passes(w, np.zeros_like(n_pre), n_pre), slice_passes(w, n_pre, w.n_passes)


def _decode_side(cluster, hardware, model, config, cost: ParallelCost, plan, params):
    """(part, cost model, memory plan) of the decode replicas: the prefill side's on the same part."""
    par = cluster.parallelism
    decode_hw = cluster.decode_hardware or hardware
    decode_cost = cost if decode_hw is hardware else ParallelCost(decode_hw, model, par, params)
    decode_plan = (
        plan
        if decode_hw is hardware
        else memory_plan(decode_hw, model, par, config.memory_utilization, config.kv_capacity_bytes)
    )
    return decode_hw, decode_cost, decode_plan


@dataclasses.dataclass
class _Side:
    """What one side (prefill or decode) of the deployment replays, on which part, with how many replicas."""

    workload: Workload
    cost: ParallelCost
    hardware: HardwareSpec
    config: ReplayConfig
    kv_capacity_bytes: int
    replicas: int


def _clusters(interleaved: bool, model, router, env: simpy.Environment, pre: _Side, dec: _Side):
    """The prefill and decode clusters in one environment (pipelined ones: batches in flight)."""
    prefill: Cluster
    decode: DecodeCluster
    if interleaved:  # each replica's batches in flight through its stages
        from simulator.cluster.pipeline import PipelinedCluster, PipelinedDecodeCluster

        prefill = PipelinedCluster(
            pre.workload, pre.cost, model, pre.hardware, pre.config, pre.kv_capacity_bytes, pre.replicas, router, env
        )
        decode = PipelinedDecodeCluster(
            dec.workload, dec.cost, model, dec.hardware, dec.config, dec.kv_capacity_bytes, dec.replicas, router, env
        )
    else:
        n_p, n_d = pre.replicas, dec.replicas
        prefill = Cluster(
            pre.workload,
            [pre.cost] * n_p,
            model,
            pre.hardware,
            pre.config,
            [pre.kv_capacity_bytes] * n_p,
            router,
            env=env,
        )
        decode = DecodeCluster(
            dec.workload,
            [dec.cost] * n_d,
            model,
            dec.hardware,
            dec.config,
            [dec.kv_capacity_bytes] * n_d,
            router,
            env=env,
        )
    return prefill, decode


def transfer_link(prefill_hw: HardwareSpec, decode_hw: HardwareSpec, gpus: int, n_p: int, n_d: int) -> str:
    """The slowest link a KV transfer crosses, every prefill GPU to its peer (the same rank) in any
    decode replica, with the GPUs numbered prefill replicas first, then decode ones, each replica's
    `gpus` in a row (as `parallel.boundary_links` numbers a replica's stages): "network" when the
    sides are two parts (no node holds two kinds of GPU), else `parallel.slowest_link` of those
    pairs (the NICs once the deployment spans nodes; PCIe on an NVLink-pairs part unless the one
    transfer is GPU 0 to GPU 1)."""
    if prefill_hw.name != decode_hw.name:
        return "network"
    pairs = [(i * gpus + r, (n_p + j) * gpus + r) for i in range(n_p) for j in range(n_d) for r in range(gpus)]
    return slowest_link(prefill_hw, pairs)


def _transfer_seconds(shard_bytes: np.ndarray, path: str, prefill_hw: HardwareSpec, decode_hw: HardwareSpec):
    """Seconds of each request's KV send/recv (`shard_bytes` per GPU) over `path`: across the
    NICs at the slower side's rate, over PCIe, or over the node's fabric for a pair of GPUs."""
    part = min((prefill_hw, decode_hw), key=lambda hw: hw.network_bytes_per_s) if path == "network" else prefill_hw
    return np.asarray(collective_time_s("send_recv", shard_bytes, 2, part, **link_kwargs(path)))


def _connect(
    env: simpy.Environment,
    prefill: Cluster,
    decode: DecodeCluster,
    n_p: int,
    seconds: np.ndarray,
    log: list[tuple[int, float, float]],
    no_decode: np.ndarray,
) -> None:
    """A request is done when its decode ends; a finished prefill sends its KV over its prefill
    replica's one link (shared by its engines) to the decode side, or, with nothing left to
    decode (or when it failed), finishes there."""
    for replica in prefill.replicas:
        replica.done = []  # a request is done when its decode ends
    for replica in decode.replicas:
        replica.done = prefill.done
    links = [simpy.Resource(env, capacity=1) for _ in range(n_p)]

    def prefilled(replica, r: int, t: float) -> None:
        if no_decode[r] or r in replica.error:  # the prefill's token was the whole answer, or it failed
            for d in decode.replicas:
                d.not_mine()
            decode.owner[r] = -1
            prefill.done and prefill.done[r].succeed()
            return
        link = links[int(prefill.replica_of(np.array([replica.index]))[0])]  # the replica's, shared by its engines
        env.process(_transfer(env, link, decode, r, float(seconds[r]), log))

    for replica in prefill.replicas:
        replica.on_finish = functools.partial(prefilled, replica)


def _label_replicas(res, prefill: Cluster, decode: DecodeCluster, par) -> None:
    """Each request's prefill and decode replica (and virtual engines under the interleaved schedule)."""
    res.requests["replica"] = prefill.replica_of(prefill.owner)
    res.requests["decode_replica"] = decode.replica_of(decode.owner)
    if par.interleaved:
        res.requests["virtual_engine"] = np.where(prefill.owner >= 0, prefill.owner % par.micro, -1)
        res.requests["decode_virtual_engine"] = np.where(decode.owner >= 0, decode.owner % par.micro, -1)


def _transfer_figures(log: list[tuple[int, float, float]], kv_bytes: np.ndarray) -> dict:
    seconds = np.array([end - start for _, start, end in log])
    return {
        "kv_transfers": len(log),
        "kv_transfer_bytes": float(kv_bytes[[r for r, _, _ in log]].sum()) if log else 0.0,
        "mean_kv_transfer_ms": float(seconds.mean() * 1e3) if log else None,
    }


def _split_cost(metrics: dict, n_p: int, n_d: int, gpus: int, prefill_hw, decode_hw) -> dict:
    hours = metrics["duration_s"] / 3600.0
    prices = (prefill_hw.price_per_gpu_hour, decode_hw.price_per_gpu_hour)
    if None in prices:
        return {"cost_usd": None, "cost_per_million_output_tokens": None, "price_per_gpu_hour": None}
    cost = hours * gpus * (n_p * prices[0] + n_d * prices[1])
    out = metrics["total_output_tokens"]
    return {
        "cost_usd": cost,
        "cost_per_million_output_tokens": cost / out * 1e6 if out else None,
        "price_per_gpu_hour": None,
    }


def _merge(w: Workload, prefill: Cluster, decode: DecodeCluster, pre_shift, dec_shift, no_decode) -> SimpleNamespace:
    """One replay-shaped view over the original workload (flat indices mapped back)."""
    from simulator.cluster.replicas import merge

    p = merge(prefill.replicas, prefill.owner)
    d = merge(decode.replicas, decode.owner)
    for side, view in ((prefill, p), (decode, d)):
        if hasattr(side, "replica_view"):  # replicas of engines in flight (pipeline.PipelinedCluster)
            side.replica_view(view)
    stretches = [dataclasses.replace(st, first_pass=st.first_pass + pre_shift[st.requests]) for st in p.stretches]
    stretches += [
        dataclasses.replace(
            st, first_pass=st.first_pass + dec_shift[st.requests], first_batch=st.first_batch + p.n_pass
        )
        for st in d.stretches
    ]
    events = sorted(
        [e for e in p.events if e[1] != "finish"] + [e for e in d.events if e[1] != "arrive"], key=lambda e: e[2]
    )
    finish = np.where(no_decode, p.finish_s, d.finish_s)
    pool = SimpleNamespace(
        bytes_per_block=p.pool.bytes_per_block,
        peak_blocks=max(p.pool.peak_blocks, d.pool.peak_blocks),
        capacity_blocks=p.pool.capacity_blocks,
    )
    return SimpleNamespace(
        w=w,
        stretches=stretches,
        arrival_s=p.arrival_s,
        start_s=p.start_s,
        finish_s=finish,
        preemptions=p.preemptions + d.preemptions,
        error={**p.error, **d.error},
        config=p.config,
        pool=pool,
        n_pass=p.n_pass + d.n_pass,
        events=events,
        device=SimpleNamespace(busy_s=p.device.busy_s + d.device.busy_s),
        capacity_bytes=p.capacity_bytes + d.capacity_bytes,
        hardware=p.hardware,
        model=p.model,
        cost=p.cost,
        blocks=-(-w.alloc_kv_tokens // p.config.block_size),
    )
