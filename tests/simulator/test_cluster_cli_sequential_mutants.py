"""simulator/cluster/cli.py (the deployment flags of `solm simulate`: their parsing and the checks
on them) and runtime/engines/sequential.py (the autoregressive engine): tests that kill the mutants
a mutation round found the rest of the suite let through (each test names the mutant it kills: the
code as it would be, mutated).

Mutants left alive as equivalent: cli.py L74 `not sep` dropped (no `:` leaves D empty, which
`int` refuses anyway); L88 `dataclasses.replace` with no fields (an equal copy); L143 the structure
path's `or` reversed (both given is refused at L155); sequential.py L85/L86 the peaks taken as the
last value (a sequential request's KV never shrinks while it runs); L120 `remap` keeping the
caller's list (`readmit` hands a list of its own)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from profiler.errors import UsageError
from runtime.engines import GenerationConfig, Request, SequentialEngine
from runtime.kv import RequestKV
from runtime.sampling import SamplingConfig
from simulator.cluster.cli import (
    add_cluster_args,
    cluster_config,
    load_structure_and_workload,
    parse_disaggregate,
    with_links,
)
from simulator.hardware import get_hardware


def cluster_args(*argv: str) -> argparse.Namespace:
    """The flags `solm simulate` parses for `cluster_config`, from `argv`."""
    p = argparse.ArgumentParser()
    add_cluster_args(p)
    p.add_argument("--hardware", default="h100-sxm")
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    return p.parse_args(list(argv))


# ---- simulator/cluster/cli.py --------------------------------------------------------------------
def test_disaggregate_reads_prefill_then_decode_replicas():
    """`--disaggregate 2:3` is 2 prefill and 3 decode replicas.

    kills: simulator/cluster/cli.py L69: split on another character (every P:D refused);
    kills: simulator/cluster/cli.py L71: P and D swapped."""
    assert parse_disaggregate("2:3") == (2, 3)
    assert cluster_config(cluster_args("--disaggregate", "2:3")).disaggregate == (2, 3)


@pytest.mark.parametrize("text", ["", "2", "0:1", "1:0", "-1:2"])
def test_disaggregate_without_two_counts_of_at_least_one_is_refused(text):
    """An empty value, one count, or a count below 1 is one usage error naming the flag.

    kills: simulator/cluster/cli.py L67: an empty value read as no --disaggregate;
    kills: simulator/cluster/cli.py L74: `min(pd) < 0` (0 replicas accepted);
    kills: simulator/cluster/cli.py L74: `max` for `min` (0:1 accepted)."""
    with pytest.raises(UsageError, match="--disaggregate takes P:D"):
        parse_disaggregate(text)


def test_a_long_disaggregate_value_is_cut_in_its_error_line(capsys):
    """A 5,000-digit --disaggregate is one usage line quoting 60 characters of it, as every other
    flag's error does (was: the value echoed whole, a 5,000-character line)."""
    from solm.cli import main

    argv = ["simulate", "no-trace", "--hardware", "h100-sxm", "--disaggregate", "1:" + "9" * 5000]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 200, err[:300]
    assert err.startswith("solm simulate: error: --disaggregate takes P:D") and "... (5004 characters)" in err


def test_the_deployment_flags_reach_the_config():
    """Each flag lands in its own field; no --router is round_robin.

    kills: simulator/cluster/cli.py L116: --replicas dropped;
    kills: simulator/cluster/cli.py L117: --router dropped;
    kills: simulator/cluster/cli.py L120: --slo-ttft-ms dropped;
    kills: simulator/cluster/cli.py L121: --slo-tpot-ms dropped;
    kills: simulator/cluster/cli.py L133: a --router always refused."""
    config = cluster_config(
        cluster_args(
            "--tp", "2", "--pp", "4", "--replicas", "3", "--router", "kv_aware",
            "--slo-ttft-ms", "200", "--slo-tpot-ms", "30",
        )
    )  # fmt: skip
    assert (config.parallelism.tp, config.parallelism.pp, config.parallelism.micro_batches) == (2, 4, None)
    assert (config.replicas, config.router, config.disaggregate) == (3, "kv_aware", None)
    assert (config.slo_ttft_ms, config.slo_tpot_ms) == (200.0, 30.0)
    assert cluster_config(cluster_args()).router == "round_robin"


def test_a_namespace_without_a_pipeline_schedule_drains():
    """A caller whose flags have no --pp-schedule gets the default, drain.

    kills: simulator/cluster/cli.py L109: the fallback interleave (a one-stage run refused as a pipeline setting)."""
    args = cluster_args()
    del args.pp_schedule
    assert cluster_config(args).parallelism.schedule == "drain"


