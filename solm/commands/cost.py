"""`solm cost`: predicted per-layer time of each operator of one forward pass.

What: for a catalog model on a catalog part, the simulator's cost model (`simulator.cost`) with
the A100-calibrated parameters (shipped in `simulator/data/a100_calibration.json`) predicts the
time of every operator of one layer for each requested token count, plus the whole pass. On a
GPU the GEMMs come from the tile-and-wave model (`simulator.gemm`: output tiles in waves over the
part's SMs, per-tile efficiencies fitted once on the A100, docs/cost_model.md); the other ops
from a roofline per op family, carried to other parts by their efficiency priors.
Why: the quickest way to see where a forward pass goes and how a part or model changes it,
without a trace.

    solm cost --model llama-3-8b --hardware a100-80g --tokens 1,512,4096
    solm cost --model llama-3-70b --hardware h100-sxm --tp 4 --tokens 32 --kv-tokens 4096 \\
        --groups 32 --json
    solm cost --model llama-3-8b --hardware h200 --calibrate-from traces/gpu-h200/sequential
    solm cost --model llama-3-70b --hardware h100-sxm --set num_sms=160 --tokens 512
    solm cost --model llama-3-8b --hardware h100-sxm --tokens 1,300,4096 --explain

`--set FIELD=VALUE` answers "what if this part had ...": the part's catalog fields (as `solm
simulate --set`); changing `num_sms` (or the clock) scales the tensor peak with it. An unknown
field is one error line, exit 2.

`--comm all_reduce,send_recv --workers 2,4,8 --bytes 4096,1048576` (no `--model` needed) times
collective calls within one node instead (`simulator.comm`, calibrated on the A100 collectives)
and prints {"comm": [{"collective", "workers", "bytes", "time_ms"}, ...]}; `--topology` picks the
node's topology (nvswitch, nvlink_pairs, pcie, mesh) instead of the part's own (also for the
all-reduces of `--tp` 2 or more). A flag the mode would ignore is refused: the forward-pass flags
(`--model`, `--tokens`, `--tp`, `--explain`, ...) with `--comm`, `--workers`/`--bytes` without it.

`--calibrate-from TRACE` fits the efficiencies and the per-pass overhead to the measured passes of
a trace captured on that part (a trace the catalog places on another part, or a CPU trace for a GPU
part, is refused) (`simulator.calibrate.fit_cost_params_to_steps`, the fit `solm
validate` uses) and predicts with those instead.

`--explain` adds, per GEMM and token count, the kernel the tile-and-wave model chose (tile shape,
split-K, tiles, waves) and whether it is compute-, memory-, wave- (quantization) or launch-bound.

Query rows see `--kv-tokens` KV slots each (kv_tokens_read = tokens x K); without it each pass
is a causal prefill from empty (row i sees i + 1 slots). `--groups G` says the rows come from G
independent streams (G sequences decoding one token each: `--tokens G --groups G`).
Output: a table, then one JSON line {"model", "hardware", "tensor_parallel", "calibration",
"ops": [{"num_tokens", "kv_tokens_read", "op", "time_ms"}], "steps": [...]} (with --explain,
"explain": [{"num_tokens", "op", "k", "n", "tile", "split", "tiles", "waves", "kernel_ms",
"bound"}]); `--json` prints only the JSON line. Bad input: one line on stderr, exit 2 (a token count
over 2^20, a 1M-token context; a `--bytes` buffer over the part's memory; a value listed twice).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from profiler.errors import UsageError, error_line, quoted
from simulator.cost import LAYER_OPS, CostModel
from simulator.hardware import HARDWARE, get_hardware
from simulator.models import MODELS, get_model
from simulator.workload import MAX_CONTEXT_TOKENS
from solm.commands import check_listed_once
from solm.jsonline import json_line

PROG = "solm cost"
CONTEXT = " (a 1M-token context, simulator.workload.MAX_CONTEXT_TOKENS)"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `cost` on the top-level CLI's subparsers."""
    parser = subparsers.add_parser(
        "cost",
        help="predicted per-layer time of each op of a forward pass",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--model", default=None, help=f"catalog model: {', '.join(sorted(MODELS))} (required without --comm)"
    )
    parser.add_argument("--hardware", required=True, help=f"catalog part: {', '.join(sorted(HARDWARE))}")
    parser.add_argument(
        "--tokens", default=None, help="comma-separated query token counts of one pass (default 1,512,4096)"
    )
    parser.add_argument(
        "--kv-tokens", type=str, default=None, help="KV slots each query row sees (default: causal prefill from empty)"
    )
    parser.add_argument("--groups", type=str, default=None, help="independent query streams in the pass (default 1)")
    parser.add_argument("--tp", type=str, default=None, help="tensor-parallel degree (default 1)")
    parser.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="override a field of the part, e.g. num_sms=160 (the tensor peak "
        "scales with the SMs) or hbm_bytes_per_s=6e12 (repeatable)",
    )
    parser.add_argument(
        "--gemm-calibration",
        default=None,
        metavar="CAL.json",
        help="GEMM tile-model parameters fitted on the part's own measured GEMMs (solm calibrate)",
    )
    parser.add_argument(
        "--calibrate-from",
        default=None,
        metavar="TRACE",
        help="fit the efficiencies and per-pass overhead to a measured trace's passes "
        "(captured on --hardware) instead of the shipped A100 calibration",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="per GEMM and token count: the chosen tile, split-K, tiles, waves "
        "and whether it is compute-, memory-, wave- or launch-bound",
    )
    parser.add_argument(
        "--comm",
        default=None,
        metavar="COLLECTIVES",
        help="time collectives instead: comma-separated all_reduce, all_gather, send_recv",
    )
    parser.add_argument("--workers", default=None, help="with --comm: GPUs per call (default 2,4,8)")
    parser.add_argument(
        "--bytes",
        default=None,
        help="with --comm: buffer bytes per GPU (default 4096,1048576,67108864)",
    )
    parser.add_argument(
        "--topology",
        default=None,
        help="node topology instead of the part's: nvswitch, nvlink_pairs, pcie, mesh (with --comm or --tp 2+)",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.set_defaults(func=run)
    return parser


def _int(text: str, flag: str, minimum: int, maximum: int | None = None, why: str = CONTEXT) -> int:
    try:
        value = int(text.strip())
    except (ValueError, AttributeError):
        raise UsageError(f"{flag} must be an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{flag} must be an integer >= {minimum}, got {value}")
    _check_at_most(value, flag, maximum, why)
    return value


def _check_at_most(value: int, flag: str, maximum: int | None, why: str = CONTEXT) -> None:
    if maximum is not None and value > maximum:  # was: 1e20 tokens, kv_tokens_read 5e39, a pass of 1e15 ms
        raise UsageError(f"{flag} must be at most {maximum}{why}, got {value}")


def _parse_tokens(text: str) -> list[int]:
    parts = [part for part in str(text).split(",") if part.strip()]
    if not parts:
        raise UsageError(f"--tokens must be comma-separated positive integers, got {quoted(text)}")
    try:
        tokens = [_int(part, "--tokens", 1) for part in parts]
    except UsageError:
        raise UsageError(f"--tokens must be comma-separated positive integers, got {quoted(text)}") from None
    check_listed_once(tokens, "--tokens", text)
    for n in tokens:  # after the parse: its own message, not the malformed list's
        _check_at_most(n, "--tokens", MAX_CONTEXT_TOKENS)
    return tokens


def _lookup(kind: str, name: str) -> Any:
    try:
        return get_model(name) if kind == "model" else get_hardware(name)
    except KeyError as error:
        raise UsageError(str(error.args[0])) from None


def _fit_to_trace(path: str, hardware: Any, part: str) -> Any:
    """Cost parameters fitted to every forward pass of a measured trace (its own model's shapes)."""
    from profiler.reader import TraceError
    from profiler.validate import read_valid_trace
    from simulator.calibrate import fit_cost_params_to_steps
    from simulator.models import ModelSpec
    from simulator.validation import step_arrays

    try:
        trace = read_valid_trace(path)
    except TraceError as error:
        raise UsageError(str(error)) from None
    if trace.kind != "measured":
        raise UsageError(f"--calibrate-from needs a measured trace, {path} is {trace.kind}")
    _check_captured_on(trace, path, part)
    rows = step_arrays(trace)
    if len(rows) < 4:
        raise UsageError(f"--calibrate-from: {path} has {len(rows)} forward passes; need >= 4")
    params = fit_cost_params_to_steps(hardware, ModelSpec.from_trace_meta(trace.meta), rows)
    return dataclasses.replace(params, source=f"{params.source} ({path})")


def _check_captured_on(trace: Any, path: str, part: str) -> None:
    """UsageError when the trace ran on another device than the catalog part `part` (a CPU trace for a
    GPU part, or another GPU): its passes' times are not that part's (was: llama-3-8b on h100-sxm
    fitted to a CPU capture, 4.7 s a one-token pass). A device the catalog cannot name is let through."""
    from profiler.errors import UnknownName
    from simulator.validation import trace_hardware

    try:
        origin = trace_hardware(trace.meta)
    except UnknownName:
        return
    target = HARDWARE[part]
    if origin.kind != target.kind or (origin.kind == "gpu" and origin.name != part):
        device = (trace.meta.get("device") or {}).get("name") or origin.name
        raise UsageError(
            f"--calibrate-from {path} was captured on {device}, not on {part}: its passes time another device "
            f"(give --hardware {origin.name if origin.kind == 'gpu' else 'host-cpu'})"
        )


def _int_list(text: str, flag: str, minimum: int, maximum: int | None = None, why: str = "") -> list[int]:
    parts = [part for part in str(text).split(",") if part.strip()]
    if not parts:
        raise UsageError(f"{flag} must be comma-separated integers >= {minimum}, got {text!r}")
    values = [_int(part, flag, minimum, maximum, why) for part in parts]
    check_listed_once(values, flag, text)
    return values


def _hardware(args: argparse.Namespace) -> Any:
    """The catalog part, with `--set FIELD=VALUE` overrides and `--topology` applied (UsageError if invalid)."""
    from simulator.hardware import override
    from solm.commands.simulate import parse_set

    hardware = _lookup("hardware", args.hardware)
    try:
        fields = parse_set(getattr(args, "set", None))
        if fields:
            hardware = override(hardware.name, **fields)
        if getattr(args, "topology", None):
            hardware = dataclasses.replace(hardware, topology=args.topology)
    except (ValueError, TypeError) as error:
        raise UsageError(f"--set/--topology: {error}") from None
    if getattr(args, "gemm_calibration", None):
        from simulator.gemm_calibration import with_gemm_calibration

        hardware = with_gemm_calibration(hardware, args.gemm_calibration)
    return hardware


def predict_comm(args: argparse.Namespace) -> dict[str, Any]:
    """`--comm`: one row per (collective, workers, bytes), within one node."""
    from simulator.comm import COLLECTIVES, collective_time_s

    hardware = _hardware(args)
    collectives = [c.strip() for c in args.comm.split(",") if c.strip()]
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown or not collectives:
        raise UsageError(f"--comm takes {', '.join(COLLECTIVES)}; got {args.comm!r}")
    workers = _int_list(_given(args.workers, "2,4,8"), "--workers", 1)
    # a buffer on each GPU fits in its memory (was: 1e23 bytes, a call of 7 years)
    memory = int(hardware.hbm_capacity_bytes)
    sizes = _int_list(_given(args.bytes, "4096,1048576,67108864"), "--bytes", 0, memory, f" ({hardware.name}'s memory)")
    too_many = [n for n in workers if n > hardware.gpus_per_node]
    if too_many:
        raise UsageError(
            f"--workers {too_many[0]} exceeds {hardware.name}'s {hardware.gpus_per_node} GPUs per node "
            f"(--comm times calls within one node)"
        )
    rows = []
    for collective in collectives:
        for n in workers:
            for size in sizes:
                rows.append(
                    {
                        "collective": collective,
                        "workers": n,
                        "bytes": size,
                        "time_ms": float(collective_time_s(collective, size, n, hardware)) * 1e3,
                    }
                )
    return {"hardware": hardware.name, "topology": hardware.topology, "comm": rows}


def _comm_table(result: dict[str, Any]) -> str:
    lines = [
        f"collectives on {result['hardware']} ({result['topology']}, within one node; simulator.comm)",
        f"{'collective':12s}{'workers':>8s}{'bytes':>12s}{'time ms':>12s}{'GB/s (bus)':>12s}",
    ]
    for row in result["comm"]:
        from simulator.comm import traffic_bytes

        traffic = traffic_bytes(row["collective"], row["bytes"], row["workers"])
        # one worker moves nothing in no time: its bus bandwidth is undefined (was printed as nan)
        bus = f"{traffic / (row['time_ms'] * 1e-3) / 1e9:12.1f}" if row["time_ms"] > 0 else f"{'n/a':>12s}"
        lines.append(f"{row['collective']:12s}{row['workers']:8d}{row['bytes']:12d}{row['time_ms']:12.4f}{bus}")
    return "\n".join(lines)


def predict(args: argparse.Namespace) -> dict[str, Any]:
    """The command's figures as a JSON-ready dict (UsageError for bad input)."""
    if args.model is None:
        raise UsageError("--model is required (or time collectives with --comm)")
    model = _lookup("model", args.model)
    hardware = _hardware(args)
    tokens = _parse_tokens(_given(args.tokens, "1,512,4096"))
    kv_per_row = None if args.kv_tokens is None else _int(args.kv_tokens, "--kv-tokens", 0, MAX_CONTEXT_TOKENS)
    groups = _int(_given(args.groups, "1"), "--groups", 1)
    tp = _int(_given(args.tp, "1"), "--tp", 1)
    if tp == 1 and args.topology:  # was: accepted, and one GPU has no links to cross
        raise UsageError("--topology applies to collectives: give --tp 2 or more, or --comm")
    if tp > 1 and model.n_heads % tp:
        raise UsageError(f"--tp {tp} does not divide {model.name}'s {model.n_heads} heads")
    params = None if args.calibrate_from is None else _fit_to_trace(args.calibrate_from, hardware, args.hardware)
    cost = CostModel(hardware, model, params, tensor_parallel=tp)
    ops: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for n in tokens:
        kv = n * (n + 1) // 2 if kv_per_row is None else n * kv_per_row
        query_groups = min(groups, n)
        for op, time_s in cost.op_times_s(n, kv, query_groups).items():
            ops.append({"num_tokens": n, "kv_tokens_read": kv, "op": op, "time_ms": float(time_s) * 1e3})
        steps.append(
            {
                "num_tokens": n,
                "kv_tokens_read": kv,
                "query_groups": query_groups,
                "step_time_ms": float(cost.step_time_s(n, kv, query_groups)) * 1e3,
                "bound": cost.bound(n, kv, query_groups),
            }
        )
    result = {
        "model": model.name,
        "hardware": hardware.name,
        "tensor_parallel": tp,
        "n_layers": model.n_layers,
        "calibration": cost.params.source,
        "ops": ops,
        "steps": steps,
    }
    if getattr(args, "explain", False):
        result["explain"] = explain(cost, tokens)
    return result


def explain(cost: CostModel, tokens: list[int]) -> list[dict[str, Any]]:
    """Why each GEMM takes its time: the kernel the tile model chose (or the roofline's bound)."""
    from simulator.cost import GEMM_OPS, gemm_shapes
    from simulator.gemm import bound

    shapes = gemm_shapes(cost.model, cost.tensor_parallel)
    rows: list[dict[str, Any]] = []
    for n in tokens:
        for op in GEMM_OPS:
            k, width = shapes[op]
            row: dict[str, Any] = {"num_tokens": n, "op": op, "k": int(k), "n": int(width)}
            if cost.uses_tiles:
                kernel = cost.gemm_kernel(op, n)
                row.update(
                    tile=kernel.tile[0],
                    split=int(kernel.split),
                    tiles=int(kernel.tiles),
                    waves=int(kernel.waves),
                    kernel_ms=kernel.time_s * 1e3,
                    bound=bound(kernel),
                )
            else:
                row.update(tile=None, bound="roofline (no tile model for this part)")
            rows.append(row)
    return rows


def _explain_table(result: dict[str, Any]) -> str:
    lines = [
        f"why (GEMM kernels on {result['hardware']}, {result['model']} shard of tp {result['tensor_parallel']}):",
        f"{'tokens':>7s} {'op':15s} {'K x N':>13s} {'tile':>15s} {'split':>5s} "
        f"{'tiles':>6s} {'waves':>5s} {'ms':>9s}  bound",
    ]
    for row in result["explain"]:
        shape = f"{row['k']}x{row['n']}"
        if row["tile"] is None:
            lines.append(f"{row['num_tokens']:7d} {row['op']:15s} {shape:>13s}  {row['bound']}")
            continue
        lines.append(
            f"{row['num_tokens']:7d} {row['op']:15s} {shape:>13s} {row['tile']:>15s} "
            f"{row['split']:5d} {row['tiles']:6d} {row['waves']:5d} "
            f"{row['kernel_ms']:9.4f}  {row['bound']}"
        )
    return "\n".join(lines)


def _table(result: dict[str, Any]) -> str:
    tokens = [step["num_tokens"] for step in result["steps"]]
    time_ms = {(row["op"], row["num_tokens"]): row["time_ms"] for row in result["ops"]}
    ops = [op for op in (*LAYER_OPS, "all_reduce") if (op, tokens[0]) in time_ms]
    width = max(10, *(len(f"n={n}") for n in tokens))
    header = f"{'op (ms per layer)':26s}" + "".join(f"{f'n={n}':>{width + 2}s}" for n in tokens)
    lines = [
        f"{result['model']} on {result['hardware']} (tp {result['tensor_parallel']}), "
        f"efficiencies: {result['calibration']}",
        header,
        "-" * len(header),
    ]
    for op in ops:
        lines.append(f"{op:26s}" + "".join(f"{time_ms[op, n]:{width + 2}.4f}" for n in tokens))
    lines.append("-" * len(header))
    layer_ms = {n: sum(time_ms[op, n] for op in ops) for n in tokens}
    lines.append(f"{'layer total':26s}" + "".join(f"{layer_ms[n]:{width + 2}.4f}" for n in tokens))
    lines.append(
        f"{'pass total (+ emb, lm_head)':26s}"
        + "".join(f"{step['step_time_ms']:{width + 2}.3f}" for step in result["steps"])
    )
    lines.append(
        f"{'kv_tokens_read':26s}" + "".join(f"{step['kv_tokens_read']:{width + 2}d}" for step in result["steps"])
    )
    lines.append(f"{'bound':26s}" + "".join(f"{step['bound']:>{width + 2}s}" for step in result["steps"]))
    return "\n".join(lines)


def _given(value: str | None, default: str) -> str:
    """The flag's text, or its default when it was not given (None: an empty text given is checked,
    not replaced by the default)."""
    return default if value is None else value


_PASS_FLAGS = ("model", "tokens", "kv_tokens", "groups", "tp", "gemm_calibration", "calibrate_from", "explain")


def check_flags(args: argparse.Namespace) -> None:
    """Refuse a flag the chosen mode would ignore (was: accepted, exit 0, the flag without effect)."""
    if args.comm:
        given = [f"--{name.replace('_', '-')}" for name in _PASS_FLAGS if getattr(args, name) not in (None, False)]
        if given:
            raise UsageError(f"{', '.join(given)}: not with --comm (it times collectives alone, no forward pass)")
    elif args.workers is not None or args.bytes is not None:
        raise UsageError("--workers and --bytes size the collectives of --comm: give --comm too")


def run(args: argparse.Namespace) -> int:
    """Print the table (unless --json) and the JSON line; 0 on success, 2 on bad input."""
    try:
        check_flags(args)
        result = predict_comm(args) if args.comm else predict(args)
    except UsageError as error:
        print(f"{PROG}: error: {error_line(error)}", file=sys.stderr)  # the line solm.cli prints
        return 2
    if not args.json:
        if args.comm:
            print(_comm_table(result))
        else:
            print(_table(result))
            if "explain" in result:
                print(_explain_table(result))
    print(json_line(result))
    return 0
