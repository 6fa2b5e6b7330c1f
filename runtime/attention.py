"""The one masked scaled-dot-product attention every model's paged forward calls, and how it runs.

What: `masked_sdpa(q, K, V, mask, scale)` is `F.scaled_dot_product_attention` over q (1, H, N, D)
and K, V (1, Hkv, S, D) under a bool mask (1, 1, N, S), grouped-query heads included. How PyTorch
runs it is chosen by `SOLM_SDPA` (read once, at the first call; default `default`):

    default     `efficient` on a CUDA device outside torch.compile, `auto` elsewhere
    auto        PyTorch's own choice (on an H100/H200 with a mask: cuDNN's fused attention)
    bucket      the same, with the query rows and the key span padded up to powers of two (padded
                keys masked out, padded rows discarded), so a pass meets one of few shapes
    efficient   the memory-efficient kernel (math where it refuses), each K, V head's query
                heads folded into its query rows (the kernel takes no grouped heads)
    no-cudnn    any backend but cuDNN's (with a mask and grouped heads: the math path)
    math        the unfused reference: matrix products and a softmax

Why: on the H200 (traces/gpu-h200/README.md, runs 4-6) the first pass of every new (rows, key
span) shape spent 42-76 ms of host time in `aten::_cudnn_attention_forward`, building cuDNN's
plan for the shape, against 1.2-2.2 ms once built, and a serving run meets a new shape on most of its
passes (its batch and its pool change all the time). `efficient` has no per-shape cost (a new
shape's first pass 1.01x its median, against 2.72x under `auto`) and served the same 64 req/s
load in 0.59-0.71x the forward time of `auto` (three loads on two machines); `bucket`'s passes
are the fastest once its few shapes are planned, but a short run still meets most of them for
the first time. Under torch.compile (runtime/static_decode.py) shapes are fixed, so a plan is built once:
`default` leaves it to PyTorch there. On a CPU there is no plan to build and `auto` costs least.
Each strategy is the same function of its inputs (to rounding); `python -m runtime.rows_sweep
--device cuda --json` with `SOLM_SDPA` set measures one's passes and first passes.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from profiler.errors import UsageError
from runtime.kv import attention_row_sum
from runtime.options import SDPA_STRATEGIES

SDPA_ENV = "SOLM_SDPA"
_NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


_strategy: str | None = None  # resolved from the environment on first use (a constant to torch.compile)


def set_sdpa_strategy(name: str | None) -> str:
    """Use `name` from now on (None: read `SOLM_SDPA` again, default `default`); a UsageError names the
    valid ones. Returns the strategy in force."""
    global _strategy
    if name is None:
        name = os.environ.get(SDPA_ENV, "default").strip() or "default"
    if name not in SDPA_STRATEGIES:
        raise UsageError(f"{SDPA_ENV}={name!r} is not an attention strategy; valid: {', '.join(SDPA_STRATEGIES)}")
    _strategy = name
    return name


def sdpa_strategy() -> str:
    """The strategy in force: `SOLM_SDPA` as first read (default `default`), or what `set_sdpa_strategy` set."""
    return _strategy if _strategy is not None else set_sdpa_strategy(None)


def effective_strategy(strategy: str, cuda: bool, compiling: bool = False) -> str:
    """What `strategy` runs as on a CUDA device or not, inside torch.compile or not (`default`
    resolved; every other strategy is itself)."""
    if strategy != "default":
        return strategy
    return "efficient" if cuda and not compiling else "auto"


def strategy_in_force(cuda: bool, compiling: bool = False) -> str:
    """What a pass's masked attention runs as now (`sdpa_strategy` resolved for the device and
    torch.compile by `effective_strategy`): what `masked_sdpa` runs and a capture records."""
    return effective_strategy(sdpa_strategy(), cuda, compiling)


def next_power_of_two(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def masked_sdpa(
    q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Attention of q (1, H, N, D) over K, V (1, Hkv, S, D) under mask (1, 1, N, S) bool (True:
    may attend; every row sees at least one key): (1, H, N, D), run as `SOLM_SDPA` says."""
    strategy = strategy_in_force(q.is_cuda, torch.compiler.is_compiling())
    if strategy == "auto":
        return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=scale, enable_gqa=True)
    if strategy == "bucket":
        N, S = q.shape[2], K.shape[2]
        Nb, Sb = next_power_of_two(N), next_power_of_two(S)
        if Sb > S:  # padded keys no row may see: the pool's own slots past S where it has them
            K, V = _extended(K, Sb), _extended(V, Sb)
            mask = F.pad(mask, (0, Sb - S), value=False)
        if Nb > N:  # padded rows: zeros that see every key (finite), dropped after
            q = F.pad(q, (0, 0, 0, Nb - N))
            mask = F.pad(mask, (0, 0, 0, Nb - N), value=True)
        y = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=scale, enable_gqa=True)
        return y[:, :, :N]
    if strategy == "efficient":
        return _efficient(q, K, V, mask, scale)
    backends = _NO_CUDNN if strategy == "no-cudnn" else [SDPBackend.MATH]
    with sdpa_kernel(backends):
        return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=scale, enable_gqa=True)


