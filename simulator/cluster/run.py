"""A deployment's what-if: TP x PP replicas behind a router, or prefill/decode disaggregation.

    from simulator.cluster.run import ClusterConfig, simulate
    res = simulate(workload, get_hardware("h100-sxm"), get_model("llama-3-70b"), ReplayConfig(rate=4),
                   ClusterConfig(Parallelism(tp=4), replicas=2, router="least_outstanding"))
    res.metrics["gpus"], res.metrics["weight_bytes_per_gpu"], res.metrics["comm_share_percent"]

One replica with TP = PP = 1 is exactly `simulator.replay.replay` (same pool, same costs); the
rest adds the replica's parallel cost (`parallel.ParallelCost`), its per-GPU memory
(`parallel.memory_plan`), the router (`replicas.Cluster`) or the disaggregated pair
(`disaggregation`), and the figures a deployment is judged by: GPU count, per-GPU memory, the
share of a pass spent communicating, goodput under SLOs and cost (`slo`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from profiler.errors import UsageError, is_count
from simulator.cluster.parallel import (
    MemoryPlan,
    ParallelCost,
    Parallelism,
    memory_plan,
)
from simulator.cluster.slo import cost_figures
from simulator.hardware import HardwareSpec
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, check_runnable, replay, resize
from simulator.slo import check_slo, goodput
from simulator.workload import Workload

# More replicas than any deployment studied here (4096 replicas of a 16-request trace simulate in
# under 3 s); 10^8 hung building replicas and a count beyond int64 was an OverflowError.
MAX_REPLICAS = 4096


@dataclass(frozen=True)
class ClusterConfig:
    parallelism: Parallelism = dataclasses.field(default_factory=Parallelism)
    replicas: int = 1
    router: str = "round_robin"
    disaggregate: tuple[int, int] | None = None  # (prefill replicas, decode replicas)
    decode_hardware: HardwareSpec | None = None  # disaggregated decode replicas on another part
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        from simulator.cluster.routers import get_router

        if not is_count(self.replicas):
            raise UsageError(f"--replicas must be a positive integer, got {self.replicas!r}")
        get_router(self.router)
        if self.disaggregate is not None and (len(self.disaggregate) != 2 or not all(map(is_count, self.disaggregate))):
            raise UsageError(f"--disaggregate needs P:D with P, D >= 1, got {self.disaggregate!r}")
        if self.disaggregate is not None and self.replicas != 1:
            raise UsageError("--disaggregate P:D sets the replica counts; leave out --replicas")
        count = sum(self.disaggregate) if self.disaggregate else self.replicas
        if count > MAX_REPLICAS:
            raise UsageError(f"{count} replicas: at most {MAX_REPLICAS} (--replicas, or P + D of --disaggregate)")
        check_slo(self.slo_ttft_ms, self.slo_tpot_ms)

    @property
    def gpus(self) -> int:
        k = sum(self.disaggregate) if self.disaggregate else self.replicas
        return k * self.parallelism.gpus


def simulate(
    workload: Workload,
    hardware: HardwareSpec,
    model: ModelSpec,
    config: ReplayConfig,
    cluster: ClusterConfig | None = None,
    params=None,
):
    """Replay `workload` on the deployment; a `simulator.simtrace.ReplayResult` with cluster metrics."""
    cluster = cluster or ClusterConfig()
    par = cluster.parallelism
    cost = ParallelCost(hardware, model, par, params)
    plan = memory_plan(hardware, model, par, config.memory_utilization, config.kv_capacity_bytes)
    res, extra, pipeline = _replay_deployment(workload, hardware, model, config, cluster, cost, plan, params)
    check_runnable(res, hardware)  # every deployment: nothing ran is one error line, as on one replica
    res.metrics.update(deployment_metrics(res, cost, plan, cluster, hardware, pipeline))
    res.metrics.update(extra)
    res.extra["cluster"] = {
        "tp": par.tp,
        "pp": par.pp,
        "micro_batches": par.micro,
        "pp_schedule": par.schedule,
        "replicas": cluster.replicas,
        "router": cluster.router,
        "disaggregate": cluster.disaggregate,
        "memory_per_gpu": plan.describe(),
    }
    return res


def _replay_deployment(
    workload: Workload,
    hardware: HardwareSpec,
    model: ModelSpec,
    config: ReplayConfig,
    cluster: ClusterConfig,
    cost: ParallelCost,
    plan: MemoryPlan,
    params=None,
) -> tuple:
    """(result, extra metrics, pipelines or None) of the deployment's engine: the disaggregated
    pair, interleaved pipelines, or replicas (one: the plain replay) with the per-GPU KV pool."""
    par = cluster.parallelism
    if cluster.disaggregate is not None:
        from simulator.cluster.disaggregation import simulate_disaggregated

        return simulate_disaggregated(workload, hardware, model, config, cluster, cost, plan, params)
    cfg = dataclasses.replace(config, kv_capacity_bytes=plan.kv_capacity_bytes)
    if par.interleaved:
        from simulator.cluster.pipeline import replay_interleaved

        res, pipeline = replay_interleaved(workload, hardware, model, cfg, cost, cluster.replicas, cluster.router)
        return res, {}, pipeline
    pass_cost = cost.full if par.gpus == 1 else cost  # one GPU: the plain CostModel, one call less a pass
    if cluster.replicas == 1:
        res = replay(workload, hardware, model, cfg, cost=pass_cost)
        res.requests["replica"] = 0
    else:
        res = _replay_replicas(workload, hardware, model, config, cfg, cluster, pass_cost, plan)
    return res, {}, None


def _replay_replicas(
    workload: Workload,
    hardware: HardwareSpec,
    model: ModelSpec,
    config: ReplayConfig,
    cfg: ReplayConfig,
    cluster: ClusterConfig,
    pass_cost,
    plan: MemoryPlan,
):
    """`cluster.replicas` replicas behind the router, merged into one result; each request's
    replica and the requests per replica recorded. `config`: as given (the workload resized to its
    count), `cfg`: with the replica's KV pool."""
    from simulator.cluster.replicas import Cluster, merge
    from simulator.simtrace import collect

    k = cluster.replicas
    sim = Cluster(
        resize(workload, config),
        [pass_cost] * k,
        model,
        hardware,
        cfg,
        [plan.kv_capacity_bytes] * k,
        cluster.router,
    ).run()
    res = collect(merge(sim.replicas, sim.owner))
    res.requests["replica"] = sim.owner
    res.metrics["requests_per_replica"] = np.bincount(sim.owner[sim.owner >= 0], minlength=k).tolist()
    return res


