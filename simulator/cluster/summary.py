"""The deployment lines of `solm simulate`'s summary: what each GPU holds, where a pass goes, SLOs, cost."""

from __future__ import annotations

GIB = 2**30


def _num(x, fmt: str = ".2f") -> str:
    return "n/a" if x is None else format(x, fmt)


def deployment_lines(f: dict) -> list[str]:
    """Human lines from the figures dict (the JSON line's keys)."""
    shape = f"tp {f['tp']} x pp {f['pp']}"
    if f.get("pp_schedule") == "interleave":
        shape += f" (interleaved: {f['micro_batches']} batches in flight)"
    elif f.get("pp_schedule") == "drain":
        shape += f" (drained: {f['micro_batches']} micro-batches a pass)"
    if f.get("disaggregate"):
        p, d = f["disaggregate"]
        shape = f"{p} prefill + {d} decode replicas of {shape}"
        if f.get("decode_hardware") and f["decode_hardware"] != f.get("hardware"):
            shape += f" (decode on {f['decode_hardware']})"
    elif f.get("replicas", 1) and f["replicas"] > 1:
        shape = f"{f['replicas']} replicas of {shape}, router {f['router']}"
    lines = [
        f"  deployment      {shape} = {f['gpus']} GPUs",
        (
            f"  per GPU         weights {f['weight_bytes_per_gpu'] / GIB:.1f} GiB + KV pool "
            f"{f['kv_pool_bytes_per_gpu'] / GIB:.1f} GiB of {f['usable_bytes_per_gpu'] / GIB:.1f} GiB usable "
            f"({f['kv_capacity_tokens']:,} KV tokens per replica)"
        ),
    ]
    if f.get("decode_weight_bytes_per_gpu") is not None and f.get("decode_hardware") != f.get("hardware"):
        lines.append(
            f"  decode per GPU  weights {f['decode_weight_bytes_per_gpu'] / GIB:.1f} GiB + KV pool "
            f"{f['decode_kv_pool_bytes_per_gpu'] / GIB:.1f} GiB on {f['decode_hardware']} "
            f"({f['decode_kv_capacity_tokens']:,} KV tokens per replica)"
        )
    if f["tp"] * f["pp"] > 1:
        lines.append(
            f"  comm share      {f['comm_share_percent']:.1f}% of pass time (all-reduce "
            f"{f['all_reduce_share_percent']:.1f}%, stage send/recv {f['send_recv_share_percent']:.1f}%), "
            f"pipeline bubble {f['pipeline_bubble_percent']:.1f}%"
        )
    if f.get("kv_transfers") is not None:
        lines.append(
            f"  KV transfer     {f['kv_transfers']} transfers, {f['kv_transfer_bytes'] / GIB:.2f} GiB, "
            f"mean {_num(f['mean_kv_transfer_ms'])} ms each"
        )
    slo = " and ".join(
        f"{k.upper()} <= {f[f'slo_{k}_ms']:g} ms" for k in ("ttft", "tpot") if f.get(f"slo_{k}_ms") is not None
    )
    if slo:
        lines.append(
            f"  goodput         {_num(f['request_goodput'])} req/s meet {slo} "
            f"({_num(f['slo_attained_percent'], '.1f')}% of requests)"
        )
    cost = (
        f"; ${f['cost_usd']:.2f}, ${f['cost_per_million_output_tokens']:.2f} per million output tokens"
        if f.get("cost_per_million_output_tokens") is not None
        else " (no --price-per-gpu-hour: not costed)"
    )
    lines.append(f"  GPU-hours       {f['gpu_hours']:.4f}{cost}")
    return lines
