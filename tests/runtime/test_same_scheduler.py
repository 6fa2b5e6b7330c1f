"""One scheduler, two clocks: for a scripted arrival list, the same policy forms the same batches in
the simulator's replay and in the runtime's server when both time a pass alike (1 s + 0.25 s per
query row: the replay's `LinearCost`, the server's `FakeClock`)."""

from __future__ import annotations

import math

import pytest

from runtime.engines import GenerationConfig, Request, SequentialEngine
from runtime.server import FakeClock, Server
from scheduling import get_scheduler
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, replay
from simulator.workload import load_workload
from tests.simulator.toy_traces import MODEL_META, LinearCost, seq, toy_part, write_toy_trace

MODEL = ModelSpec.from_trace_meta(MODEL_META)


class NoStop(SequentialEngine):
    """Exactly `max_tokens` tokens a request, whatever the random model samples."""

    def is_stop(self, token_id: int) -> bool:
        return False


def test_same_batches_in_simulator_and_runtime(tiny_model, tok, tmp_path):
    prompts = ["ab", "abcd", "a", "abc", "ab"]
    arrivals = [0.0, 0.0, 1.1, 2.6, 6.0]
    n_out = [3, 5, 2, 4, 3]
    eng = NoStop(tiny_model, tok, GenerationConfig(max_tokens=5, page_size=16))
    lengths = [len(eng.prompt_ids(Request(0, p))) for p in prompts]

    # runtime: each request stops at its own length (max_tokens per request via one engine each)
    engines = {n: NoStop(tiny_model, tok, GenerationConfig(max_tokens=n, page_size=16)) for n in set(n_out)}

    class PerRequest(NoStop):
        def start(self, request, kv):
            return engines[n_out[request.request_id]].start(request, kv)

    server = Server(
        PerRequest(tiny_model, tok, GenerationConfig(max_tokens=5, page_size=16)),
        max_pages=64,
        scheduler=get_scheduler("fcfs")(max_seqs=3, max_batch_tokens=12),
        clock=FakeClock(1.0, 0.25),
    )
    out = server.serve(list(zip(arrivals, prompts)))
    runtime_batches = [sorted(e.request_id for e in p.entries) for p in out["passes"]]

    w = load_workload(
        write_toy_trace(tmp_path / "t", [seq(p, n) for p, n in zip(lengths, n_out)], lengths, arrivals=arrivals)
    )
    res = replay(w, toy_part(), MODEL, ReplayConfig(max_seqs=3, max_batch_tokens=12), cost=LinearCost())
    rows = res.rows
    sim: dict[int, list[int]] = {}
    for rq, b in zip(rows["request"].tolist(), rows["batch_index"].tolist()):
        sim.setdefault(b, []).append(int(w.request_ids[rq]))
    sim_batches = [sorted(sim[b]) for b in sorted(sim)]
    assert len(runtime_batches) > 5 and max(map(len, runtime_batches)) == 3  # the max_seqs cap binds
    assert runtime_batches == sim_batches
    assert [round(p.end_s, 6) for p in out["passes"]][-1] == round(
        max(res.requests["arrival_s"] + res.requests["e2e_s"]), 6
    )


def test_pool_attention_scores_the_keys_the_runtime_scores(tiny_model, tok, tmp_path, monkeypatch):
    """The runtime's mask attention scores every row against every slot its pool has used; the replay
    with `attention="pool"` counts the same keys pass by pass (its pages' high-water mark)."""
    import simulator.replay as replay_mod

    prompts = ["abcdefghijklmnopqrst", "ab", "abcdefghij"]
    arrivals, n_out = [0.0, 0.0, 3.1], [6, 3, 4]
    engines = {n: NoStop(tiny_model, tok, GenerationConfig(max_tokens=n, page_size=16)) for n in set(n_out)}

    class PerRequest(NoStop):
        def start(self, request, kv):
            return engines[n_out[request.request_id]].start(request, kv)

    eng = PerRequest(tiny_model, tok, GenerationConfig(max_tokens=6, page_size=16))
    fcfs = get_scheduler("fcfs")(max_seqs=3, max_batch_tokens=64)
    server = Server(eng, max_pages=64, scheduler=fcfs, clock=FakeClock(1.0, 0.25))
    passes = server.serve(list(zip(arrivals, prompts)))["passes"]
    runtime = [(p.rows, p.attention_kv_tokens) for p in passes]
    # the forward alone is timed on the server's clock: here exactly what the fake clock charges a pass
    assert all(p.forward_s == pytest.approx(1.0 + 0.25 * p.rows) for p in passes)

    lengths = [len(eng.prompt_ids(Request(0, p))) for p in prompts]
    w = load_workload(
        write_toy_trace(tmp_path / "t", [seq(p, n) for p, n in zip(lengths, n_out)], lengths, arrivals=arrivals)
    )
    seen = []
    timed = replay_mod.Replay._pass_times

    def record(self, q, kv, g, lg, n, until=math.inf):
        seen.extend(zip(map(int, q), map(int, kv)))
        return timed(self, q, kv, g, lg, n, until)

    monkeypatch.setattr(replay_mod, "MAX_STRETCH_PASSES", 1)  # every pass costed once, in order
    monkeypatch.setattr(replay_mod.Replay, "_pass_times", record)
    config = ReplayConfig(max_seqs=3, max_batch_tokens=64, attention="pool")
    replay(w, toy_part(), MODEL, config, cost=LinearCost())
    assert len(runtime) > 5 and max(k for _, k in runtime) > min(k for _, k in runtime)
    assert seen == runtime
    assert len({k // r for r, k in runtime}) > 1  # the high-water mark grew during the run
