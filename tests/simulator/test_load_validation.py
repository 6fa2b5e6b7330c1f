"""Validation under load: a serving trace predicted from a batch-1 calibration alone."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from profiler.reader import read_trace
from simulator.cost import CostModel, CostParams
from simulator.hardware import host_cpu_spec
from simulator.load_calibration import (
    HostCost,
    admission_s,
    calibrate_batch1,
    host_line,
    host_terms,
    pass_arrays,
    size_medians,
    sweep_passes,
    wake_factors,
)
from simulator.load_validation import (
    BREAKDOWN_COLUMNS,
    load_level,
    pass_breakdown,
    pass_time_ratios,
    serving_config,
    summarize_run,
    validate_load,
)
from simulator.models import ModelSpec
from simulator.replay import ReplayConfig, replay
from simulator.simtrace import write_simulated_trace
from simulator.validation import PASS_COLUMNS, pass_frame
from simulator.workload import load_workload
from solm.cli import main
from tests.simulator.toy_traces import BLOCK_BYTES, MODEL_META, LinearCost, pasta, seq, toy_part, write_toy_trace

MODEL = ModelSpec.from_trace_meta(MODEL_META)
HW = host_cpu_spec(2)
TRUTH = CostModel(HW, MODEL, dataclasses.replace(CostParams.prior(HW), step_overhead_s=0.002))


def _requests(n: int, system: str):
    if system == "pasta":
        return [pasta(6 + 3 * (i % 5), 1 + i % 3, 4 + i % 4) for i in range(n)], [6 + 3 * (i % 5) for i in range(n)]
    return [seq(6 + 3 * (i % 5), 6 + i % 7) for i in range(n)], [6 + 3 * (i % 5) for i in range(n)]


def serving_trace(path, system: str, rate: float, pool_blocks: int | None = None, n: int = 24, cost=TRUTH, **batch):
    """A synthetic serving run: requests replayed under load with the true cost, written as a measured
    trace, its rows as the runtime records them: a readmitted request's pass with its own rows only,
    the re-prefill in `recompute_tokens` (a simulated trace's rows carry it: taken out here; was
    kept, so the "measured" run read back with every replay counted twice, and how far its
    re-simulation strayed depended on this machine's clock through `host_cpu_spec`)."""
    reqs, prompts = _requests(n, system)
    w = load_workload(write_toy_trace(path.parent / f"{path.name}-src", reqs, prompts, system=system))
    w = dataclasses.replace(w, logit_tokens=w.query_tokens.copy())
    config = ReplayConfig(
        rate=rate, max_seqs=8, memory_utilization=1.0, kv_capacity_bytes=(pool_blocks or 10**6) * BLOCK_BYTES, **batch
    )
    out = write_simulated_trace(replay(w, HW, MODEL, config, cost=cost), path)
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.update(
        kind="measured",
        device={"name": "toy", "type": "cpu", "threads": 2},
        knobs={
            "rate": rate,
            "max_seqs": 8,
            "max_batch_tokens": config.max_batch_tokens,
            "chunked_prefill": config.chunked_prefill,
            "page_size": 16,
            "pool_bytes": config.kv_capacity_bytes,
            "scheduler": "fcfs",
        },
    )
    meta["model"] = {**meta["model"], "name": MODEL_META["name"]}
    meta_path.write_text(json.dumps(meta))
    steps = pd.read_parquet(out / "steps.parquet")
    if "recompute_tokens" in steps:  # only a run that preempted has the column
        q = steps["query_tokens"].to_numpy(np.int64)
        redo = np.minimum(steps["recompute_tokens"].fillna(0).to_numpy(np.int64), q)
        steps["query_tokens"] = q - redo
        steps["kv_tokens_read"] = steps["kv_tokens_read"].to_numpy(np.int64) - redo * (redo + 1) // 2
        steps.to_parquet(out / "steps.parquet", index=False)
    return out


@pytest.mark.parametrize("system", ["seq", "pasta"])
def test_a_serving_run_is_predicted_from_batch_one_alone(tmp_path, system):
    reqs, prompts = _requests(10, system)
    batch1 = write_toy_trace(tmp_path / "b1", reqs, prompts, timed_by=TRUTH, system=system)
    low = serving_trace(tmp_path / "low", system, rate=20.0)
    high = serving_trace(tmp_path / "high", system, rate=400.0, pool_blocks=6)  # a pool that preempts
    v = validate_load([low, high], batch1)
    assert [lv["rate"] for lv in v["levels"]] == [20.0, 400.0]
    for lv in v["levels"]:
        e = lv["errors"]
        assert (
            lv["passes_simulated"] == lv["passes_measured"]
            and lv["preemptions_simulated"] == lv["preemptions_measured"]
        )
        for key in ("ttft_p50_ape_percent", "e2e_p50_ape_percent", "throughput_ape_percent", "e2e_mape_percent"):
            assert e[key] < 2.0, (key, e[key])
    assert v["levels"][1]["preemptions_measured"] > 0 and v["levels"][1]["mean_batch_measured"] > 1.5


def test_pass_arrays_group_a_batched_pass(tmp_path):
    trace = read_trace(serving_trace(tmp_path / "s", "seq", rate=400.0))
    rows = trace.steps[trace.steps["query_tokens"] > 0]
    passes = pass_arrays(trace)
    assert len(passes) == rows["batch_index"].nunique() < len(rows)
    assert passes[:, 0].sum() == rows["query_tokens"].sum() and passes[:, 4].sum() == len(rows)


def test_host_line_from_gaps_over_streams(tmp_path):
    # 1 ms + 0.5 ms per stream between passes: a PASTA-like trace with 1-3 streams per pass
    trace = read_trace(write_toy_trace(tmp_path / "t", [pasta(8, 3, 4)], [8], timed_by=TRUTH))
    steps = trace.steps.sort_values("step_index").copy()
    t, starts = 0.0, []
    for d, g in zip(steps["duration_s"], steps["active_streams"]):
        starts.append(t)
        t += d + 0.001 + 0.0005 * g
    steps["start_s"] = starts
    per_pass, per_stream = host_line(dataclasses.replace(trace, steps=steps))
    assert np.isclose(per_pass, 0.001) and np.isclose(per_stream, 0.0005)


def test_serving_config_reads_the_trace_settings():
    c = serving_config(
        {
            "knobs": {
                "max_seqs": 4,
                "max_batch_tokens": 64,
                "kv_budget_mib": 0.5,
                "page_size": 8,
                "chunked_prefill": False,
                "scheduler": "sjf",
            }
        },
        MODEL,
        scheduler="fcfs",
    )
    assert (c.max_seqs, c.max_batch_tokens, c.kv_capacity_bytes, c.block_size) == (4, 64, 2**19, 8)
    assert c.chunked_prefill is False and c.scheduler == "fcfs"  # a flag given overrides the trace
    assert c.attention == "visible"  # no serving runtime recorded: each row its visible KV
    runtime = {"serving": {"max_seqs": 4, "attention": "mask"}}
    assert serving_config(runtime, MODEL).attention == "pool"  # the runtime's mask attention spans the pool
    runtime["serving"]["attention"] = "gather"
    assert serving_config(runtime, MODEL).attention == "visible"


def test_a_pass_is_all_it_computed_and_the_keys_it_scored():
    # one batched pass: request 0 decodes 1 row (5 keys visible, 2 x 32 pool slots scored),
    # request 1 runs a 6-row prefill chunk (nothing sampled, host_s NaN) scored against the pool too
    steps = pd.DataFrame(
        {
            "request_id": [0, 1],
            "batch_index": [7, 7],
            "query_tokens": [1, 0],
            "kv_tokens_read": [5, 0],
            "attention_kv_tokens": [32, 6 * 32],
            "batch_query_tokens": [7, 7],
            "duration_s": [0.004, 0.004],
            "start_s": [1.0, 1.0],
            "active_streams": [1, 0],
            "chunk": [False, True],
            "host_s": [0.0002, np.nan],
        }
    )
    f = pass_frame(steps)
    assert f[PASS_COLUMNS].to_numpy().tolist() == [[7, 224, 0.004, 2, 2]]
    assert f["host_s"].tolist() == [0.0002] and f["start_s"].tolist() == [1.0]


def test_cli_prints_errors_per_load_level(tmp_path, capsys):
    reqs, prompts = _requests(8, "seq")
    batch1 = write_toy_trace(tmp_path / "b1", reqs, prompts, timed_by=TRUTH, system="seq")
    low = serving_trace(tmp_path / "low", "seq", rate=20.0, n=8)
    assert main(["validate", str(low), "--calibrate-from", str(batch1)]) == 0
    out = capsys.readouterr().out
    assert "rate 20" in out and json.loads(out.strip().splitlines()[-1])["levels"][0]["requests"] == 8
    assert main(["validate", str(low), str(low)]) == 2  # several traces without --calibrate-from
    other = write_toy_trace(tmp_path / "o", reqs, prompts, timed_by=TRUTH, system="pasta")
    assert main(["validate", str(low), "--calibrate-from", str(other)]) == 2
    assert "cannot be predicted from a calibration of pasta" in capsys.readouterr().err


def with_host_work(trace_dir, per_request_s: float):
    """A batch-1 trace whose every pass also did `per_request_s` of the request's own host work (`host_s`)."""
    import pandas as pd

    path = trace_dir / "steps.parquet"
    steps = pd.read_parquet(path).sort_values(["request_id", "step_index"])
    steps["host_s"] = per_request_s
    steps["duration_s"] += per_request_s
    shift = steps.groupby("request_id").cumcount() * per_request_s + steps["request_id"] * 0.0
    steps["start_s"] += shift.to_numpy()
    steps.to_parquet(path)
    return trace_dir


def test_host_work_per_request_is_learned_at_batch_one_and_paid_per_request_under_load(tmp_path):
    """A pass's host work is per request: batch 1 records it (`host_s`), a batched pass pays it per request."""
    truth = HostCost(TRUTH, 0.0, 0.0, per_request_s=0.001)
    reqs, prompts = _requests(10, "seq")
    batch1 = with_host_work(write_toy_trace(tmp_path / "b1", reqs, prompts, timed_by=TRUTH, system="seq"), 0.001)
    cost = calibrate_batch1(read_trace(batch1), HW, MODEL)
    assert np.isclose(cost.per_request_s + cost.per_stream_s, 0.001, rtol=0.05)  # one stream per request
    high = serving_trace(tmp_path / "high", "seq", rate=400.0, cost=truth)
    e = validate_load([high], batch1)["levels"][0]["errors"]
    assert e["e2e_p50_ape_percent"] < 2.0 and e["throughput_ape_percent"] < 2.0, e
    # without the host work, the same passes are much faster: the per-request term is what makes it fit
    plain = serving_trace(tmp_path / "plain", "seq", rate=400.0)
    assert read_trace(plain).requests["e2e_s"].median() < 0.9 * read_trace(high).requests["e2e_s"].median()


def test_every_pass_size_counts_once_in_the_fit():
    steps = np.array([[1, 10, 0.002, 1]] * 50 + [[1, 10, 0.009, 1]] + [[20, 200, 0.004, 1], [30, 300, 0.005, 1]])
    sizes = size_medians(steps)
    assert len(sizes) == 3 and np.allclose(sizes[:, 0], [1, 20, 30])
    assert np.isclose(sizes[0, 2], 0.002)  # one slow 1-row pass (another process took the core) is dropped


def test_pass_sizes_of_the_same_rows_apart_in_kv_read_stay_apart():
    """1-row decodes over 10 keys and over 1000 (two sizes: their KV reads differ more than twice),
    and 1-row decodes over 10 and 12 (one size): kills C12, the KV read left out of a size."""
    steps = np.array([[1, 10, 0.002, 1]] * 3 + [[1, 12, 0.002, 1]] * 2 + [[1, 1000, 0.006, 1]] * 3)
    sizes = size_medians(steps)
    assert sizes[np.argsort(sizes[:, 1])].tolist() == [[1, 10, 0.002, 1], [1, 1000, 0.006, 1]]


def test_a_rows_sweep_teaches_the_fit_how_batched_passes_grow(tmp_path):
    # this machine's batched passes (what the sweep timed) run their ops 4x slower than its batch-1 passes
    # suggest; the fit with the sweep predicts such a pass far closer than the batch-1 passes alone
    reqs, prompts = _requests(12, "seq")
    path = write_toy_trace(tmp_path / "b1", reqs, prompts, timed_by=TRUTH, system="seq")
    slow = CostModel(HW, MODEL, dataclasses.replace(CostParams.prior(HW).scaled(0.25, 0.25), step_overhead_s=0.002))
    sweep = [
        {"rows": r, "slots": s, "keys": r * s, "duration_s": float(slow.step_time_s(r, r * s, r))}
        for r in (1, 2, 4, 8, 16, 32)
        for s in (64, 256, 1024)
    ]
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "rows_sweep": {"passes": sweep}}))
    trace = read_trace(path)
    assert sweep_passes(trace.meta).shape == (18, 4) and sweep_passes({}).shape == (0, 4)
    with_sweep, without = calibrate_batch1(trace, HW, MODEL), calibrate_batch1(trace, HW, MODEL, rows_sweep=False)
    probe = (32, 32 * 1024, 32)

    def error(cost):
        return abs(cost.forward_s(*probe) / slow.step_time_s(*probe) - 1)

    assert error(with_sweep) < 0.1 < error(without)


