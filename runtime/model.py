"""TinyLM: a Llama-style decoder (RMSNorm, RoPE on explicit position ids, SwiGLU, grouped-query
attention) with one inference primitive:

    forward(tokens, positions, slots, visibility, kv) -> logits

Every new token is computed at an explicit position id, its K/V are written into an explicit slot
of a `PagedKVStore`, and each query row attends only to the slots its row of `visibility` allows.
Causal decoding, thread isolation (PASTA), bidirectional spans (Planned Diffusion) and eviction
(TIP) are all choices of `visibility`; the model never knows which system is running it.

`forward_dense` is the same network over whole sequences with an explicit (B, T, T) mask, for
training with exactly the visibility and positions the runtime will use.

Tensor legend: B batch, T tokens in a call, N new tokens (T with B=1), H query heads,
Hkv kv heads, D head dim, L layers, S slot address space, M gathered slots, V vocab.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from profiler.errors import UnknownName, UsageError
from runtime.attention import masked_sdpa, weighted_attention
from runtime.kv import PagedKVModel, PagedKVStore, attention_mask


@dataclass
class ModelConfig:
    name: str = "tiny-4l"
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 0  # 0: derived as in Llama (8/3 d rounded up to a multiple of 32)
    vocab_size: int = 0  # 0: the tokenizer's vocabulary
    max_positions: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.vocab_size == 0:
            from runtime.tokenizer import Tokenizer

            self.vocab_size = Tokenizer().vocab_size
        if self.d_ff == 0:
            self.d_ff = 32 * math.ceil(8 * self.d_model / 3 / 32)
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.name}: d_model ({self.d_model}) must divide by n_heads ({self.n_heads}), "
                f"and n_heads by n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:  # was: ValueError from apply_rope's chunk(2) at the first pass (exit 1)
            raise ValueError(
                f"{self.name}: the head dimension d_model / n_heads ({self.d_model} / {self.n_heads} = "
                f"{self.head_dim}) must be even (the rotary embedding turns pairs of it)"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_name(cls, name: str) -> ModelConfig:
        if name not in PRESETS:
            raise UnknownName(f"unknown model preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}")
        return cls(name=name, **PRESETS[name])

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, dict] = {
    "tiny-2l": dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2),  # tests
    "tiny-4l": dict(n_layers=4, d_model=128, n_heads=4, n_kv_heads=2),  # shipped models
    "small-6l": dict(n_layers=6, d_model=256, n_heads=8, n_kv_heads=4),
}


def check_fits(cfg, length: int, top_id: int, what: str) -> None:
    """UsageError unless a sequence of `length` tokens whose largest id is `top_id` fits the model
    of `cfg` (a `ModelConfig`, or a transformers model's view with the same two fields): every id
    inside its vocabulary, `length` within its positions. A checkpoint of a smaller vocabulary or
    fewer positions than a task's sequences need failed deep in torch (IndexError in the embedding,
    exit 1) or in an engine's own ValueError."""
    if top_id >= cfg.vocab_size:
        raise UsageError(
            f"{what} holds token id {top_id}, outside the model's vocabulary of {cfg.vocab_size} "
            "(a checkpoint sized for another tokenizer)"
        )
    if length > cfg.max_positions:
        raise UsageError(f"{what} needs {length} positions, more than the model's {cfg.max_positions}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin for explicit positions (B, T) -> each (B, 1, T, D/2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    ang = positions.float()[..., None] * inv_freq  # (B, T, D/2)
    return ang.cos()[:, None], ang.sin()[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x (B, H, T, D)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


# kv_fn(layer, k, v) -> (K, V): where the attention's keys come from (the call itself, or the store)
KVFn = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Group:
    """Rows [start, stop) of a batched pass that attend only to `cols` (M,) of the store, under
    `mask` (1, 1, R, M): one request of a server's batch (a per-request gather)."""

    start: int
    stop: int
    cols: torch.Tensor
    mask: torch.Tensor
    attention: bool = False


def grouped_attention(
    q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    groups: list[Group],
    attn_out: list[torch.Tensor] | None,
    attn_rows: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of q (1, H, N, D) over K, V (1, Hkv, S, D), each group's rows over its own gathered
    slots only; with `attn_out`, the attention each slot received (1, S) from the rows `attn_rows`
    (N,) bool selects (None: every row) is appended. `scale` multiplies the scores (None: 1 /
    sqrt(D); a transformers model's own `scaling`, e.g. Gemma's query_pre_attn_scalar)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    ys, per_slot = [], None
    if attn_out is not None:
        per_slot = q.new_zeros((1, K.shape[2]), dtype=torch.float32)  # summed in fp32 under bf16 too
    for g in groups:
        qg, Kg, Vg = q[:, :, g.start : g.stop], K[:, :, g.cols], V[:, :, g.cols]  # (1, H, R, D), (1, Hkv, M, D)
        if per_slot is None or not g.attention:
            ys.append(masked_sdpa(qg, Kg, Vg, g.mask, scale))
            continue
        rows = None if attn_rows is None else attn_rows[g.start : g.stop]
        y, received = weighted_attention(qg, Kg, Vg, g.mask, scale, rows)
        per_slot[0].index_add_(0, g.cols, received[0])
        ys.append(y)
    if attn_out is not None and per_slot is not None:  # one is set with the other
        attn_out.append(per_slot)
    return torch.cat(ys, dim=2)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer, self.cfg = layer, cfg
        D, H, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.wqkv = nn.Linear(cfg.d_model, (H + 2 * Hkv) * D, bias=False)
        self.wo = nn.Linear(H * D, cfg.d_model, bias=False)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.w_gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, d)
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,  # (B, 1, T, M) bool, True = may attend
        kv_fn: KVFn,
        attn_out: list[torch.Tensor] | None = None,
        groups: list[Group] | None = None,
        attn_rows: torch.Tensor | None = None,  # (T,) bool: rows whose attention attn_out sums
    ) -> torch.Tensor:
        B, T, _ = x.shape
        H, Hkv, D = self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim
        qkv = self.wqkv(self.input_layernorm(x))
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = apply_rope(q.view(B, T, H, D).transpose(1, 2), cos, sin)  # (B, H, T, D)
        k = apply_rope(k.view(B, T, Hkv, D).transpose(1, 2), cos, sin)  # (B, Hkv, T, D)
        v = v.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
        K, V = kv_fn(self.layer, k, v)  # (B, Hkv, M, D)
        if groups is not None:
            y = grouped_attention(q, K, V, groups, attn_out, attn_rows)
        elif attn_out is None:
            y = masked_sdpa(q, K, V, mask)
        else:  # explicit softmax so the weights can be returned (H2O needs them)
            y, received = weighted_attention(q, K, V, mask, None, attn_rows)
            attn_out.append(received)  # (B, M): attention each key received
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, H * D))
        gate, up = self.w_gate_up(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.w_down(F.silu(gate) * up)


class TinyLM(PagedKVModel, nn.Module):
    supports_groups = True  # forward(..., groups=) attends per request over gathered slots (runtime.server)

    def __init__(self, cfg: ModelConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int) -> None:
        """Deterministic init from a seed (GPT-2 style: N(0, 0.02), residual outputs scaled)."""
        if self.embed.weight.is_meta:  # built on the meta device for its shapes only (runtime.checkpoint)
            return
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    p.fill_(1.0)
                    continue
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("wo.weight", "w_down.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)

    # ------------------------------------------------------------------ inference primitive
    @torch.no_grad()
    def forward(
        self,
        tokens: torch.Tensor,  # (N,) long
        positions: torch.Tensor,  # (N,) long
        slots: torch.Tensor,  # (N,) long: where each token's K/V is written
        visibility: torch.Tensor,  # (N, S) bool: slots each query row may attend to
        kv: PagedKVStore,
        return_attention: bool = False,
        groups: list[Group] | None = None,
        attention_rows: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (N, V) for new tokens. With `return_attention`, also the attention each slot
        received, summed over layers, heads and query rows: (S,) float; `attention_rows` (N,) bool
        limits the sum to those rows (a server leaves out a recompute's replayed rows).

        With `groups` (a server's per-request gather), `visibility` is ignored (None): each group's
        rows attend to its own gathered slots under its own mask, so attention work follows what
        each request can see rather than the whole pool."""
        dev = self.embed.weight.device
        tokens, positions, slots = tokens.to(dev), positions.to(dev), slots.to(dev)
        N = tokens.shape[0]
        kv.check_slots(slots.tolist())
        # (1, 1, N, S): keys are every slot of the store
        mask = attention_mask(visibility, N, kv, dev) if groups is None else None
        S = kv.num_slots

        def kv_fn(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            kv.write(layer, slots, k[0].transpose(0, 1), v[0].transpose(0, 1))  # (N, Hkv, D)
            K, V = kv.keys_values(layer)  # (Hkv, S, D) views
            return K[None], V[None]

        cos, sin = rope_angles(positions[None], self.cfg.head_dim, self.cfg.rope_theta)
        x = self.embed(tokens)[None]  # (1, N, d)
        attn: list[torch.Tensor] | None = [] if return_attention else None
        rows = None if attention_rows is None else attention_rows.to(dev)
        for block in self.layers:
            x = block(x, cos, sin, mask, kv_fn, attn, groups, rows)
        logits = self.lm_head(self.norm(x))[0].float()  # (N, V)
        if not return_attention:
            return logits
        per_slot = torch.zeros(S if visibility is None else max(S, visibility.shape[1]), device=dev)
        assert attn is not None  # a list whenever return_attention
        per_slot[:S] = torch.stack(attn).sum(0)[0].float()
        return logits, per_slot

    # ------------------------------------------------------------------ training path
    def forward_dense(
        self,
        tokens: torch.Tensor,  # (B, T)
        positions: torch.Tensor,  # (B, T)
        mask: torch.Tensor,  # (B, T, T) bool: row t may attend to column s
    ) -> torch.Tensor:
        """Logits (B, T, V) over whole sequences, with the mask the runtime will reproduce."""
        cos, sin = rope_angles(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = self.embed(tokens)

        def kv_fn(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return k, v

        m = mask[:, None]  # (B, 1, T, T)
        for block in self.layers:
            x = block(x, cos, sin, m, kv_fn)
        return self.lm_head(self.norm(x))


def causal_mask(T: int, device: str | torch.device = "cpu") -> torch.Tensor:
    return torch.ones((T, T), dtype=torch.bool, device=device).tril()
