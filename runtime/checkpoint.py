"""Checkpoints: `model.safetensors` (weights, no pickle) + `config.json` (ModelConfig and how the
model was made). A checkpoint is a directory; `load_model` also accepts a preset name, which
gives a randomly initialised model (deterministic from `seed`).
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from profiler.errors import UsageError
from runtime.model import PRESETS, ModelConfig, TinyLM

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
    """Model and the checkpoint's `info` dict. Clear errors for a missing or foreign directory."""
    p = Path(path)
    cfg_file, weights = p / "config.json", p / "model.safetensors"
    if not cfg_file.is_file() or not weights.is_file():
        raise FileNotFoundError(f"{p} is not a solm checkpoint (needs config.json and model.safetensors)")
    try:
        doc = json.loads(cfg_file.read_text())
        cfg = ModelConfig.from_dict(doc["config"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UsageError(f"{cfg_file}: unreadable checkpoint config ({e})") from None
    model = TinyLM(cfg)
    model.load_state_dict(load_file(str(weights)))
    return model.to(device).eval(), doc.get("info", {})


def load_model(spec: str, device: str = "cpu", seed: int = 0) -> tuple[TinyLM, dict]:
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


def _is_hf_dir(path: str) -> bool:
    try:
        doc = json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return "model_type" in doc and "format" not in doc


def _load_hf(spec: str, device: str, seed: int) -> tuple[TinyLM, dict]:
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
    model = hf_adapter.load_hf_dir(spec, device, logits_vocab=vocab)
    return model, {
        "hf_dir": str(Path(spec).resolve()),
        "trained": True,
        "transformers": hf_adapter.transformers_version(),
    }