def test_links_and_price_are_applied_to_both_parts():
    """--topology and --price-per-gpu-hour (0 included: free GPUs still get cost figures) reach the
    part, and the decode replicas' part too; with --disaggregate, --topology is taken.

    kills: simulator/cluster/cli.py L84: --topology dropped;
    kills: simulator/cluster/cli.py L85: a price of 0 dropped;
    kills: simulator/cluster/cli.py L102: the decode part without --topology and the price;
    kills: simulator/cluster/cli.py L112: --topology refused with --disaggregate."""
    hw = get_hardware("h100-sxm")
    args = cluster_args("--tp", "2", "--topology", "mesh", "--price-per-gpu-hour", "0")
    assert (with_links(hw, args).topology, with_links(hw, args).price_per_gpu_hour) == ("mesh", 0.0)
    assert with_links(hw, cluster_args()) == hw
    args = cluster_args("--disaggregate", "1:1", "--decode-hardware", "a100-80g", "--topology", "mesh")
    args.price_per_gpu_hour = 2.5
    decode = cluster_config(args).decode_hardware
    assert (decode.name, decode.topology, decode.price_per_gpu_hour) == ("a100-80g", "mesh", 2.5)


def test_a_bad_link_setting_is_one_usage_error():
    """The catalog's ValueError for an unknown topology or a negative price is a usage error (the
    mutant was killed by the rest of the suite too; kept: the two messages as a user reads them).

    kills: simulator/cluster/cli.py L89: the ValueError let through (a traceback, exit 1)."""
    hw = get_hardware("h100-sxm")
    with pytest.raises(UsageError, match="topology must be one of"):
        with_links(hw, cluster_args("--topology", "ring"))
    with pytest.raises(UsageError, match="price_per_gpu_hour must be a finite number >= 0"):
        with_links(hw, cluster_args("--price-per-gpu-hour", "-1"))


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--decode-hardware", "a100-80g"], "--decode-hardware needs --disaggregate P:D"),
        (["--disaggregate", "1:1", "--decode-hardware", "host-cpu"], "is a CPU and --hardware h100-sxm a GPU"),
        (["--micro-batches", "2"], "--micro-batches and --pp-schedule apply to a pipeline"),
        (["--pp-schedule", "interleave"], "--micro-batches and --pp-schedule apply to a pipeline"),
        (["--router", "kv_aware"], "--router picks among replicas"),
        (["--topology", "pcie"], "--topology applies to links between GPUs"),
        (["--topology", "pcie", "--replicas", "2"], "--topology applies to links between GPUs"),
    ],
)
def test_settings_that_would_be_ignored_are_refused(argv, needle):
    """A setting with nothing to apply to is one usage error.

    kills: simulator/cluster/cli.py L100: --decode-hardware without --disaggregate let through;
    kills: simulator/cluster/cli.py L111: `replicas >= 1` (a one-replica --router taken as routed);
    kills: simulator/cluster/cli.py L112: the --topology check dropped;
    kills: simulator/cluster/cli.py L133: the --router check dropped."""
    with pytest.raises(UsageError, match=needle):
        cluster_config(cluster_args(*argv))


@pytest.mark.parametrize(
    "argv",
    [
        ["--disaggregate", "1:1", "--decode-hardware", "a100-80g"],
        ["--pp", "2", "--micro-batches", "4", "--pp-schedule", "interleave"],
        ["--disaggregate", "1:2", "--router", "least_outstanding"],
        ["--pp", "2", "--topology", "pcie"],
        ["--tp", "2", "--topology", "pcie"],
        ["--disaggregate", "1:1", "--topology", "pcie"],
    ],
)
def test_settings_that_apply_are_taken(argv):
    """The same settings where they apply run.

    kills: simulator/cluster/cli.py L111: `or bool(args.disaggregate)` dropped (a disaggregated pair's --router refused);
    kills: simulator/cluster/cli.py L112: `args.tp == 1` for `args.tp == args.pp == 1` (--topology refused with --pp 2)."""
    assert cluster_config(cluster_args(*argv)) is not None


TRACE = str(Path(__file__).resolve().parents[2] / "traces" / "sequential-reverse_words")


def workload_args(tmp_path, trace=None, structure_from=TRACE, workload=True, columns=None, time_scale=1.0, seed=None):
    """The flags `load_structure_and_workload` reads, `--workload` a 40-request file (columns
    ts,in,out when `columns` is given) arriving 1 s apart."""
    path = None
    if workload:
        path = tmp_path / "w.csv"
        head = "ts,in,out" if columns else "arrived_at,num_prefill_tokens,num_decode_tokens"
        path.write_text(head + "\n" + "".join(f"{i}.0,{8 + i},{2 + i % 5}\n" for i in range(40)))
    return argparse.Namespace(
        trace=trace,
        workload=None if path is None else str(path),
        structure_from=structure_from,
        columns=columns,
        time_scale=time_scale,
        seed=seed,
    )


