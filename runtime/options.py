"""The names `solm capture` offers in its flags, importable without torch: the CLI builds every
command's parser at start, and importing the engines for their names took about 3 s of every
command's start, `solm inspect --help` included."""

from __future__ import annotations

from runtime.registry import available

# Engines by name (plain string keys, "module:class"; each system adds one line); runtime.engines
# resolves them.
ENGINES: dict[str, str] = {
    "sequential": "runtime.engines.sequential:SequentialEngine",
    "pasta": "runtime.engines.pasta:PastaEngine",
    "skeleton": "runtime.engines.skeleton:SkeletonEngine",
    "tip": "runtime.engines.tip:TipEngine",
    "planned_diffusion": "runtime.engines.planned_diffusion:PlannedDiffusionEngine",
    "masked_diffusion": "runtime.engines.masked_diffusion:MaskedDiffusionEngine",
    "sot": "runtime.engines.sot:SotEngine",  # prompted Skeleton-of-Thought on a real chat model
}

# which of a request's repeated runs (--repeats) is recorded: index into its n runs sorted by latency
# (median of an even n: the faster middle run, since the recorded run must be one that ran)
KEEP = {"min": lambda n: 0, "median": lambda n: (n - 1) // 2}

# how the masked attention runs (runtime/attention.py, SOLM_SDPA or --sdpa); the first is the default
SDPA_STRATEGIES: tuple[str, ...] = ("default", "auto", "bucket", "efficient", "no-cudnn", "math")


def systems() -> list[str]:
    return available(ENGINES)
