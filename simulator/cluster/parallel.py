"""One replica on several GPUs: tensor parallelism (TP) and pipeline parallelism (PP).

What: `Parallelism(tp, pp, micro_batches)`; `memory_plan` says what one GPU of the replica holds
(its shard of the weights, its shard of the KV pool) and how many KV tokens the replica can hold;
`ParallelCost` times one batched forward pass of the replica (the replay's `cost` protocol).

TP (Megatron-LM, Shoeybi et al. 2019): every GEMM's weights and the attention heads are split
over `tp` GPUs (KV heads replicate when there are fewer than `tp`), norms and residual adds stay
whole, and each layer ends its attention and its MLP with an all-reduce of the (tokens, d_model)
activations: `simulator.cost.CostModel(tensor_parallel=tp)`, whose all-reduces are timed by the
calibrated `simulator.comm`.

PP (GPipe, Huang et al. 2019): the layers are split into `pp` stages (the first stages take one
more when they do not divide); a pass's batch is cut into `micro_batches` (default `pp`, at most
one per stream) that flow through the stages, each stage handing its activations (tokens x
d_model / tp bytes per GPU, Megatron's scatter/gather) to the next with a send/recv. Forward-only
flow shop with identical micro-batches: the pass takes

    sum_s t_s + sum_b c_b + (m - 1) max(max_s t_s, max_b c_b)

(t_s: stage s on one micro-batch, c_b: the send/recv over boundary b, on the link between the
two stages' GPUs: `boundary_links`): the first micro-batch crosses every stage, the others follow
one bottleneck-time apart. The idle share of the stages is the pipeline
*bubble*. Under `schedule="drain"` each pass is one scheduler iteration (the next decode step
needs this pass's tokens), so the pipeline drains every pass; the per-pass host overhead is paid
once. Under `schedule="interleave"` (vLLM's virtual engines) `micro_batches` independent batches
are in flight instead, each one micro-batch through the stages: `simulator.cluster.pipeline`
times them with `stage_times`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from profiler.errors import UsageError, is_count
from simulator.comm import collective_time_s
from simulator.cost import CostModel, CostParams
from simulator.hardware import HardwareSpec
from simulator.models import ModelSpec

GIB = 2**30
PP_SCHEDULES = ("drain", "interleave")  # docs/cluster.md: one pass drains the pipeline, or batches in flight


@dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    pp: int = 1
    micro_batches: int | None = None  # None: pp (drain: micro-batches a pass; interleave: batches in flight)
    schedule: str = "drain"

    def __post_init__(self) -> None:
        for name in ("tp", "pp"):
            value = getattr(self, name)
            if not is_count(value):
                raise UsageError(f"--{name} must be a positive integer, got {value!r}")
        if self.micro_batches is not None and not is_count(self.micro_batches):
            raise UsageError(f"--micro-batches must be a positive integer, got {self.micro_batches!r}")
        if self.schedule not in PP_SCHEDULES:
            raise UsageError(f"--pp-schedule must be one of {', '.join(PP_SCHEDULES)}, got {self.schedule!r}")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def micro(self) -> int:
        return self.pp if self.micro_batches is None else self.micro_batches

    @property
    def interleaved(self) -> bool:
        """Batches in flight through a pipeline (with one stage, every schedule is the plain replay)."""
        return self.schedule == "interleave" and self.pp > 1

    def check(self, model: ModelSpec, hardware: HardwareSpec) -> None:
        """ValueError (one line) for a split the model or the node cannot take."""
        if model.n_heads % self.tp:
            raise UsageError(f"--tp {self.tp} does not divide {model.name}'s {model.n_heads} attention heads")
        kv = model.n_kv_heads
        if kv % self.tp and self.tp % kv:  # a GPU's query heads would span parts of two KV heads (vLLM refuses)
            raise UsageError(
                f"--tp {self.tp} splits {model.name}'s {kv} KV heads unevenly: give a divisor or a multiple of {kv}"
            )
        if self.pp > model.n_layers:
            raise UsageError(f"--pp {self.pp} exceeds {model.name}'s {model.n_layers} layers")
        node = hardware.gpus_per_node
        if self.tp > node and self.tp % node:
            raise UsageError(f"--tp {self.tp} on {hardware.name} must fill whole nodes of {node} GPUs")
        for s in range(self.pp if self.tp < node else 0):  # GPUs numbered stage by stage (boundary_links)
            first, last = s * self.tp, (s + 1) * self.tp - 1
            if first // node != last // node:  # its all-reduces would be timed inside one node
                raise UsageError(
                    f"--tp {self.tp} --pp {self.pp} on {hardware.name}: stage {s + 1}'s GPUs {first}-{last} "
                    f"straddle two nodes of {node}; give a --tp that divides {node}"
                )


def slowest_link(hardware: HardwareSpec, pairs: list[tuple[int, int]]) -> str:
    """The slowest link GPU pairs (a, b) send over at once, GPUs numbered `gpus_per_node` to a
    node: "network" where some pair sits on two nodes, "pcie" on an NVLink-pairs node where some
    pair is outside one bridged pair (GPUs 2i and 2i + 1), else "node" (the node's own fabric:
    NVSwitch, a pair's bridge, mesh, PCIe)."""
    node = hardware.gpus_per_node
    if any(a // node != b // node for a, b in pairs):
        return "network"
    if hardware.topology == "nvlink_pairs" and any(a // 2 != b // 2 for a, b in pairs):
        return "pcie"
    return "node"


def boundary_links(hardware: HardwareSpec, par: Parallelism) -> list[str]:
    """The link each of the pp - 1 stage boundaries sends over (`slowest_link` of its TP ranks'
    pairs), with the replica's GPUs numbered stage by stage (stage s, TP rank r on GPU s x tp + r;
    vLLM's and Megatron's rank order)."""
    tp = par.tp
    return [slowest_link(hardware, [(s * tp + r, (s + 1) * tp + r) for r in range(tp)]) for s in range(par.pp - 1)]


def link_kwargs(path: str) -> dict:
    """`simulator.comm.collective_time_s` keywords of a send/recv over a link that
    `boundary_links` or `disaggregation.transfer_link` named ("network", "pcie" or "node")."""
    return {"topology": "pcie" if path == "pcie" else None, "across_nodes": path == "network"}


def stage_layers(n_layers: int, pp: int) -> list[int]:
    """Layers per stage, the first stages taking the remainder. A stage of no layer is refused
    here too, for callers that skip `Parallelism.check` (was: memory_plan's ZeroDivisionError)."""
    if pp > n_layers:
        raise UsageError(f"--pp {pp} exceeds the model's {n_layers} layers: a stage needs at least one")
    base, extra = divmod(n_layers, pp)
    return [base + (1 if s < extra else 0) for s in range(pp)]


def _kv_share(model: ModelSpec, tp: int) -> float:
    """Fraction of a layer's KV heads one TP rank holds (heads replicate below one per rank)."""
    return max(model.n_kv_heads // tp, 1) / model.n_kv_heads


def layer_weight_bytes_per_gpu(model: ModelSpec, tp: int) -> float:
    d = model.d_model
    qo = 2 * d * model.q_dim / tp
    kv = d * 2 * model.kv_dim * _kv_share(model, tp)
    mlp = (3 if model.gated_mlp else 2) * d * model.d_ff / tp
    return (qo + kv + mlp + model.norms_per_layer * d) * model.dtype_bytes


def stage_weight_bytes(model: ModelSpec, par: Parallelism) -> list[float]:
    """Weights each GPU of each stage holds: its layers' shards, the embedding (first stage),
    the final norm and lm_head (last stage; the tied embedding when the model ties them)."""
    embed = model.vocab_size * model.d_model * model.dtype_bytes / par.tp  # vocab-parallel
    layer = layer_weight_bytes_per_gpu(model, par.tp)
    out = []
    for s, layers in enumerate(stage_layers(model.n_layers, par.pp)):
        total = layers * layer
        if s == 0:
            total += embed
        if s == par.pp - 1:
            total += model.d_model * model.dtype_bytes + (embed if not model.tied_embeddings or par.pp > 1 else 0)
        out.append(total)
    return out


@dataclass(frozen=True)
class MemoryPlan:
    """What one GPU of a replica holds, on the stage that runs out first."""

    gpus: int
    usable_bytes_per_gpu: int
    weight_bytes_per_gpu: int
    kv_pool_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_capacity_tokens: int
    kv_capacity_bytes: int  # the same tokens in whole-model KV bytes (what the replay's pool counts)

    def describe(self) -> dict:
        return dataclasses.asdict(self)


def memory_plan(
    hardware: HardwareSpec,
    model: ModelSpec,
    par: Parallelism,
    memory_utilization: float = 0.9,
    kv_capacity_bytes: int | None = None,
) -> MemoryPlan:
    """Per-GPU weights and KV pool; the replica's KV capacity is its tightest stage's.

    ValueError (one line) when the weights leave no room for KV on some GPU.
    """
    usable = int(hardware.hbm_capacity_bytes * memory_utilization)
    weights = stage_weight_bytes(model, par)
    kv_per_token = [
        layers * model.kv_bytes_per_token_per_layer * _kv_share(model, par.tp)
        for layers in stage_layers(model.n_layers, par.pp)
    ]
    heaviest = int(np.argmax(weights))
    if usable - weights[heaviest] <= 0:
        split = (
            f" split over tp {par.tp} x pp {par.pp}: {weights[heaviest] / GIB:.1f} GiB per GPU" if par.gpus > 1 else ""
        )
        raise UsageError(
            f"{model.name} weights ({model.weight_bytes / GIB:.1f} GiB{split}) leave no room for KV in {hardware.name}'s "
            f"{usable / GIB:.1f} GiB usable memory; pick a larger part, shard it with --tp/--pp, or "
            f"model a smaller one"
        )
    tokens = min(int((usable - w) // k) for w, k in zip(weights, kv_per_token))
    if kv_capacity_bytes is not None:  # the user's pool size, in whole-model bytes
        tokens = int(kv_capacity_bytes // model.kv_bytes_per_token)
    tight = int(np.argmin([(usable - w) / k for w, k in zip(weights, kv_per_token)]))
    return MemoryPlan(
        gpus=par.gpus,
        usable_bytes_per_gpu=usable,
        weight_bytes_per_gpu=int(weights[tight]),
        kv_pool_bytes_per_gpu=int(tokens * kv_per_token[tight]),
        kv_bytes_per_token_per_gpu=round(kv_per_token[tight]),
        kv_capacity_tokens=tokens,
        kv_capacity_bytes=int(tokens * model.kv_bytes_per_token),
    )


class ParallelCost:
    """Seconds of one batched pass of a TP x PP replica (scalars or numpy arrays, as CostModel)."""

    def __init__(
        self, hardware: HardwareSpec, model: ModelSpec, par: Parallelism, params: CostParams | None = None
    ) -> None:
        par.check(model, hardware)
        self.hardware, self.model, self.par = hardware, model, par
        self.full = CostModel(hardware, model, params, tensor_parallel=par.tp)
        self.params = self.full.params
        self.layer = CostModel(hardware, dataclasses.replace(model, n_layers=1), self.params, tensor_parallel=par.tp)
        self.layers = np.array(stage_layers(model.n_layers, par.pp), float)
        self.boundary_links = boundary_links(hardware, par)

    @property
    def cross_node(self) -> bool:
        """Whether some stage boundary crosses nodes (its send goes over the NICs)."""
        return "network" in self.boundary_links

    def _send_s(self, tokens) -> np.ndarray:
        """(pp - 1, passes) seconds of each stage boundary's send/recv of `tokens` activations."""
        nbytes = np.atleast_1d(np.asarray(tokens, float)) * self.model.d_model * self.model.dtype_bytes / self.par.tp
        if not self.boundary_links:
            return np.zeros((0, nbytes.size))
        times = {  # each distinct link timed once
            path: np.asarray(collective_time_s("send_recv", nbytes, 2, self.hardware, **link_kwargs(path)), float)
            for path in set(self.boundary_links)
        }
        return np.stack([times[path] for path in self.boundary_links])

    def _stages(self, qm, kvm, gm, lgm):
        """(pp, passes) seconds of each stage on one micro-batch of the given shape, and
        (pp - 1, passes) seconds of each boundary's send/recv of its activations (no host overhead)."""
        head = sum(v for k, v in self.layer.pass_op_times_s(qm, lgm).items() if k != "step_overhead")
        layer_s = np.asarray(self.layer.step_time_s(qm, kvm, gm, lgm), float) - head - self.params.step_overhead_s
        stages = self.layers[:, None] * layer_s[None, :]
        stages[-1] += head
        return stages, self._send_s(qm)

    def stage_times(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        """One pass as a single micro-batch: ((pp,) stage seconds, (pp - 1,) boundary send/recv
        seconds) (the interleaved schedule's unit; the host overhead is `params.step_overhead_s` on top)."""
        q = np.atleast_1d(np.asarray(query_tokens, float))
        lg = q if logit_tokens is None else np.atleast_1d(np.asarray(logit_tokens, float))
        g = np.atleast_1d(np.asarray(query_groups, float))
        stages, sends = self._stages(q, np.atleast_1d(np.asarray(kv_tokens_read, float)), np.maximum(g, 1), lg)
        return stages[:, 0], sends[:, 0]

    def breakdown(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None, micro=None) -> dict:
        """{total_s, all_reduce_s, send_recv_s, bubble_s}: where one pass's time goes (arrays ok).

        all_reduce_s and send_recv_s are on the pass's critical path; bubble_s is the stages'
        mean idle time within the pass. `micro`: micro-batches a pass is cut into (default the
        parallelism's; 1 for the interleaved schedule's passes)."""
        q = np.atleast_1d(np.asarray(query_tokens, float))
        kv = np.atleast_1d(np.asarray(kv_tokens_read, float))
        g = np.broadcast_to(np.atleast_1d(np.asarray(query_groups, float)), q.shape)
        lg = q if logit_tokens is None else np.broadcast_to(np.atleast_1d(np.asarray(logit_tokens, float)), q.shape)
        overhead = self.params.step_overhead_s
        if self.par.pp == 1:
            total = np.asarray(self.full.step_time_s(q, kv, g, lg), float)
            ar = self.model.n_layers * np.asarray(self.layer._all_reduce_s(q), float) if self.par.tp > 1 else 0 * q
            return {"total_s": total, "all_reduce_s": ar, "send_recv_s": 0 * q, "bubble_s": 0 * q}
        m = np.minimum(self.par.micro if micro is None else micro, np.maximum(g, 1))
        qm, kvm, gm, lgm = q / m, kv / m, np.maximum(g / m, 1), np.maximum(lg / m, 1)
        stages, sends = self._stages(qm, kvm, gm, lgm)  # (pp, passes), (pp - 1, passes)
        pp, send = self.par.pp, sends.max(0)  # the slowest boundary's send
        total = stages.sum(0) + sends.sum(0) + (m - 1) * np.maximum(stages.max(0), send) + overhead
        # the critical path's all-reduces: every layer's once (the first micro-batch through the
        # stages), then the bottleneck stage's once per later micro-batch (none when a send is it)
        slowest = np.where(stages.max(0) >= send, self.layers[stages.argmax(0)], 0.0)
        ar = (
            (self.layers.sum() + (m - 1) * slowest) * np.asarray(self.layer._all_reduce_s(qm), float)
            if self.par.tp > 1
            else 0 * q
        )
        bubble = (total - overhead) - m * stages.sum(0) / pp
        return {
            "total_s": total,
            "all_reduce_s": ar,
            "send_recv_s": sends.sum(0),
            "bubble_s": np.maximum(bubble, 0),
        }

    def step_time_s(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        if self.par.pp == 1:
            return self.full.step_time_s(query_tokens, kv_tokens_read, query_groups, logit_tokens)
        scalar = not any(isinstance(v, np.ndarray) for v in (query_tokens, kv_tokens_read, query_groups, logit_tokens))
        total = self.breakdown(query_tokens, kv_tokens_read, query_groups, logit_tokens)["total_s"]
        return float(total[0]) if scalar else total