def _two_request_passes(query_tokens: int = 1, batch_index: bool = True) -> list[dict]:
    """4 passes 2.25 ms apart, 2 requests of `query_tokens` rows each (batch_index -1: not batched)."""
    return [
        {
            "request_id": rid,
            "batch_index": b if batch_index else -1,
            "start_s": b * 0.00225,
            "duration_s": 0.0021,
            "forward_s": 0.002,
            "host_s": 0.0001,
            "query_tokens": query_tokens,
            "batch_query_tokens": 2 * query_tokens,
            "attention_kv_tokens": 64,
            "active_streams": 1,
            "chunk": False,
        }
        for b in range(4)
        for rid in (0, 1)
    ]


def test_pass_breakdown_splits_a_pass_into_forward_host_and_the_servers_own_work():
    """Each pass: 2 requests, 1 row each; forward 2 ms, host 0.1 ms per request, 0.05 ms of the server's own."""
    rows = _two_request_passes()
    trace = type("T", (), {"steps": pd.DataFrame(rows)})()
    cost = HostCost(LinearCost(), per_pass_s=5e-5, per_stream_s=0.0, per_request_s=1e-4)
    b = pass_breakdown(trace, cost)
    assert b.shape == (3, len(BREAKDOWN_COLUMNS))  # the last pass has no next one
    assert np.allclose(b[:, 0], 2) and np.allclose(b[:, 1], 0.002) and np.allclose(b[:, 3], 0.0002)
    assert np.allclose(b[:, 5], 0.00005) and np.allclose(b[:, 6], 5e-5) and np.allclose(b[:, 4], 2e-4)
    assert np.allclose(b[:, 2], LinearCost().step_time_s(2, 128, 2))
    no_forward = type("T", (), {"steps": pd.DataFrame(rows).assign(forward_s=np.nan)})()
    assert pass_breakdown(no_forward, cost).shape == (0, len(BREAKDOWN_COLUMNS))
    assert not b[:, 7].any()  # 1 row per request: decodes
    prefill = type("T", (), {"steps": pd.DataFrame(_two_request_passes(query_tokens=4))})()
    assert pass_breakdown(prefill, cost)[:, 7].all()  # 4 rows in a request's stream: multi-row
    batch1 = type("T", (), {"steps": pd.DataFrame(_two_request_passes(batch_index=False))})()
    assert pass_breakdown(batch1, cost).shape == (0, len(BREAKDOWN_COLUMNS))  # not a batched run


