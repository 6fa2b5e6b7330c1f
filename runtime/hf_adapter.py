"""`HFCausalLM`: a local transformers causal LM (Llama, Mistral, Qwen2, Qwen3, Gemma) behind the
runtime's one primitive

    forward(tokens, positions, slots, visibility, kv) -> logits

so every engine runs on real architectures unchanged. We drive the decoder ourselves, layer by
layer, with the HF modules' own weights and sub-modules (embedding, norms, rotary embedding, q/k/v/o
projections, Qwen3's q/k norms, MLP): explicit position ids, K/V written into and gathered from our
`PagedKVStore` (so eviction frees memory there), and an explicit (N, S) visibility mask. HF's
`generate()` cannot take a 4D mask or our slot-addressed cache, so it is never used.

Specs (no download, ever):
    arch:NAME   a randomly initialised model of a real architecture, from `runtime/hf_configs/NAME.json`
                (deterministic from `seed`; weights made directly on the target device)
    DIR         a local directory with an HF `config.json` (+ `*.safetensors`)

The engines speak the project's tokenizer (a few hundred ids). A real checkpoint's vocabulary is
larger; `logits_vocab` restricts the returned logits to the first ids so sampling stays inside the
project's vocabulary. The lm_head is still computed in full, so the cost of a pass is the real one.

transformers is optional (`pip install solm[hf]`); importing this module without it raises an
ImportError that says so.

Tensor legend as in `runtime.model`: N new tokens, H query heads, Hkv kv heads, D head dim,
S slot address space, M gathered slots, V vocab.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from profiler.errors import UnknownName
from runtime.attention import masked_sdpa, weighted_attention
from runtime.kv import PagedKVModel, PagedKVStore, attention_mask
from runtime.model import Group, grouped_attention

if TYPE_CHECKING:
    from runtime.hf_tokenizer import HFTokenizer

try:
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("the transformers adapter needs the optional extra: pip install 'solm[hf]'") from e

HF_CONFIGS_DIR = Path(__file__).resolve().parent / "hf_configs"
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def arch_names() -> list[str]:
    return sorted(p.stem for p in HF_CONFIGS_DIR.glob("*.json"))


@dataclass
class HFConfigView:
    """The fields of `runtime.model.ModelConfig` that engines, capture and the simulator read."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    max_positions: int
    model_type: str

    @classmethod
    def from_hf(cls, name: str, c) -> HFConfigView:
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(
            name=name,
            n_layers=c.num_hidden_layers,
            d_model=c.hidden_size,
            n_heads=c.num_attention_heads,
            n_kv_heads=c.num_key_value_heads or c.num_attention_heads,
            head_dim=head_dim,
            d_ff=c.intermediate_size,
            vocab_size=c.vocab_size,
            max_positions=c.max_position_embeddings,
            model_type=c.model_type,
        )

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class HFCausalLM(PagedKVModel, nn.Module):
    """Wraps an HF `*ForCausalLM`; same attributes and primitive as `TinyLM`."""

    supports_groups = True  # a server's per-request gather (attention="gather"), as TinyLM

    tokenizer: HFTokenizer | None = (
        None  # a GGUF model's own (runtime.gguf sets it; hf_tokenizer.tokenizer_for reads it)
    )

    def __init__(self, hf: Any, name: str = "", logits_vocab: int | None = None) -> None:
        super().__init__()
        mt = hf.config.model_type
        if mt not in SUPPORTED:
            raise ValueError(f"model_type {mt!r} is not supported by the adapter (supported: {', '.join(SUPPORTED)})")
        if logits_vocab is not None and hf.config.vocab_size < logits_vocab:
            raise ValueError(
                f"{name or mt}: vocab_size {hf.config.vocab_size} is smaller than the tokenizer's "
                f"{logits_vocab} ids (every id the engines may feed needs an embedding row)"
            )
        self.hf: Any = hf.eval()  # a transformers *ForCausalLM (typed loosely: nn.Module attribute lookups)
        self.cfg = HFConfigView.from_hf(name or mt, hf.config)
        self.logits_vocab = logits_vocab

    # ------------------------------------------------------------------ what engines read
    @property
    def embed(self) -> nn.Embedding:
        return self.hf.model.embed_tokens

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def meta_extra(self) -> dict:
        """Trace `model` fields beyond `capture.model_meta`'s, for `simulator.ModelSpec.from_trace_meta`:
        head_dim (Gemma-7B, Qwen3: != d_model / n_heads), tied embeddings, gated MLP (all families here)."""
        return {
            "head_dim": self.cfg.head_dim,
            "tied_embeddings": bool(getattr(self.hf.config, "tie_word_embeddings", False)),
            "gated_mlp": True,
            "model_type": self.cfg.model_type,
        }

    # ------------------------------------------------------------------ inference primitive
    def _attention(
        self,
        attn: Any,  # a transformers attention module
        layer: int,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor | None,  # None with groups
        kv: PagedKVStore,
        attn_sum: list[torch.Tensor] | None,
        attn_rows: torch.Tensor | None = None,
        groups: list[Group] | None = None,
    ) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # same rotate-half for all

        N, D = h.shape[1], self.cfg.head_dim
        q = attn.q_proj(h).view(1, N, -1, D)  # (1, N, H, D)
        k = attn.k_proj(h).view(1, N, -1, D)  # (1, N, Hkv, D)
        v = attn.v_proj(h).view(1, N, -1, D).transpose(1, 2)  # (1, Hkv, N, D)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over the head dim before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # (1, H|Hkv, N, D)
        kv.write(layer, slots, k[0].transpose(0, 1), v[0].transpose(0, 1))  # (N, Hkv, D)
        K, V = kv.keys_values(layer)  # (Hkv, S, D) views
        K, V = K[None].to(q.dtype), V[None].to(q.dtype)
        if groups is not None:  # each request's rows over its own gathered slots
            y = grouped_attention(q, K, V, groups, attn_sum, attn_rows, scale=attn.scaling)
        elif mask is None:
            raise ValueError("a pass without groups needs its mask")
        elif attn_sum is None:
            y = masked_sdpa(q, K, V, mask, attn.scaling)
        else:  # explicit softmax so the weights can be returned (H2O needs them)
            y, received = weighted_attention(q, K, V, mask, attn.scaling, attn_rows)
            attn_sum.append(received)  # (1, M)
        return attn.o_proj(y.transpose(1, 2).reshape(1, N, -1))  # (1, N, d)

    def forward_unchecked(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor | None,  # None with groups
        kv,
        attn_sum: list[torch.Tensor] | None = None,
        attn_rows: torch.Tensor | None = None,
        groups: list[Group] | None = None,
    ) -> torch.Tensor:
        """The decoder itself, on device tensors, with a ready (1, 1, N, S) bool mask (None with
        `groups`: each group's rows attend to its own slots) and no check and no host
        synchronisation (`runtime.static_decode` compiles it; `forward` checks first). `kv` needs
        `write(layer, slots, k, v)` and `keys_values(layer)`."""
        body = self.hf.model
        x = body.embed_tokens(tokens[None])  # (1, N, d); Gemma's embedding scales by sqrt(d) itself
        cos, sin = body.rotary_emb(x, positions[None])  # (1, N, D)
        for i, layer in enumerate(body.layers):
            x = x + self._attention(
                layer.self_attn, i, layer.input_layernorm(x), cos, sin, slots, mask, kv, attn_sum, attn_rows, groups
            )
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        h = body.norm(x)[0]  # (N, d)
        logits = self.hf.lm_head(h).float()  # (N, V)
        return logits[:, : self.logits_vocab] if self.logits_vocab is not None else logits

    @torch.no_grad()
    def forward(
        self,
        tokens: torch.Tensor,  # (N,) long
        positions: torch.Tensor,  # (N,) long
        slots: torch.Tensor,  # (N,) long
        visibility: torch.Tensor | None,  # (N, S) bool; None with `groups`
        kv: PagedKVStore,
        return_attention: bool = False,
        attention_rows: torch.Tensor | None = None,
        groups: list[Group] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (N, V) as float32 (V = `logits_vocab` when set); with `return_attention`, also the
        attention each slot received, summed over layers, heads and query rows (those
        `attention_rows` (N,) bool selects, if given): (S,). With `groups` (a server's per-request
        gather) `visibility` is None: each group's rows attend to its own gathered slots under its
        own mask (`runtime.model.grouped_attention`), as `TinyLM.forward`."""
        dev = self.device
        tokens, positions, slots = tokens.to(dev), positions.to(dev), slots.to(dev)
        N = tokens.shape[0]
        kv.check_slots(slots.tolist())  # the one device->host copy of the pass
        if groups is None and visibility is None:
            raise ValueError("a pass without groups needs its visibility")
        # (1, 1, N, S): keys are every slot of the store
        mask = attention_mask(visibility, N, kv, dev) if visibility is not None and groups is None else None
        S = kv.num_slots
        attn_sum: list[torch.Tensor] | None = [] if return_attention else None
        rows = None if attention_rows is None else attention_rows.to(dev)
        logits = self.forward_unchecked(tokens, positions, slots, mask, kv, attn_sum, rows, groups)
        if not return_attention:
            return logits
        per_slot = torch.zeros(S if visibility is None else max(S, visibility.shape[1]), device=dev)
        assert attn_sum is not None  # a list whenever return_attention
        per_slot[:S] = torch.stack(attn_sum).sum(0)[0]
        return logits, per_slot


# ---------------------------------------------------------------------- loading
def _init_random(hf: Any, seed: int) -> None:
    """Deterministic random init, on whatever device the (empty) parameters live on.

    Linear/embedding weights N(0, initializer_range), biases 0, norm weights at their identity
    (1, or 0 for Gemma's `1 + w` norms); buffers (rotary inv_freq, Gemma's embed scale) rebuilt.
    """
    std = getattr(hf.config, "initializer_range", 0.02) or 0.02
    dev = next(hf.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for mod in hf.modules():
            cls = type(mod).__name__
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                w = mod.weight
                w.copy_(torch.randn(w.shape, generator=g, device=dev, dtype=torch.float32).mul_(std).to(w.dtype))
                bias = getattr(mod, "bias", None)  # an Embedding has none, a Linear may
                if bias is not None:
                    bias.zero_()
            elif cls.endswith("RMSNorm") and getattr(mod, "weight", None) is not None:
                mod.weight.fill_(0.0 if cls.startswith("Gemma") else 1.0)
            if hasattr(mod, "scalar_embed_scale"):
                mod.embed_scale = torch.tensor(mod.scalar_embed_scale, device=dev)
    rot = hf.model.rotary_emb  # its inv_freq buffers were empty after `to_empty`: build afresh
    hf.model.rotary_emb = type(rot)(config=rot.config).to(dev)


def hf_config_from_file(path: Path):
    d = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(d.pop("model_type"), **d)


def build_arch(
    name: str, device: str = "cpu", seed: int = 0, dtype: torch.dtype | None = None, logits_vocab: int | None = None
) -> HFCausalLM:
    """A randomly initialised model of a named architecture (`runtime/hf_configs/NAME.json`)."""
    path = HF_CONFIGS_DIR / f"{name}.json"
    if name not in arch_names():  # was: arch:../hf_configs/tiny-llama read a file outside the catalog by its path
        raise UnknownName(f"unknown architecture {name!r}; valid: {', '.join(arch_names())}")
    cfg = hf_config_from_file(path)
    cfg._attn_implementation = "sdpa"
    dtype = dtype or (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    with torch.device("meta"):  # no CPU copy of an 8B model: materialise straight on the device
        hf = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    hf.to_empty(device=device)
    if getattr(cfg, "tie_word_embeddings", False):
        hf.lm_head.weight = hf.model.embed_tokens.weight
    _init_random(hf, seed)
    return HFCausalLM(hf, name=f"arch:{name}", logits_vocab=logits_vocab)


HF_INT_FIELDS = (  # a local directory's config.json sizes: positive integers when given
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
)
MAX_HF_INT = 1 << 24  # beyond every real model's size (vocabularies 256k, contexts 1M)


def load_hf_dir(
    path: str | Path, device: str = "cpu", dtype: torch.dtype | None = None, logits_vocab: int | None = None
) -> HFCausalLM:
    """A local HF checkpoint directory (config.json + safetensors); never touches the network.
    UsageError, before any weight is read, for a config of an unsupported model_type or bad sizes
    and for weights that miss a tensor of the config's model or hold one of another shape."""
    from transformers.utils import logging as hf_logging

    p = Path(path)
    cfg = _checked_hf_config(p)
    _check_hf_weights(p, cfg)
    dtype = dtype or (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    hf_logging.disable_progress_bar()  # its loading bar went to stderr before solm's own one line
    hf = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, local_files_only=True, attn_implementation="sdpa")
    bad = next((k for k, v in hf.state_dict().items() if v.is_floating_point() and not v.isfinite().all()), None)
    if bad is not None:  # was: exit 0, every output from NaN logits (as runtime.checkpoint refuses for solm's own)
        from profiler.errors import UsageError

        raise UsageError(f"{p}: tensor {bad} holds NaN or infinite values (saved from a diverged run?)")
    return HFCausalLM(hf.to(device), name=p.name, logits_vocab=logits_vocab)


def _checked_hf_config(p: Path):
    """The directory's config, read by transformers after solm's own checks of config.json (was:
    model_type gpt2 loaded a GPT-2 before the adapter refused it; hidden_size -1 or "4" a
    transformers validation error, exit 1)."""
    from huggingface_hub.errors import StrictDataclassError

    from profiler.errors import UsageError, quoted
    from profiler.reader import TraceError, load_json_file

    file = p / "config.json"
    try:
        doc = load_json_file(file)
    except TraceError as e:
        raise UsageError(f"transformers config {e}") from None
    mt = doc.get("model_type")
    if mt not in SUPPORTED:
        raise UsageError(f"{file}: model_type {quoted(mt)} is not supported by the adapter ({', '.join(SUPPORTED)})")
    for key in HF_INT_FIELDS:
        v = doc.get(key)
        if v is None:  # not given (or null): transformers' default, checked against the weights below
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_HF_INT:
            raise UsageError(f"{file}: {key} must be an integer in 1..{MAX_HF_INT}, got {quoted(v)}")
    rope = doc.get("rope_parameters")
    floats = {"rms_norm_eps": doc.get("rms_norm_eps"), "rope_theta": doc.get("rope_theta")}
    if isinstance(rope, dict):
        floats["rope_parameters.rope_theta"] = rope.get("rope_theta")
    for key, v in floats.items():  # was: rms_norm_eps NaN ran, exit 0, every output from NaN logits
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf):
            raise UsageError(f"{file}: {key} must be a finite number > 0, got {quoted(v)}")
    try:
        return AutoConfig.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise UsageError(f"{file}: not a usable {mt} config ({first})") from None


def _check_hf_weights(p: Path, cfg) -> None:
    """Every tensor of the config's model is in the directory's safetensors files, of its shape
    (compared on the meta device: nothing allocated). Was: a missing tensor randomly initialised
    with a warning (exit 0 on garbage), a shape of another hidden_size a RuntimeError (exit 1)."""
    from safetensors import SafetensorError, safe_open

    from profiler.errors import UsageError

    files = sorted(p.glob("*.safetensors"))
    if not files:  # no weights at all: transformers' own OSError says so, and load_model catches it
        return
    have: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), "pt") as st:
                have.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})
        except (SafetensorError, OSError) as e:
            raise UsageError(f"{f}: not a readable safetensors file ({str(e).splitlines()[0]})") from None
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(cfg).state_dict().items()}
    if getattr(cfg, "tie_word_embeddings", False):
        want.pop("lm_head.weight", None)  # the embedding's, not stored
    diff = sorted(k for k in want if have.get(k) != want[k])
    if diff:
        raise UsageError(
            f"{p}: weights do not match config.json: {len(diff)} tensors missing or of another shape "
            f"(first {diff[0]}: {have.get(diff[0])} in the weights, {want[diff[0]]} by the config)"
        )


def transformers_version() -> str:
    return transformers.__version__