def test_a_workload_file_is_read_with_its_columns_time_scale_and_seed(tmp_path):
    """The file's lengths and arrivals (sped up by --time-scale, read through --columns) over the
    structure trace's requests drawn with --seed (no --seed: seed 0).

    kills: simulator/cluster/cli.py L161: --seed dropped (every seed drawing alike)."""
    columns = "arrived_at=ts,num_prefill_tokens=in,num_decode_tokens=out"
    _, w = load_structure_and_workload(workload_args(tmp_path, columns=columns, time_scale=4.0))
    assert w.arrival_s.tolist() == [i / 4 for i in range(40)]
    assert w.prompt_tokens.tolist() == [8 + i for i in range(40)]
    sources = {
        seed: load_structure_and_workload(workload_args(tmp_path, seed=seed))[1].source_request_ids.tolist()
        for seed in (None, 0, 7)
    }
    assert sources[None] == sources[0] != sources[7]


@pytest.mark.parametrize(
    "flags, needle",
    [
        (dict(workload=False, trace=TRACE), "--structure-from and --columns go with --workload FILE"),
        (dict(workload=False, structure_from=None, trace=TRACE, columns="a=b"), "go with --workload FILE"),
        (dict(workload=False, structure_from=None), "give a trace directory, or --workload FILE"),
        (dict(structure_from=None), "--workload needs --structure-from TRACE"),
        (dict(trace=TRACE), "with --workload, give the structure trace once"),
    ],
)
def test_trace_and_workload_flags_that_do_not_go_together_are_refused(tmp_path, flags, needle):
    """One usage error each.

    kills: simulator/cluster/cli.py L145: --columns without --workload let through;
    kills: simulator/cluster/cli.py L145: --structure-from without --workload let through;
    kills: simulator/cluster/cli.py L147: the no-trace check dropped (a traceback);
    kills: simulator/cluster/cli.py L153: the no-structure check dropped (a traceback)."""
    with pytest.raises(UsageError, match=needle):
        load_structure_and_workload(workload_args(tmp_path, **flags))


# ---- runtime/engines/sequential.py ---------------------------------------------------------------
def started(tiny_model, tok, prompt: str = "reverse: ab,cd", request_id: int = 0, **config):
    """A sequential request started over its own store, no pass run yet."""
    eng = SequentialEngine(tiny_model, tok, GenerationConfig(**config))
    return eng, eng.start(Request(request_id, prompt), RequestKV(eng.new_store(), request_id))


def one_pass(eng, st):
    """Run the request's next pass (counted, as a server counts it); its Step."""
    inp = st.inputs()
    logits, attention = eng.forward([inp], st.kv.store)
    st.passes_done += 1
    return st.after(logits, attention)


def test_prompt_left_counts_the_chunks_already_run_and_is_zero_when_decoding(tiny_model, tok):
    """A chunk of 2 prompt tokens leaves n - 2 to chunk; once decoding, none.

    kills: runtime/engines/sequential.py L56: `prompt_left` not subtracting the chunks already run;
    kills: runtime/engines/sequential.py L56: `prompt_left` 1 in decode (the server chunking a decode row)."""
    eng, st = started(tiny_model, tok, max_tokens=4)
    assert st.prompt_left() == st.n > 3
    st.prompt_chunk(2)
    assert st.prompt_left() == st.n - 2 and st.next_rows() == st.n - 2
    one_pass(eng, st)
    assert st.phase == "decode" and st.prompt_left() == 0 and st.next_rows() == 1


def test_a_chunked_prefill_cut_short_starts_over(tiny_model, tok):
    """A prompt prefill preempted after a chunk forgets it: the whole prompt is left.

    kills: runtime/engines/sequential.py L64: `restart_prefill` keeping the freed chunk's slots (the prefill skipping them)."""
    _, st = started(tiny_model, tok, max_tokens=4)
    st.prompt_chunk(3)
    st.release()
    st.preempted()
    assert st.slots == [] and st.prompt_left() == st.n and st.next_rows() == st.n


def test_each_request_samples_from_its_own_seeded_stream(tiny_model, tok):
    """Sampled (temperature 1), one prompt under two request ids gives two outputs, each the same
    again.

    kills: runtime/engines/sequential.py L41: the sampler seeded without the request id (every request drawing alike)."""
    cfg = GenerationConfig(max_tokens=12, sampling=SamplingConfig(temperature=1.0, seed=5))
    eng = SequentialEngine(tiny_model, tok, cfg)
    a, b = (eng.generate(Request(rid, "xyz")).output_ids for rid in (1, 2))
    assert a != b and eng.generate(Request(1, "xyz")).output_ids == a