class _FlatForward:
    """A forward of 2 ms whatever the pass."""

    def step_time_s(self, query_tokens, kv_tokens_read, query_groups=1, logit_tokens=None):
        return np.full(np.shape(query_tokens), 0.002)


def test_pass_time_ratios_are_one_for_a_cost_that_matches_the_run():
    """Each pass measured start to next start (2.25 ms) against the forward (2 ms), the server's own
    work (0.05 ms) and each of its 2 requests' host work (0.1 ms each): 1 where the cost is right."""
    trace = type("T", (), {"steps": pd.DataFrame(_two_request_passes())})()
    cost = HostCost(_FlatForward(), per_pass_s=5e-5, per_stream_s=0.0, per_request_s=1e-4)
    ratios = pass_time_ratios(trace, cost)
    assert ratios.shape == (3, 2) and np.allclose(ratios[:, 0], 2) and np.allclose(ratios[:, 1], 1.0)
    batch1 = type("T", (), {"steps": pd.DataFrame(_two_request_passes(batch_index=False))})()
    assert pass_time_ratios(batch1, cost).shape == (0, 2)


def test_host_work_is_fitted_on_each_size_once_so_a_stall_does_not_carry_it():
    rows = np.array([1.0] * 200 + [12.0, 20.0, 30.0])
    host = 1e-4 + 5e-6 * rows  # a fixed part and a part per row
    host[7] = 0.035  # a 35 ms stall of one decode pass
    per_request, per_row, per_stream = host_terms(rows, np.ones_like(rows), host)
    assert per_request + per_stream + per_row == pytest.approx(1.05e-4, rel=1e-6)
    assert per_row == pytest.approx(5e-6, rel=1e-6)