def weighted_attention(
    q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit-softmax attention whose weights H2O reads (TIP's eviction): q (B, H, N, D)
    over K, V (B, Hkv, S, D) under mask (B, 1|H, N, S) bool. Returns the output (B, H, N, D) and
    the attention each key received, summed over heads and the query rows `rows` (N,) bool
    selects (None: every row), in fp32 under bf16 too: (B, S). The scores are multiplied by
    `scale` (None: 1 / sqrt(D)), as `masked_sdpa` scales them. The one copy every model's paged
    forward calls (the tiny model's, the transformers adapter's, the grouped per-request one)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    rep = q.shape[1] // K.shape[1]
    Kr, Vr = K.repeat_interleave(rep, dim=1), V.repeat_interleave(rep, dim=1)
    w = ((q @ Kr.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf")).softmax(-1)
    return w @ Vr, attention_row_sum(w.float(), rows)


def _efficient(
    q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """The memory-efficient kernel, which takes no grouped heads: the `rep` query heads of each
    K, V head are folded into its query rows (q (B, H, N, D) as (B, Hkv, rep N, D), the mask's
    rows repeated to match), so K and V, a view of the whole pool, are never copied; a mask with
    a head dimension of its own expands K and V instead. The output is unfolded back."""
    B, H, N, D = q.shape
    Hkv = K.shape[1]
    rep = H // Hkv
    backends = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    if rep > 1 and mask.shape[1] == 1:
        S = mask.shape[-1]
        qf = q.reshape(B, Hkv, rep * N, D)  # query head h = kv * rep + r, as repeat_interleave pairs them
        mf = mask[:, :, None].expand(mask.shape[0], 1, rep, N, S).reshape(mask.shape[0], 1, rep * N, S)
        with sdpa_kernel(backends):
            y = F.scaled_dot_product_attention(qf, K, V, attn_mask=mf, scale=scale)
        return y.reshape(B, H, N, D)
    if rep > 1:
        K, V = K.repeat_interleave(rep, dim=1), V.repeat_interleave(rep, dim=1)
    with sdpa_kernel(backends):
        return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=scale)


def _extended(X: torch.Tensor, span: int) -> torch.Tensor:
    """X (B, Hkv, S, D) extended to `span` keys. When X is a view of a paged pool's first S slots
    (`PagedKVStore.keys_values`: each head's rows lie `capacity` slots apart, capacity >= span),
    the same view over `span` of them, no copy: the slots past S hold zeros or a freed page's
    keys, as the free pages within S do, and the padded mask hides them. Else X padded with zeros
    (a copy)."""
    S, D = X.shape[2], X.shape[3]
    _, head_stride, slot_stride, dim_stride = X.stride()
    capacity = head_stride // D if (dim_stride == 1 and slot_stride == D) else S
    if span <= capacity:
        return X.as_strided((*X.shape[:2], span, D), X.stride(), X.storage_offset())
    return F.pad(X, (0, 0, 0, span - S))
