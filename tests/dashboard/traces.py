"""Hand-built traces with round numbers, written with `profiler.writer.write_trace`.

`make_trace(out, e2e_s=[1.0, 2.0], threads=[0, 2])`: request r takes e2e_s[r] seconds split evenly
over its passes (one prefill, then decode); with threads[r] = k > 0 the request is PASTA-shaped:
a main stream and k async threads decoded in the same passes (k + 1 query rows, k + 1 tokens per
pass) and a graph prompt -> main:0 -> thread:1..k -> main:1. Counters: `counters` host or NVML
samples every 0.5 s with known values.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from profiler.writer import table_from_rows, write_trace

PROMPTS = ("reverse: abc,de", "reverse: fgh,ij,kl", "reverse: mno", "reverse: pq,rs,tu,vw")


def _graph(prompt_tokens: int, out_tokens: int, k: int) -> dict:
    if k == 0:
        nodes = [
            {"id": "prompt", "kind": "prompt", "stream": -1, "tokens": prompt_tokens},
            {"id": "main:0", "kind": "main", "stream": 0, "tokens": out_tokens},
        ]
        links = [{"source": "prompt", "target": "main:0"}]
    else:
        per = out_tokens // (k + 2)
        nodes = [
            {"id": "prompt", "kind": "prompt", "stream": -1, "tokens": prompt_tokens},
            {"id": "main:0", "kind": "main", "stream": 0, "tokens": per},
        ]
        links = [{"source": "prompt", "target": "main:0"}]
        for t in range(1, k + 1):
            nodes.append({"id": f"thread:{t}", "kind": "async", "stream": t, "tokens": per})
            links += [{"source": "main:0", "target": f"thread:{t}"}, {"source": f"thread:{t}", "target": "main:1"}]
        nodes.append({"id": "main:1", "kind": "main", "stream": 0, "tokens": out_tokens - per * (k + 1)})
    return {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "links": links}


def make_trace(
    out: str | Path,
    e2e_s: list[float],
    threads: list[int] | None = None,
    system: str = "sequential",
    kind: str = "measured",
    passes: int = 4,
    counters: str | None = "host",
    quality: float = 0.5,
    prompts: tuple[str, ...] = PROMPTS,
    first_id: int = 0,
    schema_version: int = 1,
) -> Path:
    threads = threads or [0] * len(e2e_s)
    req, steps, toks, graphs = [], [], [], {}
    clock = 0.0
    batch = 0
    for i, (e2e, k) in enumerate(zip(e2e_s, threads)):
        rid = first_id + i
        rows = k + 1
        prompt_tokens = 5 + i
        out_tokens = passes * rows
        dur = e2e / passes
        live = prompt_tokens
        for s in range(passes):
            q = prompt_tokens if s == 0 else rows
            streams = "0" if s == 0 else ",".join(str(x) for x in range(rows))
            live += rows if s else 1
            steps.append(
                {
                    "request_id": rid,
                    "step_index": s,
                    "batch_index": batch,
                    "phase": "prefill" if s == 0 else "decode",
                    "start_s": clock + s * dur,
                    "duration_s": dur,
                    "streams": streams,
                    "active_streams": 1 if s == 0 else rows,
                    "query_tokens": q,
                    "kv_tokens_read": q * live,
                    "live_kv_tokens": live,
                    "kv_bytes_allocated": 1024 * math.ceil(live / 4),
                    "emitted_tokens": 1 if s == 0 else rows,
                    "evicted_tokens": 0,
                    "freed_kv_bytes": 0,
                    "device_memory_bytes": -1,
                    "note": "",
                }
            )
            batch += 1
        for t in range(out_tokens):
            toks.append(
                {
                    "request_id": rid,
                    "token_index": t,
                    "token_id": 100 + (t + i) % 7,
                    "token_text": "abcdefg"[(t + i) % 7],
                    "stream": t % rows,
                    "step_index": min(t // rows, passes - 1),
                    "position_id": prompt_tokens + t,
                    "kv_slot": prompt_tokens + t,
                    "kind": "content",
                    "visible_streams": [-1, t % rows],
                    "evicted_at_step": -1,
                }
            )
        req.append(
            {
                "request_id": rid,
                "prompt": prompts[i % len(prompts)] + (f" #{i}" if i >= len(prompts) else ""),
                "reference": "",
                "prompt_tokens": prompt_tokens,
                "output_tokens": out_tokens,
                "output_text": "".join("abcdefg"[(t + i) % 7] for t in range(out_tokens)),
                "quality_score": quality,
                "arrival_s": clock,
                "start_s": clock,
                "ttft_s": dur,
                "e2e_s": e2e,
                "steps": passes,
                "critical_path_tokens": out_tokens // rows,
                "theoretical_speedup": float(rows),
                "peak_live_kv_tokens": live,
                "peak_kv_bytes": 1024 * math.ceil(live / 4),
                "status": "ok",
                "stop_reason": "eos",
                "error": "",
                "events": "[]",
            }
        )
        graphs[rid] = _graph(prompt_tokens, out_tokens, k)
        clock += e2e
    crow = []
    if counters:
        n = max(2, int(clock / 0.5) + 1)
        for j in range(n):
            nvml = counters == "nvml"
            crow.append(
                {
                    "t_s": 0.5 * j,
                    "source": counters,
                    "gpu_memory_used_bytes": 1e9 + 1e6 * j if nvml else float("nan"),
                    "gpu_utilization_percent": 50.0 + j if nvml else float("nan"),
                    "power_w": 100.0 + 10 * j if nvml else float("nan"),
                    "energy_mj": 50_000.0 * j if nvml else float("nan"),
                    "sm_clock_mhz": 1400.0 if nvml else float("nan"),
                    "temperature_c": 60.0 + j if nvml else float("nan"),
                    "cpu_percent": 40.0 + j,
                    "rss_bytes": 3e8 + 1e6 * j,
                }
            )
    meta = {
        "kind": kind,
        "system": system,
        "knobs": {"max_tokens": 64},
        "task": "reverse_words",
        "split": "test",
        "seed": 0,
        "model": {
            "name": "tiny-2l",
            "preset": "tiny-2l",
            "n_layers": 2,
            "d_model": 128,
            "n_heads": 4,
            "n_kv_heads": 2,
            "d_ff": 352,
            "vocab_size": 311,
            "dtype": "float32",
            "dtype_bytes": 4,
            "params": 500000,
            "kv_bytes_per_token": 1024,
            "trained": False,
        },
        "device": {"name": "test cpu", "type": "cpu"},
        "counters_source": counters or "host",
        "nvml": counters == "nvml",
        "created_at": "2026-01-01T00:00:00+00:00",
    }
    tables = {
        "requests": table_from_rows("requests", req),
        "steps": table_from_rows("steps", steps),
        "tokens": table_from_rows("tokens", toks),
        "counters": table_from_rows("counters", crow),
    }
    path = write_trace(out, meta, tables, graphs)
    if schema_version != 1:
        m = json.loads((path / "meta.json").read_text())
        m["schema_version"] = schema_version
        (path / "meta.json").write_text(json.dumps(m))
    return path