def test_each_request_pays_its_host_work_in_every_pass_of_a_long_stretch(tmp_path):
    """200 passes of one request are costed in one vectorised call (over VECTOR_COST_FROM): each
    still pays its per-request host work, as a pass costed alone does."""
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 200), seq(4, 3)], [4, 4], arrivals=[0.0, 1000.0]))
    e2e = [
        replay(w, toy_part(), MODEL, ReplayConfig(), cost=HostCost(LinearCost(), 0.0, 0.0, per_request_s=r))
        .requests["e2e_s"]
        .to_numpy()
        for r in (0.0, 0.5)
    ]
    assert np.allclose(e2e[1] - e2e[0], [200 * 0.5, 3 * 0.5])


class _Admitting(LinearCost):
    """1 s a pass + 0.25 s a row, and 0.5 s of the server's work to take in each arrival."""

    admission_s = 0.5


def test_each_arrival_pays_its_admission_before_the_next_pass(tmp_path):
    # two requests far apart (an idle server each time), then two arriving together
    reqs, arrivals = [seq(4, 3)] * 4, [0.0, 100.0, 200.0, 200.0]
    w = load_workload(write_toy_trace(tmp_path / "t", reqs, [4] * 4, arrivals=list(arrivals)))
    part = toy_part()
    plain = replay(w, part, MODEL, ReplayConfig(max_seqs=4), cost=LinearCost()).requests
    admitted = replay(w, part, MODEL, ReplayConfig(max_seqs=4), cost=_Admitting()).requests
    gain = (admitted["ttft_s"] - plain["ttft_s"]).to_numpy()
    assert np.allclose(gain, [0.5, 0.5, 1.0, 1.0])  # the two that came together are taken in one after the other
    assert np.allclose((admitted["e2e_s"] - plain["e2e_s"]).to_numpy(), gain)
    # a closed loop (each request sent as the last one ends) pays it for every request too
    closed = [
        replay(w, part, MODEL, ReplayConfig(concurrency=1), cost=c).requests for c in (LinearCost(), _Admitting())
    ]
    assert np.allclose((closed[1]["ttft_s"] - closed[0]["ttft_s"]).to_numpy(), 0.5)


def test_admission_is_the_calibrations_queue_less_one_passs_own_work():
    requests = pd.DataFrame({"queue_s": [0.0004, 0.0005, 0.0006, np.nan]})
    trace = type("T", (), {"requests": requests})()
    assert admission_s(trace, per_pass_s=0.0001) == pytest.approx(0.0004)
    assert admission_s(type("T", (), {"requests": pd.DataFrame({"queue_s": [np.nan]})})(), 0.0001) == 0.0


def test_the_first_pass_after_the_server_idled_runs_as_much_slower_as_the_sweep_measured(tmp_path):
    meta = {
        "rows_sweep": {
            "after_idle": [
                {"rows": r, "slots": 64, "idle_s": idle, "busy_s": 1.0, "after_idle_s": f}
                for r, pairs in ((1, ((0.01, 1.1), (0.1, 1.3))), (24, ((0.01, 0.9), (0.1, 1.5))))
                for idle, f in pairs
            ]
        }
    }
    idle, factor = wake_factors(meta)
    assert idle == (0.01, 0.1) and factor == pytest.approx((1.0, 1.4))  # medians, at least 1, never falling
    assert wake_factors({}) == ((), ())
    cost = HostCost(LinearCost(), 0.0, 0.0, wake_idle_s=(0.01, 0.1), wake_factor=(1.2, 1.4))
    assert cost.after_idle(0.0) == 1.0 and cost.after_idle(0.005) == pytest.approx(1.1)
    assert cost.after_idle(0.055) == pytest.approx(1.3) and cost.after_idle(10.0) == pytest.approx(1.4)

    class Waking(LinearCost):
        def after_idle(self, idle_s):
            return 2.0 if idle_s > 0 else 1.0

    # one request at 0 (the engine had not idled), one at 100 s (after an idle wait): only its first pass doubles
    w = load_workload(write_toy_trace(tmp_path / "t", [seq(4, 3)] * 2, [4] * 2, arrivals=[0.0, 100.0]))
    plain = replay(w, toy_part(), MODEL, ReplayConfig(), cost=LinearCost()).requests
    woken_res = replay(w, toy_part(), MODEL, ReplayConfig(), cost=Waking())
    woken = woken_res.requests
    starts, durations = woken_res.rows.pass_start_s, woken_res.rows.pass_duration_s
    assert len(starts) == 6 and starts[3] == 100.0  # the second request's 3 passes start when it arrives
    assert np.allclose(starts[4:], starts[3:5] + durations[3:5], rtol=1e-12)  # each after the slower first one
    first = LinearCost().step_time_s(4, 0)  # the 4-row prefill: 1 s + 4 x 0.25 s
    assert woken["ttft_s"].iloc[0] == pytest.approx(plain["ttft_s"].iloc[0])
    assert woken["ttft_s"].iloc[1] == pytest.approx(plain["ttft_s"].iloc[1] + first)
    assert woken["e2e_s"].iloc[1] == pytest.approx(plain["e2e_s"].iloc[1] + first)


def test_summarize_run_uses_vllms_definitions():
    """Requests arriving at 10, 11, 12 s; the third failed. TPOT = (E2E - TTFT) / (output tokens - 1);
    the duration runs from the first arrival (3.2 s) for every throughput and the goodput."""
    s = summarize_run([10.0, 11.0, 12.0], [0.1, 0.2, np.nan], [1.1, 2.2, np.nan], [11, 21, 5], slo_ttft_ms=150.0)
    assert s["tpot_p50_ms"] == pytest.approx(100.0) and s["ttft_p50_ms"] == pytest.approx(150.0)
    assert s["e2e_p99_ms"] == pytest.approx(1100 + 0.99 * 1100)
    assert s["output_throughput"] == pytest.approx(32 / 3.2) and s["request_throughput"] == pytest.approx(2 / 3.2)
    assert s["request_goodput"] == pytest.approx(1 / 3.2) and s["slo_attained_percent"] == pytest.approx(100 / 3)


