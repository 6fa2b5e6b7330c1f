"""The workload: pass demands read from a trace's structure, independent of its timings."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.workload import PassDemand, from_trace, load_workload, uniform
from tests.simulator.toy_traces import pasta, planned_diffusion, seq, tip, write_toy_trace


def test_sequential_passes_exact(tmp_path):
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3)], [4]))
    assert w.passes(0) == [
        PassDemand(4, 10, 1, 4, 0, 16, 0, "prefill", 1),
        PassDemand(1, 5, 1, 5, 1, 16, 0, "decode", 1),
        PassDemand(1, 6, 1, 6, 1, 16, 0, "decode", 1),
    ]
    assert w.logit_tokens.tolist() == [1, 1, 1]  # one logit row per stream outside denoise passes


def test_measured_capture(small_trace):
    from profiler.reader import read_trace

    trace = read_trace(small_trace)
    w = from_trace(trace)
    assert w.n_requests == len(trace.requests)
    assert w.n_passes.tolist() == trace.requests.sort_values("request_id")["steps"].tolist()
    assert w.emits.sum() == trace.requests["output_tokens"].sum()  # counted from tokens.parquet
    assert np.all(w.alloc_kv_tokens >= w.live_kv_tokens)
    assert w.source["kind"] == "measured" and w.source["model"]["name"]


def test_pasta_has_fewer_wider_passes_than_its_sequential_twin(tmp_path):
    k, length = 4, 10
    w = load_workload(write_toy_trace(tmp_path / "t", [pasta(8, k, length), seq(8, 2 + k * length)], [8, 8]))
    assert w.emits[w.offsets[0] : w.offsets[1]].sum() == w.emits[w.offsets[1] :].sum() == 2 + k * length
    assert w.n_passes.tolist() == [2 + length, 2 + k * length]
    assert w.query_groups[w.offsets[0] + 1] == k


def test_tip_holds_less_kv_than_its_sequential_twin(tmp_path):
    w = load_workload(write_toy_trace(tmp_path / "t", [tip(8, 6, 10), seq(8, 60)], [8, 8]))
    peak = w.peak_alloc_tokens()
    assert peak[0] < peak[1]
    assert w.evicted_tokens[: w.offsets[1]].sum() == 40  # steps 2..5 each kill the step before the last
    assert min(d.kv_tokens_delta for d in w.passes(0)) == -9


def test_planned_diffusion_round_is_its_longest_span(tmp_path):
    spans = [10, 30, 20]
    w = load_workload(write_toy_trace(tmp_path / "t", [planned_diffusion(8, 4, spans)], [8]))
    phases = [d.phase for d in w.passes(0)]
    assert phases.count("denoise") == max(spans)
    denoise = [d for d in w.passes(0) if d.phase == "denoise"]
    assert denoise[0].query_tokens == sum(spans) and denoise[0].emits == 3
    # a denoise pass needs logits for every row
    assert w.logit_tokens[w.phase == 3].tolist() == w.query_tokens[w.phase == 3].tolist()


def test_take_cycles_and_renumbers(tmp_path):
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3), seq(4, 5)], [4, 4]))
    t = w.take(np.arange(5) % 2)
    assert t.n_requests == 5 and t.request_ids.tolist() == [0, 1, 2, 3, 4]
    assert t.source_ids().tolist() == [0, 1, 0, 1, 0]
    assert t.n_passes.tolist() == [3, 5, 3, 5, 3]
    assert t.passes(2) == w.passes(0)
    with pytest.raises(ValueError):
        w.take([2])


def test_uniform():
    w = uniform(3, 10, 4)
    assert w.total_passes() == 12 and w.passes(1)[0] == PassDemand(10, 55, 1, 10, 0, 16, 0, "prefill", 1)
    assert w.passes(1)[3].kv_tokens_read == 13
    with pytest.raises(ValueError):
        uniform(0, 1, 1)


@pytest.mark.parametrize("shape, extra", [((40, 100, 25), {"max_batch_tokens": 64}), ((40, 30, 25), {})])
def test_serving_trace_reads_back_as_its_own_passes(tmp_path, shape, extra):
    """Chunks fold into their pass and recomputed tokens are not demand: a replay under load, written
    as a trace, reads back as the workload it replayed."""
    from simulator.hardware import get_hardware
    from simulator.models import get_model
    from simulator.replay import ReplayConfig, replay
    from simulator.simtrace import write_simulated_trace

    llama = get_model("llama-3-8b")
    w = uniform(*shape)
    res = replay(
        w,
        get_hardware("l4"),
        llama,
        ReplayConfig(rate=6.0, max_seqs=8, **extra, kv_capacity_bytes=20 * 16 * llama.kv_bytes_per_token),
    )
    assert res.metrics["preemptions"] > 0 and res.metrics["recomputed_tokens"] > 0
    back = load_workload(write_simulated_trace(res, tmp_path / "sim"))
    for name in ("offsets", "query_tokens", "kv_tokens_read", "emits", "live_kv_tokens", "phase"):
        assert np.array_equal(getattr(back, name), getattr(w, name)), name


def test_own_passes_of_hand_written_serving_rows():
    """Rows as a serving capture writes them: a chunk folds into the pass that ends it; a bare
    recompute note takes out the KV the request held on its row before (a request's first row has
    none: never the previous request's); a counted note takes out its count; a trailing chunk (a
    capture cut short) is still a pass."""
    import pandas as pd

    from simulator.workload import own_passes

    rows = [  # request_id, step_index, query_tokens, kv_tokens_read, live_kv_tokens, emitted_tokens, note
        (0, 0, 4, 10, 4, 0, "prefill chunk"),
        (0, 1, 4, 26, 8, 1, ""),
        (0, 2, 1, 9, 9, 1, ""),
        (0, 3, 10, 55, 10, 1, "recompute after preemption"),  # 9 held before: 1 new row
        (0, 4, 5, 40, 11, 1, "recompute after preemption (4 tokens)"),
        (1, 0, 5, 15, 5, 1, "recompute after preemption"),
        (1, 1, 3, 21, 8, 0, "prefill chunk"),
    ]
    cols = ["request_id", "step_index", "query_tokens", "kv_tokens_read", "live_kv_tokens", "emitted_tokens", "note"]
    steps = pd.DataFrame(rows, columns=cols)
    tokens = pd.DataFrame({"request_id": [0, 0], "step_index": [1, 4]})
    out, toks = own_passes(steps, tokens)
    got = out[["request_id", "step_index", "query_tokens", "kv_tokens_read", "emitted_tokens"]].values.tolist()
    assert got == [
        [0, 0, 8, 36, 1],
        [0, 1, 1, 9, 1],
        [0, 2, 1, 10, 1],  # 55 - 9 * 10 / 2
        [0, 3, 1, 30, 1],  # 40 - 4 * 5 / 2
        [1, 0, 5, 15, 1],
        [1, 1, 3, 21, 0],
    ]
    assert toks["step_index"].tolist() == [0, 3]


@pytest.mark.parametrize("value", ["x", 1e30, float("nan"), 10**30, -1, True])
def test_a_malformed_kv_bytes_per_token_is_one_trace_error(tmp_path, value, capsys):
    """Was: int() of meta.json's model.kv_bytes_per_token in the replay (a ValueError or an
    OverflowError), `solm simulate` and `solm validate` exit 1 (a bug); found by fuzzing traces."""
    import json
    import shutil
    from pathlib import Path

    from profiler.reader import TraceError
    from solm.cli import main

    t = Path(
        shutil.copytree(Path(__file__).resolve().parents[2] / "traces" / "sequential-reverse_words", tmp_path / "t")
    )
    meta = json.loads((t / "meta.json").read_text())
    assert load_workload(t).n_requests  # the shipped value reads
    meta["model"]["kv_bytes_per_token"] = value
    (t / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TraceError, match="model.kv_bytes_per_token must be an integer >= 0, got "):
        load_workload(t)
    assert main(["simulate", str(t), "--hardware", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("solm simulate: error: ") and err.count("\n") == 1, err


def test_a_runtime_capture_recompute_is_not_taken_out_of_its_own_rows(tmp_path):
    """The runtime's serving capture records a readmitted request's pass with its own rows only
    (`query_tokens` 1, `kv_tokens_read` 33 for a decode) and the re-prefill in `recompute_tokens`
    (32): the workload keeps 1 and 33. Was: 32 taken out again, the decode read back as 0 query
    tokens and 32 reads (`solm capture --rate inf --page-size 4 --kv-budget-mib 0.140625`)."""
    import dataclasses

    from profiler.reader import read_trace

    trace = read_trace(write_toy_trace(tmp_path / "t", [seq(31, 4)], [31]))
    steps = trace.steps.copy()
    steps["recompute_tokens"] = [0, 0, 32, 0]  # the decode at step 2 followed a preemption
    w = from_trace(dataclasses.replace(trace, steps=steps))
    assert [(d.query_tokens, d.kv_tokens_read) for d in w.passes(0)] == [(31, 496), (1, 32), (1, 33), (1, 34)]
    simulated = from_trace(dataclasses.replace(trace, steps=steps, meta={**trace.meta, "kind": "simulated"}))
    assert simulated.passes(0)[2][:2] == (0, 32)  # a simulated row carries its re-prefill: taken out (clamped)
