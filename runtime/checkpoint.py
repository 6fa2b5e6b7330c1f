"""Checkpoints: `model.safetensors` (weights, no pickle) + `config.json` (ModelConfig and how the
model was made). A checkpoint is a directory; `load_model` also accepts a preset name, which
gives a randomly initialised model (deterministic from `seed`).
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from profiler.errors import UsageError
from runtime.model import PRESETS, ModelConfig, TinyLM

if TYPE_CHECKING:  # the transformers adapter is an optional extra
    from runtime.hf_adapter import HFCausalLM

REPO_ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS_DIR = REPO_ROOT / "checkpoints"


def save_checkpoint(model: TinyLM, out_dir: str | Path, info: dict | None = None) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    doc = {"format": "solm-tinylm-v1", "config": model.cfg.to_dict(), "info": info or {}}
    (out / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return out


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple[TinyLM, dict]:
    """Model and the checkpoint's `info` dict. Clear errors (UsageError, one line) for a missing,
    foreign or corrupt directory, checked before the model is built: a config.json of the wrong
    shape, weights that are not safetensors or do not match the config's shapes."""
    p = Path(path)
    cfg_file, weights = p / "config.json", p / "model.safetensors"
    if not cfg_file.is_file() or not weights.is_file():
        raise FileNotFoundError(f"{p} is not a solm checkpoint (needs config.json and model.safetensors)")
    doc = _config_doc(cfg_file)
    if "config" not in doc:  # was: "unreadable checkpoint config ('config')", a KeyError's repr
        raise UsageError(f"{cfg_file}: not a solm checkpoint config (no 'config' key)")
    try:
        cfg = ModelConfig.from_dict(_checked_config(doc["config"]))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise UsageError(f"{cfg_file}: unreadable checkpoint config ({e})") from None
    _check_weights(weights, cfg, cfg_file)
    model = TinyLM(cfg)
    model.load_state_dict(load_file(str(weights)))
    bad = next((k for k, v in model.state_dict().items() if v.is_floating_point() and not v.isfinite().all()), None)
    if bad is not None:  # was: capture ran it, exit 0, every output garbage from NaN logits
        raise UsageError(f"{weights}: tensor {bad} holds NaN or infinite values (saved from a diverged run?)")
    info = doc.get("info", {})
    return model.to(device).eval(), info if isinstance(info, dict) else {}


MAX_CONFIG_INT = 1 << 20  # the largest dimension, layer count or vocabulary a checkpoint config may give
FLOAT32 = torch.finfo(torch.float32)  # the model computes in float32: its floats lie in float32's normal range
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # weights load_state_dict may cast to the model's float32


def _config_doc(cfg_file: Path) -> dict:
    """config.json as a dict: a regular file of sane size holding a JSON object (UsageError else)."""
    from profiler.reader import TraceError, load_json_file

    try:
        return load_json_file(cfg_file)
    except TraceError as e:
        raise UsageError(f"checkpoint config {e}") from None


def _checked_config(cfg: object) -> dict:
    """The config's integers are in 1..MAX_CONFIG_INT and its floats in float32's normal range (a
    NaN or a 10^12-wide layer would fail deep in torch, or try to allocate it; a rope_theta of
    1e-308 is 0 in float32 and every logit NaN)."""
    if not isinstance(cfg, dict):
        raise TypeError(f"'config' must be a JSON object, got {type(cfg).__name__}")
    for f in fields(ModelConfig):
        if f.name not in cfg or f.name == "name":
            continue
        v = cfg[f.name]
        kind = type(f.default)
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_CONFIG_INT):
            raise ValueError(f"{f.name} must be an integer in 1..{MAX_CONFIG_INT}, got {v!r}")
        if kind is float and (
            isinstance(v, bool) or not isinstance(v, int | float) or not FLOAT32.tiny <= v <= FLOAT32.max
        ):
            raise ValueError(
                f"{f.name} must be a number in [{FLOAT32.tiny:.3g}, {FLOAT32.max:.3g}] (float32), got {v!r}"
            )
    return cfg