def test_serving_settings_precedence():
    """meta["serving"] (what the runtime records) over meta["knobs"]; a pool in bytes over one in MiB;
    the runtime's rate_per_s read as the load level's rate; the reserve mode read."""
    c = serving_config(
        {
            "knobs": {"max_seqs": 2, "kv_budget_mib": 1},
            "serving": {"max_seqs": 6, "pool_bytes": 4096, "reserve": "peak"},
        },
        MODEL,
    )
    assert (c.max_seqs, c.kv_capacity_bytes, c.reserve) == (6, 4096, "peak")
    assert load_level({"serving": {"rate_per_s": 4.0, "concurrency": None}}) == {"rate": 4.0, "concurrency": None}
    assert load_level({"knobs": {"rate": 2.0}, "serving": {"rate": 3.0}})["rate"] == 3.0


def test_errors_compare_requests_measured_with_a_positive_time():
    """A request measured at 0 s (not timed) is left out of both sides; the p99 error is the p99's;
    a throughput measured as 0 has no percentage error (NaN), not a division by zero."""
    from simulator.load_validation import _compare

    def figures(ttft: list[float], throughput: float) -> dict:
        v = np.array(ttft)
        return {"ttft": v, "tpot": v, "e2e": v, "output_throughput": throughput, "request_throughput": throughput}

    measured, simulated, errors = _compare(figures([0.0, 1.0, 2.0], 0.0), figures([5.0, 2.0, 2.0], 3.0))
    assert measured["ttft_p50_ms"] == pytest.approx(1500.0) and simulated["ttft_p50_ms"] == pytest.approx(2000.0)
    assert errors["ttft_p50_ape_percent"] == pytest.approx(100 / 3)
    assert errors["ttft_p99_ape_percent"] == pytest.approx((2.0 / 1.99 - 1) * 100)
    assert errors["ttft_mape_percent"] == pytest.approx(50.0)
    assert np.isnan(errors["throughput_ape_percent"])


def test_preemptions_counted_by_the_runtime_or_from_replay_events():
    from simulator.load_validation import _preemptions

    counted = type("T", (), {"path": "t", "requests": pd.DataFrame({"preemptions": [1, 2], "events": ["[]", "[]"]})})()
    assert _preemptions(counted) == 3
    events = json.dumps([{"event": "preempted"}, {"event": "finished"}, {"event": "preempted"}])
    replayed = type(
        "T", (), {"path": "t", "requests": pd.DataFrame({"preemptions": [0, 0], "events": [events, "[]"]})}
    )()
    assert _preemptions(replayed) == 2


def test_a_simulated_trace_is_not_validated_against(tmp_path):
    """Validation compares with what was measured: a simulated trace on either side is refused."""
    reqs, prompts = _requests(4, "seq")
    batch1 = write_toy_trace(tmp_path / "b1", reqs, prompts, timed_by=TRUTH)
    w = load_workload(batch1)
    simulated = write_simulated_trace(replay(w, HW, MODEL, ReplayConfig(memory_utilization=1.0)), tmp_path / "sim")
    for serving, calibration in ((simulated, batch1), (batch1, simulated)):
        with pytest.raises(ValueError, match="validate needs measured traces, this one is simulated"):
            validate_load([serving], calibration)


def test_pass_time_error_is_the_mean_over_passes_of_the_forward_where_timed():
    """Five batch-1 passes against a flat 2 ms forward: four timed apart (forward_s 1, 2, 2, 4 ms:
    errors 100 %, 0, 0, 50 %), one not (NaN: its whole pass, 2.5 ms, 20 %). The mean is 34 %; the
    median (20 %) or the whole passes (5 ms each, 60 %) would be another figure (kills L12)."""
    from simulator.load_validation import _pass_time_mape

    forward = [0.001, 0.002, 0.002, 0.004, np.nan]
    steps = pd.DataFrame(
        {
            "request_id": 0,
            "batch_index": -1,
            "step_index": range(5),
            "start_s": [0.01 * i for i in range(5)],
            "duration_s": [0.005] * 4 + [0.0025],
            "forward_s": forward,
            "host_s": 0.0001,
            "query_tokens": [4, 1, 1, 1, 1],
            "attention_kv_tokens": [4, 5, 6, 7, 8],
            "active_streams": 1,
        }
    )
    trace = type("T", (), {"steps": steps})()
    passes, mape = _pass_time_mape(trace, HostCost(_FlatForward(), 0.0, 0.0))
    assert passes.shape == (5, len(PASS_COLUMNS))
    assert mape == pytest.approx((100 + 0 + 0 + 50 + 20) / 5)


def test_errored_requests_stay_out_of_the_measured_figures(tmp_path):
    """A serving run whose request 3 failed (the KV pool) after waiting 50 times the longest E2E:
    the measured latencies, throughputs and goodput count the other requests only, computed here
    from the requests table itself (kills L21: errored requests' times leaking into the figures)."""
    from simulator.load_validation import validate_one

    out = serving_trace(tmp_path / "s", "seq", rate=50.0, n=8)
    df = pd.read_parquet(out / "requests.parquet")
    late = 50 * df["e2e_s"].max()
    df.loc[3, ["status", "stop_reason", "error", "ttft_s", "e2e_s"]] = [
        "error",
        "kv_pool",
        "request 3: no room",
        late,
        late,
    ]
    df.to_parquet(out / "requests.parquet", index=False)
    good = df[df["status"] != "error"]
    assert len(good) == 7
    duration = (good["arrival_s"] + good["e2e_s"]).max() - df["arrival_s"].min()
    # a TPOT SLO every request meets; the failed one too (no TPOT: it reads as 0), were it counted
    lv = validate_one(read_trace(out), HostCost(TRUTH, 0.0, 0.0), HW, MODEL, slo_tpot_ms=1e6)
    m = lv["measured"]
    assert m["e2e_p50_ms"] == pytest.approx(np.median(good["e2e_s"]) * 1e3)
    assert m["e2e_p99_ms"] == pytest.approx(np.percentile(good["e2e_s"], 99) * 1e3)
    assert m["ttft_p99_ms"] == pytest.approx(np.percentile(good["ttft_s"], 99) * 1e3)
    assert m["output_throughput"] == pytest.approx(good["output_tokens"].sum() / duration)
    assert m["request_throughput"] == pytest.approx(7 / duration)
    assert m["request_goodput"] == pytest.approx(7 / duration) and m["slo_attained_percent"] == pytest.approx(87.5)


