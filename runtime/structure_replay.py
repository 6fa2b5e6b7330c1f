"""Structure replay: run an engine on any model (a random 8B, say) but make it take, token by token,
the choices a reference trace recorded, so the forks, chunk lengths, register reuse, evictions and
plans (the *structure*) are the reference's while every forward pass is the new model's real one.

The cost of a pass does not depend on what the weights say; only the structure does. A randomly
initialised real-scale model left to itself emits random tags; replaying the structure of a trained
tiny model's trace gives a real-scale trace with realistic passes, KV and timing. Quality in such a
trace is not applicable (the text is the reference's, not the model's) and is never scored.

How each engine is driven (no engine code changes):
    sequential, tip     the model is wrapped so each pass's logits put all mass on the next
                        reference token (one sampled token per pass in both engines)
    pasta               `choose` takes, per stream, the reference token at that stream's next index
    planned_diffusion   `forced_plan`: the AR stream's tokens (plans, text after each sync); span
                        contents are still denoised by the model
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from profiler.errors import UsageError
from runtime.engines import GenerationConfig, get_engine
from runtime.tokenizer import Tokenizer

REPLAYABLE = ("sequential", "tip", "pasta", "planned_diffusion")


@dataclass
class Script:
    """One reference request: its prompt, all output ids in final order, and ids per stream."""

    request_id: int
    prompt: str
    answer: str
    output_ids: list[int]
    streams: dict[int, list[int]]


def read_scripts(trace_dir: str | Path) -> list[Script]:
    p = Path(trace_dir)
    return scripts_of(pd.read_parquet(p / "requests.parquet"), pd.read_parquet(p / "tokens.parquet"))


def scripts_of(requests: pd.DataFrame, tokens: pd.DataFrame) -> list[Script]:
    """One Script per request of a trace's requests and tokens tables."""
    reqs = requests.sort_values("request_id")
    toks = tokens.sort_values(["request_id", "token_index"])
    out = []
    for r in reqs.itertuples():
        t = toks[toks.request_id == r.request_id]
        streams = {int(s): g.token_id.astype(int).tolist() for s, g in t.groupby("stream", sort=True)}
        ref = getattr(r, "reference", None)  # a null read back from parquet is NaN (pandas >= 3), not None
        answer = "" if ref is None or pd.isna(ref) else str(ref)
        out.append(Script(int(r.request_id), str(r.prompt), answer, t.token_id.astype(int).tolist(), streams))
    return out


def check_token_ids(scripts: list[Script], width: int, source: str) -> None:
    """Every scripted token is an id the model can emit (0..width-1): a simulated trace's -1 or an
    id past a smaller vocabulary would be forced as garbage or fail in the embedding (IndexError)."""
    for sc in scripts:
        bad = next((t for t in sc.output_ids if not 0 <= t < width), None)
        if bad is not None:
            raise UsageError(
                f"--structure-from {source}: request {sc.request_id} has token id {bad}, "
                f"outside this model's 0..{width - 1} (replay a measured trace of a model with this vocabulary)"
            )


class ForcedLogits(nn.Module):
    """The real forward (K/V written, visibility applied), then logits forced to the script's next
    token (`fallback` once the script is spent). The one logits-forcing wrapper: structure replay,
    bench/pasta.py's same-answer decode and the TIP engine tests use it. With `keep_logits`,
    `own_logits` collects the model's own last-row logits of every pass (tests compare them)."""

    def __init__(
        self, model: nn.Module, fallback: int, script: list[int] | None = None, keep_logits: bool = False
    ) -> None:
        super().__init__()
        self.inner: Any = model  # any model behind the one primitive (TinyLM, the transformers adapter)
        self.fallback = fallback
        self.script: list[int] = list(script or [])
        self.i = 0
        self.cfg = model.cfg
        self.keep_logits = keep_logits
        self.own_logits: list[torch.Tensor] = []

    @property
    def embed(self):
        return self.inner.embed

    @property
    def kv_bytes_per_token(self) -> int:
        return self.inner.kv_bytes_per_token

    @property
    def supports_groups(self) -> bool:
        """A server may gather per request when the model inside can (`forward` passes `groups`)."""
        return getattr(self.inner, "supports_groups", False)

    def new_kv_store(self, *a, **kw):
        return self.inner.new_kv_store(*a, **kw)

    def num_parameters(self) -> int:
        return self.inner.num_parameters()

    def forward(self, *args, **kw):
        out = self.inner(*args, **kw)
        logits, attn = out if isinstance(out, tuple) else (out, None)
        if self.keep_logits:
            self.own_logits.append(logits[-1].detach().clone())
        t = self.script[self.i] if self.i < len(self.script) else self.fallback
        self.i += 1
        forced = torch.full_like(logits, -1e9)
        forced[:, t] = 0.0
        return (forced, attn) if attn is not None else forced


class Replayer:
    """`run(request, script)`: the engine's step generator, following `script`'s structure."""

    def __init__(self, system: str, model: nn.Module, tok: Tokenizer, config: GenerationConfig, **knobs) -> None:
        if system not in REPLAYABLE:
            raise ValueError(f"structure replay supports {', '.join(REPLAYABLE)}, not {system!r}")
        self.system, self.tok = system, tok
        cls: Any = get_engine(system)  # its model is TinyLM-like: the ForcedLogits wrapper, or an adapter
        if system in ("sequential", "tip"):
            self.forced = ForcedLogits(model, tok.eos_id)
            self.engine: Any = cls(self.forced, tok, config, **knobs)  # an Engine; `script` set on a ForcedPasta
        elif system == "pasta":
            self.engine = _forced_pasta(cls)(model, tok, config, **knobs)
        else:
            self.engine = cls(model, tok, config, **knobs)

    def run(self, request, script: Script):
        if self.system in ("sequential", "tip"):
            self.forced.script, self.forced.i = list(script.output_ids), 0
        elif self.system == "pasta":
            self.engine.script = script.streams
        else:
            ar = script.streams.get(0, [])
            text = self.tok.decode(ar)
            if self.tok.encode(text) != ar:
                raise ValueError(f"request {script.request_id}: the plan does not round-trip through the tokenizer")
            self.engine.forced_plan = text
        return self.engine.run(request)


def _forced_pasta(cls):
    from runtime.lang.pasta import ASYNC_END

    class ForcedPasta(cls):  # type: ignore[valid-type,misc]  # a class made from the engine class given
        script: dict[int, list[int]] = {}

        def choose(self, lay, sids, logits, sample):
            out = []
            for sid in sids:
                ref, n = self.script.get(sid, []), len(lay.streams[sid].outs)
                end = self.tok.eos_id if sid == 0 else self.tok.token_id(ASYNC_END)
                out.append(ref[n] if n < len(ref) else end)
            return out

    return ForcedPasta
