"""`solm train --system S`: train a system's tiny model with its recipe and write a checkpoint.

The shipped checkpoints under checkpoints/ are produced by exactly this command (each
checkpoint's config.json records the command, steps, loss and held-out quality).
"""

from __future__ import annotations

import argparse

from profiler.errors import UsageError
from profiler.outdir import claim_out_dir
from solm.commands import check_limits
from solm.jsonline import json_line

LIMITS = {  # flag: (attribute, lowest, highest); None (the recipe's own) passes
    "--steps": ("steps", 1, 10**7),
    "--batch-size": ("batch_size", 1, 4096),
    "--seed": ("seed", 0, 2**31 - 1),
    "--threads": ("threads", 0, 1024),  # 0: torch's default
}
MAX_LR = 1e3  # beyond this a float32 optimizer step overflows (was a RuntimeError from torch)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a system's tiny model and write a checkpoint")
    p.add_argument("--system", default="sequential")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--stage", default=None, help="a stage of the system's recipe (pasta: sft, preference, sequential)")
    p.add_argument("--init", default=None, help="start from this checkpoint (default: a fresh model)")
    p.add_argument(
        "--lambda",
        dest="lam",
        type=float,
        default=None,
        help="preference stage: weight of quality against speedup in the reward",
    )
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--force", action="store_true", help="replace --out if it holds a checkpoint")
    p.add_argument("--json", action="store_true")


def _recipe_and_config(args: argparse.Namespace):
    """The system's recipe (at --stage) and its training settings with the flags applied; UsageError if bad."""
    import dataclasses

    import torch

    from runtime.train.recipes import get_recipe

    check_limits(args, LIMITS)
    if args.lr is not None and not 0 < args.lr <= MAX_LR:  # also refuses NaN
        raise UsageError(f"--lr must be a number in (0, {MAX_LR:g}], got {args.lr}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.lam is not None and not args.stage:  # was: silently ignored
        raise UsageError(
            "--lambda weighs a preference stage's reward: give it with --stage (pasta: --stage preference)"
        )
    recipe = get_recipe(args.system)
    if args.stage:
        if not hasattr(recipe, "for_stage"):
            raise UsageError(f"--stage: the {args.system} recipe has no stages")
        recipe = recipe.for_stage(args.stage, lam=args.lam)
    overrides = {
        k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size), ("lr", args.lr)) if v is not None
    }
    if args.lam is not None and not abs(args.lam) < float("inf"):
        raise UsageError(f"--lambda must be a finite number, got {args.lam}")
    return recipe, dataclasses.replace(recipe.train, seed=args.seed, **overrides)


def _command(args: argparse.Namespace, cfg) -> str:
    """The `solm train` command that reproduces this checkpoint (recorded in its config.json)."""
    extra = "".join(
        f" {flag} {v}"
        for flag, v in (
            ("--stage", args.stage),
            ("--init", args.init),
            ("--lambda", args.lam),
            ("--threads", args.threads),
        )
        if v
    )
    return (
        f"solm train --system {args.system}{extra} --steps {cfg.steps} --batch-size {cfg.batch_size} --lr {cfg.lr} "
        f"--seed {args.seed} --out {args.out}"
    )


def _checkpoint_info(
    args: argparse.Namespace, recipe, cfg, log: dict, quality: dict, eval_system: str, t0: float
) -> dict:
    """The checkpoint's `info`: what was trained, how, for how long, and its held-out quality."""
    import dataclasses
    import time

    return {
        "system": args.system,
        "trained": True,
        "tasks": list(recipe.tasks),
        "preset": recipe.preset,
        "train": dataclasses.asdict(cfg),
        "final_loss": round(log["final_loss"], 4),
        "train_s": round(time.perf_counter() - t0, 1),
        "heldout_quality": {k: round(v, 4) for k, v in quality.items()},
        "command": _command(args, cfg),
        "eval_system": eval_system,
        **({"stage": args.stage} if args.stage else {}),
        **({"preference": recipe.extra["pairs"]} if "pairs" in getattr(recipe, "extra", {}) else {}),
    }


def run(args: argparse.Namespace) -> int:
    from runtime.checkpoint import is_transformers_spec, model_path

    recipe, cfg = _recipe_and_config(args)
    if args.init and is_transformers_spec(args.init):  # was: AttributeError, no forward_dense (exit 1)
        raise UsageError(
            f"--init {args.init}: solm train trains solm's own model (a checkpoint directory or a preset), "
            "not a transformers or GGUF model"
        )
    # checked, created and locked before hours of training; removed again if nothing was saved
    with claim_out_dir(args.out, [model_path(args.init) or ""], args.force, kinds=("checkpoint",)):
        return _train(args, recipe, cfg)


def _train(args: argparse.Namespace, recipe, cfg) -> int:
    import time

    from runtime.checkpoint import load_model, save_checkpoint
    from runtime.evaluate import evaluate
    from runtime.model import ModelConfig, TinyLM
    from runtime.tokenizer import Tokenizer
    from runtime.train.sft import loss_of, train

    tok = Tokenizer()
    if args.init:
        loaded, _ = load_model(args.init)
        if not isinstance(loaded, TinyLM):  # run() refused a transformers --init before claiming --out
            raise UsageError(f"--init {args.init}: not a solm model")
        model = loaded
    else:
        model = TinyLM(ModelConfig.from_name(recipe.preset), seed=args.seed)
    t0 = time.perf_counter()
    prepare = getattr(recipe, "prepare", None)  # recipes that build their data from the model (preference stages)
    sample, loss_fn = (
        prepare(model, tok, args.seed, not args.json) if prepare else (recipe.sampler(tok, args.seed), loss_of)
    )
    log = train(model, sample, cfg, tok.pad_id, progress=not args.json, loss_fn=loss_fn)
    save_checkpoint(model, args.out, {"system": args.system, "trained": True, "note": "saved before evaluation"})
    eval_system = recipe.extra.get("eval_system", args.system)
    quality = evaluate(model, tok, eval_system, recipe.tasks, recipe.eval_examples, recipe.max_tokens)
    info = _checkpoint_info(args, recipe, cfg, log, quality, eval_system, t0)
    save_checkpoint(model, args.out, info)
    if not args.json:
        print(
            f"trained {args.system} ({recipe.preset}, {model.num_parameters()} parameters) for {cfg.steps} steps "
            f"in {info['train_s']} s; final loss {info['final_loss']}; held-out quality {info['heldout_quality']} -> {args.out}"
        )
    print(json_line(result_line(args.system, args.out, info)))
    return 0


def result_line(system: str, out: str, info: dict) -> dict:
    """The JSON line `solm train` prints: loss, time and held-out quality of the checkpoint's `info`,
    and a preference stage's pair statistics (pairs, chosen structures, chosen / rejected quality,
    each structure's mean quality per task) as recorded in its config.json."""
    keys = ("final_loss", "train_s", "heldout_quality", "preference")
    return {"system": system, "out": out, **{k: info[k] for k in keys if k in info}}