def _gapped_steps(gap, streams_of, requests=(0, 1), n=6, apart_s=5.0) -> pd.DataFrame:
    """Batch-1 steps: `requests` run `apart_s` apart, `n` passes each of 2 ms, pass i of `streams_of(i)`
    streams followed by `gap(streams)` of host time before the request's next pass."""
    rows = []
    for k, rid in enumerate(requests):
        t = k * apart_s
        for i in range(n):
            g = streams_of(i)
            rows.append({"request_id": rid, "step_index": i, "start_s": t, "duration_s": 0.002, "active_streams": g})
            t += 0.002 + gap(g)
    return pd.DataFrame(rows)


def test_host_line_takes_each_requests_own_gaps_in_step_order():
    """1 ms + 0.5 ms per stream between a request's passes, a pass of no active stream paying for
    one; rows stored shuffled, the requests 5 s apart: the line is still 1 ms + 0.5 ms (kills C01,
    no sort by request and step; C02, streams not floored at 1; C03, the gap from one request's
    last pass to the next request's first taken as host time)."""
    steps = _gapped_steps(lambda g: 0.001 + 0.0005 * max(g, 1), lambda i: (0, 1, 2, 3, 2, 1)[i])
    shuffled = steps.sample(frac=1.0, random_state=3).reset_index(drop=True)
    per_pass, per_stream = host_line(type("T", (), {"steps": shuffled})())
    assert per_pass == pytest.approx(0.001) and per_stream == pytest.approx(0.0005)


def test_host_line_reads_overlapping_passes_as_no_host_time():
    """Each pass starting 1 ms before the last one ended (clock skew) is no host time, not a
    negative one (kills C04, the gaps not floored at 0)."""
    steps = _gapped_steps(lambda g: -0.001, lambda i: 1, requests=(0,))
    assert host_line(type("T", (), {"steps": steps})()) == (0.0, 0.0)


def test_host_line_falls_back_to_the_median_per_stream():
    """One stream count (no line to fit) or a line falling with the streams: all of the host time
    is per stream, the median gap over the median count (a 100 ms stall left out); no gaps: none
    (kills C05, a line fitted through a single x; C06, a negative slope kept; C07, means for
    medians; C40, a slope made up for no gaps)."""
    from simulator.load_calibration import _line

    one_x = _line(np.array([2.0] * 4), np.array([0.002, 0.002, 0.002, 0.1]))
    assert one_x == (0.0, pytest.approx(0.001))
    falling = _line(np.array([1.0, 2.0, 3.0]), np.array([0.003, 0.002, 0.001]))
    assert falling == (0.0, pytest.approx(0.001))
    assert _line(np.zeros(0), np.zeros(0)) == (0.0, 0.0)


def test_wake_factors_are_the_median_per_sleep_at_least_one_never_falling():
    """Three shapes per slept time: medians 0.9, 1.3, 1.2 (means 0.88, 1.5, 1.17) read as 1.0,
    1.3, 1.3 (kills C27, the mean per sleep; C28, a factor below 1 kept; C29, a factor that falls
    with the time slept kept)."""
    ratios = {0.01: (0.8, 0.9, 0.95), 0.05: (1.2, 1.3, 2.0), 0.1: (1.1, 1.2, 1.2)}
    rows = [
        {"rows": r, "slots": 64, "idle_s": idle, "busy_s": 0.002, "after_idle_s": 0.002 * f}
        for idle, fs in ratios.items()
        for r, f in zip((1, 8, 24), fs)
    ]
    idle, factor = wake_factors({"rows_sweep": {"after_idle": rows[::-1]}})
    assert idle == (0.01, 0.05, 0.1) and factor == pytest.approx((1.0, 1.3, 1.3))


def test_admission_is_never_negative():
    """A queue shorter than one pass's own work is no admission work (kills C31, the floor at 0)."""
    trace = type("T", (), {"requests": pd.DataFrame({"queue_s": [0.0001, 0.0002, 0.0001]})})()
    assert admission_s(trace, per_pass_s=0.0005) == 0.0


def test_pass_overhead_is_the_median_left_of_a_requests_consecutive_passes():
    """Request 0: 5 passes 2.15 ms apart (2 ms forward, 0.1 ms host, 0.05 ms the server's own) but
    one held 1 ms more, with two rows that computed nothing (no forward, no host time) between
    them; requests 1-4 one pass each, 1 s apart. The server's own work is 0.05 ms (kills C32, rows
    of no query tokens kept; C33, the host work not taken off; C34, the gap from one request to
    the next taken as the server's work; C35, the mean for the median)."""
    from simulator.load_calibration import pass_overhead_s

    def row(rid, i, start, q=1):
        timed = q > 0
        return {
            "request_id": rid,
            "step_index": i,
            "start_s": start,
            "query_tokens": q,
            "forward_s": 0.002 if timed else np.nan,
            "host_s": 0.0001 if timed else np.nan,
        }

    starts = np.cumsum([0.0, 0.00215, 0.00215, 0.00315, 0.00215])
    rows = [row(0, 2 * i, t) for i, t in enumerate(starts)] + [row(0, 1, 0.001, q=0), row(0, 5, 0.0044, q=0)]
    rows += [row(rid, 0, float(rid)) for rid in (1, 2, 3, 4)]
    trace = type("T", (), {"steps": pd.DataFrame(rows)})()
    assert pass_overhead_s(trace) == pytest.approx(0.00005)


