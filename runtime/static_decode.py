"""Batch-1 decode with static shapes and no host synchronisation, optionally compiled.

The engines' path (`HFCausalLM.forward` over a `PagedKVStore`) checks its slots and its mask on
the host every pass (2-3 device->host copies) and the recorder synchronises after every pass: right
for measuring orchestration, too slow to reach the memory-bandwidth bound of batch-1 decode on a
GPU. `StaticDecoder` is the decode step a serving engine would use for one stream: a dense KV cache
of fixed capacity held as module buffers (slot = position), the mask computed on device from the
position tensor, the same decoder body as the engines (`HFCausalLM.forward_unchecked`), so the
result is the same model and the same tokens.

`mode` (the flag; `bench/decode_efficiency.py --mode`):
    eager           the static step as is (no compile)
    compile         `torch.compile(fullgraph=True)` with inductor (CPU or GPU)
    cuda-graphs     `torch.compile(mode="reduce-overhead")`: inductor plus CUDA graphs (GPU only)
    trace           `torch.compile(backend="eager", fullgraph=True)`: dynamo tracing only, so a
                    CPU test proves the step compiles as one graph without paying for codegen
"""

from __future__ import annotations

import torch
from torch import nn

MODES = ("eager", "compile", "cuda-graphs", "trace")


class DenseKV(nn.Module):
    """(L, Hkv, C, D) K and V buffers; slot = position. `write` / `keys_values` as the paged store's."""

    k: torch.Tensor  # buffers (typed for mypy: nn.Module's attribute lookup says Tensor | Module)
    v: torch.Tensor

    def __init__(self, n_layers: int, n_kv_heads: int, capacity: int, head_dim: int, dtype, device) -> None:
        super().__init__()
        shape = (n_layers, n_kv_heads, capacity, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(1, slots, k.transpose(0, 1).to(self.k.dtype))  # k: (N, Hkv, D)
        self.v[layer].index_copy_(1, slots, v.transpose(0, 1).to(self.v.dtype))

    def keys_values(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer], self.v[layer]


class StaticDecoder(nn.Module):
    arange: torch.Tensor  # a buffer

    def __init__(self, model, capacity: int, mode: str = "eager") -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "cuda-graphs" and not model.device.type == "cuda":
            raise ValueError("mode cuda-graphs needs a CUDA device (use compile or eager on the CPU)")
        c = model.cfg
        if capacity > c.max_positions:
            raise ValueError(f"capacity {capacity} exceeds the model's {c.max_positions} positions")
        self.model, self.capacity, self.mode = model, capacity, mode
        self.kv = DenseKV(c.n_layers, c.n_kv_heads, capacity, c.head_dim, model.embed.weight.dtype, model.device)
        self.register_buffer("arange", torch.arange(capacity, device=model.device), persistent=False)
        step = self._step
        if mode == "compile":
            step = torch.compile(step, fullgraph=True, dynamic=False)
        elif mode == "cuda-graphs":
            step = torch.compile(step, mode="reduce-overhead", fullgraph=True, dynamic=False)
        elif mode == "trace":
            step = torch.compile(step, backend="eager", fullgraph=True, dynamic=False)
        self.step_fn = step

    def _step(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """token, position: (1,) device tensors -> logits (1, V). No host sync."""
        mask = (self.arange <= position)[None, None, None, :]  # (1, 1, 1, C)
        return self.model.forward_unchecked(token, position, position, mask, self.kv)

    @torch.no_grad()
    def prefill(self, tokens: list[int]) -> torch.Tensor:
        """Uncompiled causal prefill of positions 0..N-1; logits of the last row (1, V)."""
        n = len(tokens)
        if not 0 < n < self.capacity:
            raise ValueError(f"prompt of {n} tokens does not fit the capacity {self.capacity}")
        dev = self.model.device
        pos = torch.arange(n, device=dev)
        mask = (self.arange[None, :] <= pos[:, None])[None, None]  # (1, 1, N, C)
        return self.model.forward_unchecked(torch.tensor(tokens, device=dev), pos, pos, mask, self.kv)[-1:]

    @torch.no_grad()
    def decode(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return self.step_fn(token, position)

    @torch.no_grad()
    def greedy(self, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy continuation; the token stays on the device between passes (one copy at the end)."""
        # the last decode writes slot len(prompt) + max_tokens - 2 (was: max_tokens 0 gave one token,
        # and a continuation past the capacity wrote out of bounds: IndexError, on a GPU a device assert)
        if max_tokens < 1 or len(prompt) + max_tokens - 1 > self.capacity:
            raise ValueError(
                f"{max_tokens} tokens after a prompt of {len(prompt)} do not fit the capacity {self.capacity}"
            )
        dev = self.model.device
        tok = self.prefill(prompt).argmax(-1)  # (1,)
        out = [tok]
        pos = torch.tensor([len(prompt)], device=dev)
        for _ in range(max_tokens - 1):
            tok = self.decode(tok, pos).argmax(-1)
            out.append(tok)
            pos = pos + 1
        return torch.cat(out).tolist()
