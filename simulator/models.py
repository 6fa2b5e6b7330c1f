"""Model catalog: transformer architectures as the cost model and the KV pool see them.

What: `ModelSpec`, a frozen record of a decoder's shape (layers, widths, heads, MLP kind, dtype)
with derived sizes (`head_dim`, `params`, `weight_bytes`, `kv_bytes_per_token`), and `MODELS`,
presets for real architectures taken from their public Hugging Face `config.json`. The tiny
presets the runtime trains are not listed here: they travel inside each trace's `meta.json` and
are read with `ModelSpec.from_trace_meta`.

Why: the simulator answers "this trace's structure, on a 70B model" without the weights; all it
needs is the shape. The KV byte arithmetic lives here once (STYLE 3): the cost model and the KV
pool call `kv_bytes_per_token` rather than re-deriving it.

Biases (Qwen2's QKV bias, Phi-2's linear biases) and norm weights are left out of the FLOP
counts (under 0.1% of them); `params` counts the norm weights but not biases.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from profiler.errors import TraceMetaError, UnknownName, is_count, quoted


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int  # < n_heads: grouped-query attention
    d_ff: int  # MLP hidden width (per branch for gated MLPs)
    vocab_size: int
    gated_mlp: bool = True  # SwiGLU/GeGLU: gate and up projections, then down
    dtype_bytes: int = 2  # bf16/fp16
    tied_embeddings: bool = False  # lm_head shares the embedding matrix
    parallel_attn_mlp: bool = False  # GPT-J/Phi style: one norm, attn and MLP read the same input
    head_dim_override: int | None = None  # Gemma, Qwen3: head_dim != d_model / n_heads

    def __post_init__(self) -> None:
        for field in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "dtype_bytes"):
            value = getattr(self, field)
            if not is_count(value):
                raise ValueError(f"model {self.name!r}: {field} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model {self.name!r}: n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim_override is None and self.d_model % self.n_heads:
            raise ValueError(
                f"model {self.name!r}: d_model ({self.d_model}) is not a multiple "
                f"of n_heads ({self.n_heads}); give head_dim_override"
            )

    @functools.cached_property  # read on every pass the replay costs
    def head_dim(self) -> int:
        return self.head_dim_override or self.d_model // self.n_heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (n_heads x head_dim)."""
        return self.n_heads * self.head_dim

    @functools.cached_property  # read on every pass the replay costs
    def kv_dim(self) -> int:
        """Width of the key (or value) projection output (n_kv_heads x head_dim)."""
        return self.n_kv_heads * self.head_dim

    @property
    def norms_per_layer(self) -> int:
        return 1 if self.parallel_attn_mlp else 2

    @property
    def layer_params(self) -> int:
        """Weights of one block: QKV, O, MLP, norms."""
        attn = self.d_model * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.d_model
        mlp = (3 if self.gated_mlp else 2) * self.d_model * self.d_ff
        return attn + mlp + self.norms_per_layer * self.d_model

    @property
    def params(self) -> int:
        """All weights: embeddings, blocks, final norm, lm_head unless tied."""
        embed = self.vocab_size * self.d_model
        lm_head = 0 if self.tied_embeddings else embed
        return embed + lm_head + self.n_layers * self.layer_params + self.d_model

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @functools.cached_property  # read on every pass the replay costs
    def kv_bytes_per_token_per_layer(self) -> int:
        """K and V of one token in one layer: 2 x n_kv_heads x head_dim x dtype_bytes."""
        return 2 * self.kv_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all layers (what one KV slot costs)."""
        return self.n_layers * self.kv_bytes_per_token_per_layer

    @classmethod
    def from_trace_meta(cls, meta: dict[str, Any]) -> ModelSpec:
        """Build from a trace's `meta.json` (or its `"model"` entry).

        Required keys: name, n_layers, d_model, n_heads, n_kv_heads, d_ff, vocab_size,
        dtype_bytes. Optional: gated_mlp, tied_embeddings, parallel_attn_mlp, head_dim. Missing
        keys, non-integer sizes or impossible shapes raise TraceMetaError (a ValueError) naming them.
        """
        model = meta.get("model", meta) if isinstance(meta, dict) else meta
        if not isinstance(model, dict):
            raise TraceMetaError(f"trace meta 'model' must be a dict, got {type(model).__name__}")
        required = ("name", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "dtype_bytes")
        missing = [key for key in required if key not in model]
        if missing:
            raise TraceMetaError(f"trace meta 'model' lacks {', '.join(missing)}")
        wrong = [key for key in required[1:] if isinstance(model[key], bool) or not isinstance(model[key], int)]
        if wrong:
            raise TraceMetaError(f"trace meta 'model': {', '.join(wrong)} must be integers")
        optional: dict[str, Any] = {
            key: model[key] for key in ("gated_mlp", "tied_embeddings", "parallel_attn_mlp") if key in model
        }
        try:
            head_dim = model.get("head_dim")
            if head_dim is not None and int(head_dim) * int(model["n_heads"]) != int(model["d_model"]):
                optional["head_dim_override"] = int(head_dim)
            sizes: dict[str, Any] = {key: int(model[key]) for key in required[1:]}
            return cls(name=str(model["name"]), **sizes, **optional)
        except (TypeError, ValueError, OverflowError) as e:
            raise TraceMetaError(f"trace meta 'model': {e}") from None


# Each preset from the model's Hugging Face config.json (fields: num_hidden_layers, hidden_size,
# num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, head_dim,
# tie_word_embeddings).
_QWEN25_7B = ModelSpec(  # Qwen/Qwen2.5-7B; QKV bias not counted
    "qwen2.5-7b",
    n_layers=28,
    d_model=3584,
    n_heads=28,
    n_kv_heads=4,
    d_ff=18944,
    vocab_size=152064,
)

MODELS: dict[str, ModelSpec] = {
    "llama-2-7b": ModelSpec(  # meta-llama/Llama-2-7b-hf: 6.74B params
        "llama-2-7b",
        n_layers=32,
        d_model=4096,
        n_heads=32,
        n_kv_heads=32,
        d_ff=11008,
        vocab_size=32000,
    ),
    "llama-2-70b": ModelSpec(  # meta-llama/Llama-2-70b-hf: GQA with 8 KV heads
        "llama-2-70b",
        n_layers=80,
        d_model=8192,
        n_heads=64,
        n_kv_heads=8,
        d_ff=28672,
        vocab_size=32000,
    ),
    "llama-3-8b": ModelSpec(  # meta-llama/Meta-Llama-3-8B
        "llama-3-8b",
        n_layers=32,
        d_model=4096,
        n_heads=32,
        n_kv_heads=8,
        d_ff=14336,
        vocab_size=128256,
    ),
    "llama-3-70b": ModelSpec(  # meta-llama/Meta-Llama-3-70B
        "llama-3-70b",
        n_layers=80,
        d_model=8192,
        n_heads=64,
        n_kv_heads=8,
        d_ff=28672,
        vocab_size=128256,
    ),
    "gemma-7b": ModelSpec(  # google/gemma-7b: head_dim 256 (16 x 256 != 3072), GeGLU, tied
        "gemma-7b",
        n_layers=28,
        d_model=3072,
        n_heads=16,
        n_kv_heads=16,
        d_ff=24576,
        vocab_size=256000,
        tied_embeddings=True,
        head_dim_override=256,
    ),
    "qwen3-4b": ModelSpec(  # Qwen/Qwen3-4B: head_dim 128 (32 x 128 != 2560), tied
        "qwen3-4b",
        n_layers=36,
        d_model=2560,
        n_heads=32,
        n_kv_heads=8,
        d_ff=9728,
        vocab_size=151936,
        tied_embeddings=True,
        head_dim_override=128,
    ),
    "qwen2.5-7b": _QWEN25_7B,
    # Dream-org/Dream-v0-Base-7B is a masked-diffusion LM initialised from Qwen2.5-7B with the
    # same config (bidirectional attention changes the mask, not the shapes).
    "dream-7b": dataclasses.replace(_QWEN25_7B, name="dream-7b"),
    "codellama-34b": ModelSpec(  # codellama/CodeLlama-34b-hf: GQA with 8 KV heads
        "codellama-34b",
        n_layers=48,
        d_model=8192,
        n_heads=64,
        n_kv_heads=8,
        d_ff=22016,
        vocab_size=32000,
    ),
    "internlm-20b": ModelSpec(  # internlm/internlm-20b: multi-head attention (40 KV heads)
        "internlm-20b",
        n_layers=60,
        d_model=5120,
        n_heads=40,
        n_kv_heads=40,
        d_ff=13824,
        vocab_size=103168,
    ),
    # Qwen/Qwen-72B: QKV bias (not counted); its config.json lists intermediate_size 49152 for
    # the gate and up projections together, i.e. 24,576 per projection.
    "qwen-72b": ModelSpec(
        "qwen-72b",
        n_layers=80,
        d_model=8192,
        n_heads=64,
        n_kv_heads=64,
        d_ff=24576,
        vocab_size=152064,
    ),
    # microsoft/phi-2: not gated (fc1 -> gelu_new -> fc2), LayerNorm, and attention and MLP run
    # in parallel on one normed input (one norm per layer); partial rotary (40% of head_dim);
    # separate lm_head.
    "phi-2": ModelSpec(
        "phi-2",
        n_layers=32,
        d_model=2560,
        n_heads=32,
        n_kv_heads=32,
        d_ff=10240,
        vocab_size=51200,
        gated_mlp=False,
        parallel_attn_mlp=True,
    ),
}


def get_model(name: str) -> ModelSpec:
    """Exact lookup; `KeyError` naming the valid models for an unknown one."""
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownName(f"unknown model {quoted(name)}; valid names: {', '.join(sorted(MODELS))}") from None


if __name__ == "__main__":
    for spec in MODELS.values():
        print(f"{spec.name:12s} {spec.params / 1e9:6.2f}B params {spec.kv_bytes_per_token / 1024:7.1f} KiB KV/token")