def test_pass_host_s_only_where_every_pass_records_it():
    from simulator.load_calibration import pass_host_s

    assert np.allclose(pass_host_s(pd.DataFrame({"host_s": [1e-4, 2e-4]})), [1e-4, 2e-4])
    assert pass_host_s(pd.DataFrame({"host_s": [1e-4, np.nan]})) is None  # kills C08: any() for all()
    assert pass_host_s(pd.DataFrame({"host_s": np.zeros(0)})) is None


def test_host_work_is_per_stream_and_per_row_each_on_its_own_count():
    """8 rows in 2 streams: 2 x 10 ms + 8 x 1 ms of host work, and 5 ms of the server's own per pass
    on top of the forward (kills C10, the per-pass term dropped; C11, rows and streams swapped)."""
    cost = HostCost(LinearCost(), per_pass_s=0.005, per_stream_s=0.01, per_row_s=0.001)
    assert cost.host_work_s(8, 2) == pytest.approx(0.028)
    assert cost.step_time_s(8, 0, 2) == pytest.approx(LinearCost().step_time_s(8, 0, 2) + 0.005 + 0.028)


def test_calibration_refuses_an_unknown_fit_and_too_few_passes(tmp_path):
    """A forward fit not in FORWARD_FITS (kills C14) and a trace of 3 passes (kills C15: the
    bound lowered) are one UsageError each, not a fit."""
    from profiler.errors import UsageError

    three = read_trace(write_toy_trace(tmp_path / "three", [seq(4, 3)], [4], timed_by=TRUTH))
    with pytest.raises(UsageError, match="the calibration trace has 3 forward passes; need >= 4"):
        calibrate_batch1(three, HW, MODEL)
    four = read_trace(write_toy_trace(tmp_path / "four", [seq(4, 4)], [4], timed_by=TRUTH))
    with pytest.raises(UsageError, match="forward fit 'guess': choose one of auto, sweep, line, roofline"):
        calibrate_batch1(four, HW, MODEL, forward_fit="guess")
    assert calibrate_batch1(four, HW, MODEL).per_pass_s >= 0


SIZES = [(8, 1), (1, 1), (2, 2), (3, 3), (3, 1), (4, 2), (1, 1), (1, 1), (16, 1), (2, 1)]  # (rows, streams) per pass


def _forward_s(rows):
    return 0.001 + 0.0001 * np.asarray(rows, float)  # 1 ms + 0.1 ms a row


def _calibration_trace(timed=True, host_s=None, extra_s=0.0002, device="cpu", sweep=None, queue_s=0.00055):
    """A batch-1 calibration, one request's passes of SIZES, KV read 10 keys a row: forward
    `_forward_s`, host work 0.1 ms + 0.01 ms a row + 0.05 ms a stream (or `host_s`), the pass
    `extra_s` longer than both, and 0.05 ms of the server's own work before the next pass;
    `timed`: the forward timed apart (forward_s), else NaN (schema minor 2)."""
    rows, streams = (np.array(c, float) for c in zip(*SIZES))
    host = 0.0001 + 0.00001 * rows + 0.00005 * streams if host_s is None else np.full(len(rows), host_s)
    forward = _forward_s(rows) if timed else np.nan
    return batch1_trace(rows, streams, _forward_s(rows) + host + extra_s, host, forward, device, sweep, queue_s)


def batch1_trace(rows, streams, duration, host, forward, device="cpu", sweep=None, queue_s=0.00055):
    """One request's batch-1 passes (`rows` query rows and `streams` streams each, 10 keys a row),
    each `duration` long with `host` of host work and `forward` of forward (NaN: not timed apart or
    not recorded), 0.05 ms of the server's own work between passes, `queue_s` queued; `sweep`: a
    rows sweep's passes in its meta."""
    steps = pd.DataFrame(
        {
            "request_id": 0,
            "step_index": range(len(rows)),
            "batch_index": -1,
            "query_tokens": np.asarray(rows).astype(int),
            "attention_kv_tokens": (10 * np.asarray(rows)).astype(int),
            "active_streams": np.asarray(streams).astype(int),
            "start_s": np.r_[0.0, np.cumsum(duration + 0.00005)[:-1]],
            "duration_s": duration,
            "host_s": host,
            "forward_s": forward,
        }
    )
    meta = {"device": {"type": device}, **({"rows_sweep": {"passes": sweep}} if sweep else {})}
    requests = pd.DataFrame({"request_id": [0], "queue_s": [queue_s]})
    return type("T", (), {"steps": steps, "meta": meta, "requests": requests, "path": "cal"})()


def test_calibration_on_timed_passes_splits_forward_host_and_the_servers_own_work():
    """Timed passes: the forward as timed (not the pass less its host work: the pass holds 0.2 ms
    more, kills C18); the host terms per request, row and stream on their own counts (kills C19,
    rows taken for streams); the server's own work per pass the 0.2 ms + 0.05 ms left (kills
    C24, the line over gaps between passes); admission the queue less that (0.3 ms)."""
    from simulator.measured_forward import LineForward

    cost = calibrate_batch1(_calibration_trace(), HW, MODEL, rows_sweep=False)
    assert isinstance(cost.forward, LineForward)
    q = np.array([1.0, 4.0, 16.0])
    assert np.allclose(cost.forward_s(q, 10 * q, 1), _forward_s(q), rtol=1e-3)
    terms = (cost.per_request_s, cost.per_row_s, cost.per_stream_s)
    assert np.allclose(terms, (0.0001, 0.00001, 0.00005), rtol=1e-6, atol=1e-12)
    assert cost.per_pass_s == pytest.approx(0.00025) and cost.admission_s == pytest.approx(0.0003)