def test_a_run_records_each_token_and_pass_as_generated(tiny_model, tok):
    """5 tokens after an n-token prompt: token i from pass i at position n + i, seeing the prompt
    and its stream; each pass one stream, reading the causal triangle then every slot.

    kills: runtime/engines/sequential.py L90: a token's step_index 0;
    kills: runtime/engines/sequential.py L90: a token's position_id one less;
    kills: runtime/engines/sequential.py L90: visible_streams (0,), the prompt left out;
    kills: runtime/engines/sequential.py L97: a pass's streams empty."""
    eng, st = started(tiny_model, tok, max_tokens=5)
    n = st.n
    steps = [one_pass(eng, st) for _ in range(5)]
    assert st.done and [s.step_index for s in steps] == list(range(5))
    assert [(t.stream, t.step_index, t.position_id, t.visible_streams) for t in st.tokens] == [
        (0, i, n + i, (-1, 0)) for i in range(5)
    ]
    assert all(s.streams == (0,) for s in steps)
    assert [s.kv_tokens_read for s in steps] == [n * (n + 1) // 2] + [n + i for i in range(1, 5)]
    assert [s.emitted for s in steps] == [(t.token_id,) for t in st.tokens]


def test_the_completion_describes_the_run(tiny_model, tok):
    """A truncated 5-token run: n prompt tokens, 5 on the critical path in 5 steps, the text
    without control tokens, a linear graph of n then 5.

    kills: runtime/engines/sequential.py L132: `linear_graph` with its two lengths swapped;
    kills: runtime/engines/sequential.py L133: the prompt counted on the critical path."""
    from profiler.schema import linear_graph

    eng, st = started(tiny_model, tok, max_tokens=5)
    while not st.done:
        one_pass(eng, st)
    c = st.completion()
    out = [t.token_id for t in st.tokens]
    assert (c.prompt_tokens, c.output_ids, c.critical_path_tokens, c.steps) == (st.n, out, 5, 5)
    assert (c.status, c.stop_reason) == ("truncated", "max_tokens")
    assert c.text == tok.decode(out, skip_control=True)
    assert c.graph == linear_graph(st.n, 5) != linear_graph(5, st.n)


def test_a_run_stops_when_the_next_token_would_have_no_position(tiny_model, tok):
    """A model of n + 3 positions: 3 tokens, at n .. n + 2, then stop_reason max_positions.

    kills: runtime/engines/sequential.py L108: `>` for `>=` (a token at position n + 3, past the model);
    kills: runtime/engines/sequential.py L108: the prompt left out of the count (the run going on to max_tokens);
    kills: runtime/engines/sequential.py L109: the stop reported as max_tokens."""
    import dataclasses

    from runtime.model import TinyLM

    n = len(SequentialEngine(tiny_model, tok).prompt_ids(Request(0, "abc")))
    model = TinyLM(dataclasses.replace(tiny_model.cfg, max_positions=n + 3), seed=1).eval()
    c = SequentialEngine(model, tok, GenerationConfig(max_tokens=20)).generate(Request(0, "abc"))
    assert (c.stop_reason, c.status) == ("max_positions", "truncated")
    assert [t.position_id for t in c.tokens] == [n, n + 1, n + 2]


def test_a_preempted_decoder_replays_what_it_held_and_goes_on_as_alone(tiny_model, tok):
    """After 3 passes a decoder holds its prompt and its first 2 tokens (the 3rd has no K/V yet),
    each seeing every earlier one and itself; readmitted elsewhere, those tokens move to the new
    slots and the run ends as it would alone.

    kills: runtime/engines/sequential.py L121: `remap` giving the tokens the prompt's slots."""
    eng, st = started(tiny_model, tok, max_tokens=6)
    alone = eng.generate(Request(0, "reverse: ab,cd")).output_ids
    n = st.n
    for _ in range(3):
        one_pass(eng, st)
    held = st.held()
    assert [h[0] for h in held] == st.prompt + [t.token_id for t in st.tokens[:2]]
    assert [h[1] for h in held] == list(range(n + 2))
    assert all(list(sees) == list(range(i + 1)) for i, (_, _, sees) in enumerate(held))
    before = list(st.slots)
    st.release()
    st.preempted()
    RequestKV(st.kv.store, 99).allocate(9)  # another request takes the freed slots first
    assert st.readmit() == n + 2 and st.slots[n:] != before[n:]
    assert [t.kv_slot for t in st.tokens] == [*st.slots[n:], -1]
    while not st.done:
        one_pass(eng, st)
    assert [t.token_id for t in st.tokens] == alone