def pass_totals(res) -> dict[str, np.ndarray]:
    """Per executed pass (batch): summed query tokens, KV read, streams and logit rows."""
    rows, w = res.rows, res.workload
    out = {
        name: rows.pass_totals(getattr(w, name)[rows.flat])
        for name in ("query_tokens", "kv_tokens_read", "query_groups", "logit_tokens")
    }
    keep = out["query_tokens"] > 0
    return {name: values[keep] for name, values in out.items()}


def comm_shares(res, cost: ParallelCost, pipeline=None) -> dict:
    """Share of the executed passes' time in all-reduces, stage send/recv and pipeline bubbles.

    With the interleaved schedule's `pipeline` (each replica's `simulator.cluster.pipeline.Pipeline`):
    each pass is one micro-batch (its comm over its time alone in the pipeline), the bubble the
    pipelines' measured one."""
    from simulator.cluster.pipeline import bubble_percent

    totals = pass_totals(res)
    if not len(totals["query_tokens"]) or cost.par.gpus == 1:
        return {
            "comm_share_percent": 0.0,
            "all_reduce_share_percent": 0.0,
            "send_recv_share_percent": 0.0,
            "pipeline_bubble_percent": 0.0,
        }
    parts = cost.breakdown(
        totals["query_tokens"],
        totals["kv_tokens_read"],
        np.maximum(totals["query_groups"], 1),
        np.maximum(totals["logit_tokens"], 1),
        micro=None if pipeline is None else 1,
    )
    whole = float(np.sum(parts["total_s"]))
    share = {name: 100 * float(np.sum(parts[f"{name}_s"])) / whole for name in ("all_reduce", "send_recv", "bubble")}
    return {
        "comm_share_percent": share["all_reduce"] + share["send_recv"],
        "all_reduce_share_percent": share["all_reduce"],
        "send_recv_share_percent": share["send_recv"],
        "pipeline_bubble_percent": share["bubble"] if pipeline is None else bubble_percent(pipeline),
    }


def deployment_metrics(
    res, cost: ParallelCost, plan: MemoryPlan, cluster: ClusterConfig, hardware: HardwareSpec, pipeline=None
) -> dict:
    m = res.metrics
    par = cluster.parallelism
    out = {
        "tp": par.tp,
        "pp": par.pp,
        "pp_schedule": par.schedule if par.pp > 1 else None,
        "micro_batches": par.micro if par.pp > 1 else None,  # drain: a pass's; interleave: batches in flight
        "replicas": cluster.replicas if cluster.disaggregate is None else None,
        "router": cluster.router if cluster.disaggregate is None and cluster.replicas > 1 else None,
        "weight_bytes_per_gpu": plan.weight_bytes_per_gpu,
        "kv_pool_bytes_per_gpu": plan.kv_pool_bytes_per_gpu,
        "usable_bytes_per_gpu": plan.usable_bytes_per_gpu,
        "kv_capacity_tokens": plan.kv_capacity_tokens,
    }
    out.update(comm_shares(res, cost, pipeline))
    rq = res.requests
    out.update(
        goodput(
            rq["ttft_s"],
            rq["tpot_s"],
            (rq["status"] != "error").to_numpy(),
            m["duration_s"],
            cluster.slo_ttft_ms,
            cluster.slo_tpot_ms,
        )
    )
    out.update(cost_figures(cluster.gpus, m["duration_s"], m["total_output_tokens"], hardware.price_per_gpu_hour))
    return out