def test_calibration_on_untimed_passes_keeps_at_least_half_of_each_pass_as_forward():
    """Passes without a timed forward and 3 ms of host work each: the forward is the pass less its
    host work but at least half the pass, (forward + 3 ms) / 2 here (kills C17, the floor
    dropped); no admission where the forward was not timed (kills C25)."""
    from simulator.measured_forward import LineForward

    cost = calibrate_batch1(_calibration_trace(timed=False, host_s=0.003, extra_s=0.0), HW, MODEL, rows_sweep=False)
    assert isinstance(cost.forward, LineForward) and cost.admission_s == 0.0
    q = np.array([1.0, 4.0, 16.0])
    assert np.allclose(cost.forward_s(q, 10 * q, 1), (_forward_s(q) + 0.003) / 2, rtol=1e-3)


def _sweep(row_counts):
    return [
        {"rows": r, "keys": r * span, "duration_s": float(_forward_s(r)) + 1e-7 * r * span}
        for r in row_counts
        for span in (64, 256, 1024)
    ]


def test_the_forward_fit_auto_takes_a_sweep_of_two_row_counts_on_a_cpu_trace_only():
    """auto: on a CPU trace, the sweep where it has >= 2 row counts (carried by the trace's own
    passes, kills C23), else a line (kills C22: one row count); a GPU trace validated on a CPU part
    gets the roofline (kills C21: the trace's device left unchecked)."""
    from simulator.measured_forward import LineForward, SweepForward

    swept = calibrate_batch1(_calibration_trace(sweep=_sweep([1, 4, 16])), HW, MODEL)
    assert isinstance(swept.forward, SweepForward) and "carried by 10 own passes" in swept.source
    one = calibrate_batch1(_calibration_trace(sweep=_sweep([4])), HW, MODEL)
    assert isinstance(one.forward, LineForward)
    gpu = calibrate_batch1(_calibration_trace(device="cuda"), HW, MODEL, rows_sweep=False)
    assert isinstance(gpu.forward, CostModel)


def test_the_line_forward_is_fitted_on_each_pass_size_once():
    """30 more 1-row passes, 14 of them held to 4 ms by another process (under half: the size's
    median is the true forward): the line is still the forward, where a fit over every pass is
    pulled by them (kills C20, the passes fitted instead of the sizes' medians)."""
    from simulator.measured_forward import LineForward

    trace = _calibration_trace()
    more = trace.steps[trace.steps["query_tokens"] == 1].iloc[[0] * 30].copy()
    more["forward_s"] = np.where(np.arange(30) < 14, 0.004, more["forward_s"])
    trace.steps = pd.concat([trace.steps, more], ignore_index=True).assign(step_index=lambda s: range(len(s)))
    cost = calibrate_batch1(trace, HW, MODEL, rows_sweep=False)
    q = np.array([1.0, 4.0, 16.0])
    assert isinstance(cost.forward, LineForward)
    assert np.allclose(cost.forward_s(q, 10 * q, 1), _forward_s(q), rtol=1e-4)


@pytest.mark.parametrize(
    "events,says",
    [
        ("[{bad", "not valid JSON \\(Expecting property name"),
        ("[" * 100000, "not valid JSON \\(nested too deeply\\)"),
        ("9" * 5000, "not valid JSON \\(an integer of more than 4300 digits\\)"),
        ("5", "not a JSON list of event objects"),
        ("[1]", "not a JSON list of event objects"),
        ('{"event": "preempted"}', "not a JSON list of event objects"),
    ],
)
def test_events_that_are_no_list_of_event_objects_are_one_trace_error(events, says):
    """Was: json's JSONDecodeError (or a TypeError, AttributeError) out of `solm validate
    --calibrate-from`, exit 1, for a serving trace whose requests.events is not a list of events."""
    from profiler.errors import TraceError
    from simulator.load_validation import _preemptions

    requests = pd.DataFrame({"request_id": [7, 9], "preemptions": [0, 0], "events": ["[]", events]})
    trace = type("T", (), {"requests": requests, "path": "serving"})()
    with pytest.raises(TraceError, match=f"serving: requests.events of request 9: {says}"):
        _preemptions(trace)


def test_sweep_passes_are_fit_rows_of_one_stream_per_row():
    """A rows sweep's pass of R rows is R requests' decodes: R streams (kills C38, one stream)."""
    passes = [
        {"rows": 4, "slots": 64, "keys": 256, "duration_s": 0.002},
        {"rows": 16, "keys": 1024, "duration_s": 0.003},
    ]
    assert sweep_passes({"rows_sweep": {"passes": passes}}).tolist() == [[4, 256, 0.002, 4], [16, 1024, 0.003, 16]]
    assert sweep_passes({}).shape == sweep_passes({"rows_sweep": {"passes": []}}).shape == (0, 4)


def test_a_load_run_whose_attention_ran_otherwise_than_the_calibration_is_flagged(tmp_path, capsys):
    """Each level names how its attention ran (meta.device.sdpa; a trace without it ran PyTorch's
    own choice, `auto`); one that differs from the calibration's gets a warning, printed by solm
    validate on stderr."""
    reqs, prompts = _requests(6, "seq")
    batch1 = write_toy_trace(tmp_path / "b1", reqs, prompts, timed_by=TRUTH, system="seq")
    same = serving_trace(tmp_path / "same", "seq", rate=20.0)
    other = serving_trace(tmp_path / "other", "seq", rate=20.0)
    meta = json.loads((other / "meta.json").read_text())
    meta.setdefault("device", {})["sdpa"] = "efficient"
    (other / "meta.json").write_text(json.dumps(meta))
    v = validate_load([same, other], batch1)
    assert v["sdpa"] == "auto" and [lv["sdpa"] for lv in v["levels"]] == ["auto", "efficient"]
    (warning,) = v["warnings"]
    assert str(other) in warning and "'efficient'" in warning and "'auto'" in warning
    assert validate_load([same], batch1)["warnings"] == []
    assert main(["validate", "--calibrate-from", str(batch1), str(same), str(other)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"solm validate: warning: {warning}"]
