"""One scheduler, two clocks: for a scripted arrival list the runtime's batched server (its passes
timed by a fake clock, 1 s each) and the simulator's replay (1 s per pass) form the same batches at
the same times, with chunked prefill and with a pool small enough to preempt."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")
server_mod = pytest.importorskip("runtime.server", reason="the batched runtime server (issue 14, serve-rt)")

from profiler.reader import read_trace  # noqa: E402
from runtime.capture import CaptureConfig, capture  # noqa: E402
from runtime.checkpoint import load_model  # noqa: E402
from runtime.engines import GenerationConfig, get_engine  # noqa: E402
from runtime.tokenizer import Tokenizer  # noqa: E402
from scheduling import get_scheduler  # noqa: E402
from simulator.hardware import get_hardware  # noqa: E402
from simulator.models import ModelSpec  # noqa: E402
from simulator.replay import ReplayConfig, replay  # noqa: E402
from simulator.workload import from_trace  # noqa: E402

PAGE, MAX_TOKENS = 4, 10
ARRIVALS = [0.0, 0.0, 1.5, 2.5, 2.5]


class OneSecond:
    """The replay's cost protocol: every pass 1 s, as the runtime's FakeClock(pass_s=1)."""

    def step_time_s(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        return np.ones(np.shape(query_tokens)) if np.ndim(query_tokens) else 1.0


@pytest.fixture(scope="module")
def batch1(tmp_path_factory):
    out = tmp_path_factory.mktemp("clocks") / "seq"
    capture(
        CaptureConfig(system="sequential", n=len(ARRIVALS), max_tokens=MAX_TOKENS, page_size=PAGE), out, progress=False
    )
    return read_trace(out)


def runtime_batches(trace, pages: int, **sched) -> tuple[list[tuple[float, list[int]]], int]:
    cls = get_engine("sequential")
    eng = cls(load_model(cls.default_model)[0], Tokenizer(), GenerationConfig(max_tokens=MAX_TOKENS, page_size=PAGE))
    server = server_mod.Server(
        eng, max_pages=pages, scheduler=get_scheduler("fcfs")(**sched), clock=server_mod.FakeClock(pass_s=1.0)
    )
    prompts = trace.requests.sort_values("request_id")["prompt"].tolist()
    out = server.serve(list(zip(ARRIVALS, prompts)))
    return [(p.start_s, sorted(e.request_id for e in p.entries)) for p in out["passes"]], out["preemptions"]


def simulated_batches(trace, pages: int, **sched) -> tuple[list[tuple[float, list[int]]], int]:
    w = dataclasses.replace(from_trace(trace), arrival_s=np.array(ARRIVALS))
    model = ModelSpec.from_trace_meta(trace.meta)
    config = ReplayConfig(block_size=PAGE, kv_capacity_bytes=pages * PAGE * model.kv_bytes_per_token, **sched)
    res = replay(w, get_hardware("h100-sxm"), model, config, cost=OneSecond())
    rows, out = res.rows, []
    for b in np.unique(rows["batch_index"]):
        at = rows["batch_index"] == b
        out.append((float(rows["start_s"][at][0]), sorted(rows["request"][at].tolist())))
    return out, res.metrics["preemptions"]


@pytest.mark.parametrize(
    "pages, sched, preempts",
    [
        (10**4, {"max_seqs": 3, "max_batch_tokens": 40}, False),  # two prompts at t=0 exceed 40 tokens: a chunk
        (20, {"max_seqs": 4, "max_batch_tokens": 4096}, True),  # 20 pages of 4 tokens: growing requests preempt
    ],
)
def test_same_batches_in_the_simulator_and_the_runtime(batch1, pages, sched, preempts):
    (rt, rt_pre), (sim, sim_pre) = runtime_batches(batch1, pages, **sched), simulated_batches(batch1, pages, **sched)
    assert [b for _, b in rt] == [b for _, b in sim] and rt_pre == sim_pre and (rt_pre > 0) == preempts
    assert np.allclose([t for t, _ in rt], [t for t, _ in sim])
    assert max(len(b) for _, b in rt) > 1  # batched, not one at a time