def _check_weights(weights: Path, cfg: ModelConfig, cfg_file: Path) -> None:
    """The safetensors header names exactly the tensors, of the shapes, the config's model has
    (read from the header and a model built on the meta device: nothing is allocated)."""
    try:
        with safe_open(str(weights), "pt") as f:
            have = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise UsageError(f"{weights}: not a readable safetensors file ({str(e).splitlines()[0]})") from None
    bad = next((k for k in sorted(dtypes) if dtypes[k] not in FLOAT_DTYPES), None)
    if bad is not None:  # was: integers or booleans cast to float32 weights, capture exit 0 on garbage
        raise UsageError(f"{weights}: tensor {bad} is of dtype {dtypes[bad]}, not a float ({', '.join(FLOAT_DTYPES)})")
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in TinyLM(cfg).state_dict().items()}
    if have != want:
        diff = sorted(k for k in have.keys() | want.keys() if have.get(k) != want.get(k))
        raise UsageError(
            f"{weights} does not match {cfg_file}: {len(diff)} tensors differ in name or shape "
            f"(first {diff[0]}: {have.get(diff[0])} in the weights, {want.get(diff[0])} by the config)"
        )


def load_model(spec: str, device: str = "cpu", seed: int = 0) -> tuple[TinyLM | HFCausalLM, dict]:
    """`spec` is a checkpoint directory, a shipped checkpoint name, or a preset name; with the `hf`
    extra also `arch:NAME` (random weights, a real architecture) or a local transformers directory, and
    real pretrained weights from a GGUF file (`gguf:PATH`, `smollm2-135m`: `runtime.gguf`)."""
    from runtime.gguf import is_gguf_spec

    if is_gguf_spec(spec):
        from runtime.gguf import load_gguf

        return load_gguf(spec, device)
    if spec.startswith("arch:") or (Path(spec).is_dir() and _is_hf_dir(spec)):
        return _load_hf(spec, device, seed)
    if spec in PRESETS:
        return TinyLM(ModelConfig.from_name(spec), seed=seed).to(device).eval(), {"preset": spec, "trained": False}
    for cand in (Path(spec), CHECKPOINTS_DIR / spec):
        if cand.is_dir():
            return load_checkpoint(cand, device)
    shipped = sorted(d.name for d in CHECKPOINTS_DIR.iterdir() if d.is_dir()) if CHECKPOINTS_DIR.is_dir() else []
    raise FileNotFoundError(
        f"model {spec!r} is neither a checkpoint directory nor a preset "
        f"(presets: {', '.join(sorted(PRESETS))}; shipped: {', '.join(shipped) or 'none'})"
    )


def model_path(spec: str | None) -> Path | None:
    """The checkpoint directory or model file `spec` reads, as `load_model` finds it (a shipped
    name is a folder under checkpoints/), or None (a preset, a random architecture, nothing): the
    input an `--out` may not be, contain or lie inside."""
    if not spec:
        return None
    file = spec.removeprefix("gguf:")  # "gguf:" alone names no file (not the working directory)
    for cand in [Path(file)] * bool(file) + [CHECKPOINTS_DIR / spec]:
        if cand.exists():
            return cand
    return None


def is_transformers_spec(spec: str) -> bool:
    """Whether `load_model(spec)` gives a transformers model (`HFCausalLM`), not solm's TinyLM: a
    random architecture `arch:NAME`, a GGUF file or a local transformers directory."""
    from runtime.gguf import is_gguf_spec

    return is_gguf_spec(spec) or spec.startswith("arch:") or (Path(spec).is_dir() and _is_hf_dir(spec))


def _is_hf_dir(path: str) -> bool:
    from profiler.reader import TraceError, load_json_file

    try:  # a FIFO or a device as config.json is refused, not read (it would block)
        doc = load_json_file(Path(path) / "config.json")
    except TraceError:
        return False
    return "model_type" in doc and "format" not in doc


def _load_hf(spec: str, device: str, seed: int) -> tuple[HFCausalLM, dict]:
    """transformers models through `runtime.hf_adapter` (logits restricted to our tokenizer's ids)."""
    try:
        from runtime import hf_adapter
    except ImportError as e:
        raise UsageError(f"model {spec!r} needs transformers: {e}") from None
    from runtime.tokenizer import Tokenizer

    vocab = Tokenizer().vocab_size
    if spec.startswith("arch:"):
        name = spec.removeprefix("arch:")
        try:
            model = hf_adapter.build_arch(name, device, seed=seed, logits_vocab=vocab)
        except KeyError as e:
            raise FileNotFoundError(e.args[0]) from None
        return model, {"arch": name, "trained": False, "transformers": hf_adapter.transformers_version()}
    try:
        model = hf_adapter.load_hf_dir(spec, device, logits_vocab=vocab)
    except UsageError:  # the adapter's own checks name the file and the fault
        raise
    except (OSError, ValueError, KeyError) as e:  # transformers' own: no weights, an unknown model_type
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise UsageError(f"model {spec!r}: not a loadable transformers directory ({first})") from None
    return model, {
        "hf_dir": str(Path(spec).resolve()),
        "trained": True,
        "transformers": hf_adapter.transformers_version(),
    }
