"""A part's own GEMM calibration: `solm calibrate` fits the tile model to measured GEMMs (here
XLA's measured H100 table), the held-out figures judge it, and `--gemm-calibration` makes `solm
cost` and `solm simulate` use it; bad tables and files are one line and exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.errors import UsageError
from simulator.cost import CostModel, default_params
from simulator.gemm import GemmParams, gemm_kernel
from simulator.gemm_calibration import MIN_ROWS, read_calibration, read_gemm_table, with_gemm_calibration
from simulator.gemm_transfer import XLA_DIR
from simulator.hardware import get_hardware
from simulator.models import get_model
from solm.cli import main
from tests.benches import load_bench
from tests.paths import check_not_a_file

ROOT = Path(__file__).resolve().parents[2]
H100_TABLE = XLA_DIR / "h100-sxm.csv"
GOOD_HEADER = "m,n,k,time_us\n"


def _good_rows(count: int = 8) -> str:
    return "".join(f"{64 * (i + 1)},4096,4096,{10 + 3 * i}\n" for i in range(count))


@pytest.fixture(scope="module")
def h100_calibration(tmp_path_factory) -> tuple[Path, dict]:
    """`solm calibrate` on XLA's H100 table, run once: (file written, the command's JSON line)."""
    out = tmp_path_factory.mktemp("cal") / "h100.json"
    code = main(["calibrate", str(H100_TABLE), "--hardware", "h100-sxm", "--out", str(out), "--json"])
    assert code == 0 and out.is_file()
    return out, json.loads(out.read_text())


def test_calibration_beats_the_carried_fit_on_shapes_it_did_not_see(h100_calibration):
    out, data = h100_calibration
    held = data["heldout"]
    assert data["format"] == "solm-gemm-calibration" and data["hardware"] == "h100-sxm"
    assert data["rows"] == 125 and data["shapes"] == 25
    assert held["fitted"]["n"] == held["carried"]["n"] == 125
    # fitted on half of the (K, N) shapes, scored on the other half: better than the A100 fit the
    # simulator carries to the part by physics, on the median and the p90
    assert held["fitted"]["median"] < held["carried"]["median"]
    assert held["fitted"]["p90"] < held["carried"]["p90"]
    assert 0 < data["in_sample"]["median"] <= held["fitted"]["median"] + 1.0
    hardware, params = read_calibration(out)
    assert hardware == "h100-sxm" and params == GemmParams.from_json(data["params"])


def test_cost_and_simulate_use_the_calibration(h100_calibration, capsys, tmp_path):
    out, data = h100_calibration
    params = GemmParams.from_json(data["params"])
    base = get_hardware("h100-sxm")
    calibrated = with_gemm_calibration(base, out)
    assert default_params(calibrated).gemm == params and default_params(base).gemm != params
    model = get_model("llama-3-8b")
    ops = CostModel(calibrated, model).op_times_s(4096, 4096 * 4097 // 2, 1)
    k, n = 4096, 2 * 14336
    assert ops["mlp_up_proj"] == pytest.approx(float(gemm_kernel(4096, k, n, base, params).time_s))

    def up_proj_ms(extra: list[str]) -> float:
        args = ["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--tokens", "4096", "--json", *extra]
        assert main(args) == 0
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        return next(op["time_ms"] for op in result["ops"] if op["op"] == "mlp_up_proj")

    assert up_proj_ms(["--gemm-calibration", str(out)]) == pytest.approx(ops["mlp_up_proj"] * 1e3)
    assert up_proj_ms([]) != pytest.approx(ops["mlp_up_proj"] * 1e3)

    trace = ROOT / "traces" / "sequential-reverse_words"
    args = ["simulate", str(trace), "--hardware", "h100-sxm", "--model", "llama-3-8b", "--rate", "8"]
    assert main([*args, "--num-requests", "20", "--gemm-calibration", str(out)]) == 0
    text = capsys.readouterr().out
    assert "GEMMs           the tile model fitted on GEMMs measured on h100-sxm: " in text
    figures = json.loads(text.strip().splitlines()[-1])
    assert figures["gemm_calibration"] == str(out) and figures["gemm_calibration_part"] == "h100-sxm"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("m,n,k\n" + "64,64,64\n" * 8, "needs columns m, n, k and one of"),
        ("m,n,time_us\n" + "64,64,5\n" * 8, "needs columns m, n, k"),
        (GOOD_HEADER + _good_rows(7).replace("10\n", "x\n", 1), "row 1: time_us must be a positive number"),
        (GOOD_HEADER + "-64,4096,4096,10\n" + _good_rows(7), "row 1: m must be a positive number, got '-64'"),
        (GOOD_HEADER + "64.5,4096,4096,10\n" + _good_rows(7), "row 1: m must be a whole number"),
        # was: the 5,000-digit cell quoted whole, an error line of 5,000 characters
        (GOOD_HEADER + "9" * 5000 + ",4096,4096,10\n" + _good_rows(7), "got '" + "9" * 59 + "... (5002 characters)"),
        (GOOD_HEADER + _good_rows(7).replace(",10\n", ",inf\n"), "row 1: time_us must be a positive number"),
        (GOOD_HEADER + _good_rows(MIN_ROWS - 1), f"a calibration needs at least {MIN_ROWS}"),
        (GOOD_HEADER, "no GEMMs"),
        ("", "not a CSV table of GEMMs"),
        ("m,n,k,time_s,dtype\n" + "64,64,64,1e-5,float32\n" * 8, "dtype float32: the tile model is fitted on 16-bit"),
        # was: 2mnk / 1e-300 overflowed to an infinite time, and scipy's "Residuals are not finite" an internal error
        (
            "m,n,k,bf16_flops_per_s\n" + "4096,4096,4096,1e12\n" * 7 + "4096,4096,4096,1e-300\n",
            "row 8: bf16_flops_per_s '1e-300' gives the 4096x4096x4096 GEMM (M x K x N) no finite time",
        ),
        # was: every column named, a header of 1,000 names (or a binary file's) an error line as long
        (",".join(f"c{i}" for i in range(1000)) + "\n", "found c0, c1, c2, c3, c4, c5, c6, c7, ... (1000 columns)"),
    ],
)
def test_bad_tables_are_one_line_exit_2(tmp_path, capsys, text, needle):
    table = tmp_path / "gemms.csv"
    table.write_text(text)
    before = table.read_bytes()
    out = tmp_path / "cal.json"
    code = main(["calibrate", str(table), "--hardware", "h100-sxm", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("solm calibrate: error:"), err
    assert needle in err[0]
    assert not out.exists() and table.read_bytes() == before


def test_table_path_that_is_not_a_file(tmp_path):
    check_not_a_file(read_gemm_table, tmp_path)


def test_flops_column_and_time_units_agree(tmp_path):
    """A table in achieved FLOP/s (XLA's) and the same GEMMs in us read to the same seconds."""
    rows = read_gemm_table(H100_TABLE)
    table = tmp_path / "us.csv"
    us = rows["time_s"].to_numpy() * 1e6
    lines = [
        f"{int(m)},{int(n)},{int(k)},{float(t)!r}" for m, n, k, t in zip(rows["num_tokens"], rows["N"], rows["K"], us)
    ]
    table.write_text("M,N,K,time_us\n" + "\n".join(lines) + "\n")
    again = read_gemm_table(table)
    assert np.allclose(again["time_s"], rows["time_s"], rtol=1e-12)


def test_out_is_never_an_existing_file_or_the_input(tmp_path, capsys):
    table = tmp_path / "gemms.csv"
    shutil.copy(H100_TABLE, table)
    before = table.read_bytes()
    existing = tmp_path / "cal.json"
    existing.write_text("the user's notes\n")
    for out in (table, existing):
        code = main(["calibrate", str(table), "--hardware", "h100-sxm", "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert ("is the input" if out == table else "exists (pass --force") in err[0], err
    assert table.read_bytes() == before and existing.read_text() == "the user's notes\n"


def test_a_part_without_a_chip_layout_is_refused(tmp_path, capsys):
    table = tmp_path / "gemms.csv"
    table.write_text(GOOD_HEADER + _good_rows())
    code = main(["calibrate", str(table), "--hardware", "host-cpu", "--out", str(tmp_path / "cal.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "has no chip layout" in err[0]


@pytest.mark.parametrize(
    "content,needle",
    [
        ("not json", "not valid JSON"),
        # were: json's ValueError and a RecursionError, internal errors (exit 1)
        ('{"format": ' + "9" * 5000 + "}", "not valid JSON (an integer of more than 4300 digits)"),
        ('{"format": ' + "[" * 100000 + "]" * 100000 + "}", "not valid JSON (nested too deeply)"),
        ('{"format": "something-else"}', "not a solm GEMM calibration"),
        ('{"format": "solm-gemm-calibration", "version": 99, "params": {}}', "version 99"),
        (
            '{"format": "solm-gemm-calibration", "version": 1, "params": {"tensor_eff": 0.8}}',
            "params must name exactly",
        ),
        ("BAD_RANGE", "GemmParams.tensor_eff out of range"),
        ("BAD_NAN", "params must be finite numbers"),
    ],
)
def test_bad_calibration_files_are_one_line_exit_2(tmp_path, capsys, content, needle):
    good = GemmParams().to_json()
    if content == "BAD_RANGE":
        content = json.dumps({"format": "solm-gemm-calibration", "version": 1, "params": {**good, "tensor_eff": 2.0}})
    if content == "BAD_NAN":
        content = json.dumps({"format": "solm-gemm-calibration", "version": 1, "params": {**good, "memory_eff": None}})
    cal = tmp_path / "cal.json"
    cal.write_text(content)
    for command in (
        ["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gemm-calibration", str(cal)],
        ["simulate", str(ROOT / "traces" / "sequential-reverse_words"), "--hardware", "h100-sxm"]
        + ["--gemm-calibration", str(cal)],
    ):
        code = main(command)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(f"solm {command[0]}: error:"), err
        assert needle in err[0]


def test_gemm_fit_is_not_a_set_field(capsys):
    code = main(["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--set", "gemm_fit=3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "gemm_fit takes (field, number) pairs" in err[0]


def test_gemm_profile_writes_a_table_calibrate_reads(tmp_path):
    """bench/gemm_profile.py's CPU path: every GEMM of the grid timed, in the format read back."""
    gemm_profile = load_bench("gemm_profile")
    out = tmp_path / "cpu.csv"
    args = ["--m", "1,8", "--n", "64,128", "--k", "64,96", "--dtype", "bfloat16", "--device", "cpu"]
    assert gemm_profile.main([*args, "--iters", "2", "--trials", "2", "--out", str(out)]) == 0
    rows = read_gemm_table(out)
    assert len(rows) == 8 and (rows["time_s"] > 0).all()
    assert sorted(set(rows["num_tokens"])) == [1, 8] and sorted(set(rows["K"])) == [64, 96]
    assert set(pd.read_csv(out)["timer"]) == {"wall"}  # the CPU's timer, said in the table
    with pytest.raises(SystemExit, match="exists"):
        gemm_profile.main([*args, "--out", str(out)])
    with pytest.raises(SystemExit, match="--timer graph needs a CUDA device"):
        gemm_profile.main([*args, "--timer", "graph", "--out", str(tmp_path / "graph.csv")])
    assert not (tmp_path / "graph.csv").exists()


def test_gemm_profile_kernels_column_names_what_each_gemm_ran(tmp_path):
    """`--kernels`: one more column, the operators one call ran on the CPU (aten::mm), which
    `solm calibrate`'s reader ignores; no column without the flag."""
    gemm_profile = load_bench("gemm_profile")
    args = ["--m", "1,8", "--n", "64,128", "--k", "64,96", "--device", "cpu", "--iters", "1", "--trials", "1"]
    assert gemm_profile.main([*args, "--kernels", "--out", str(tmp_path / "k.csv")]) == 0
    table = pd.read_csv(tmp_path / "k.csv")
    assert len(table) == 8 and set(table["kernels"]) == {"aten::mm"}
    assert len(read_gemm_table(tmp_path / "k.csv")) == 8
    assert gemm_profile.main([*args, "--out", str(tmp_path / "plain.csv")]) == 0
    assert "kernels" not in pd.read_csv(tmp_path / "plain.csv").columns


def test_device_kernels_keeps_what_ran_on_the_gpu_in_launch_order_once_each():
    from types import SimpleNamespace

    device_kernels = load_bench("gemm_profile").device_kernels

    def event(name, start, device):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start), device_type=f"DeviceType.{device}")

    events = [
        event("splitKreduce_kernel", 30, "CUDA"),
        event("aten::mm", 0, "CPU"),
        event("cudaLaunchKernel", 5, "CPU"),
        event("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_splitK_TNT", 20, "CUDA"),
        event("splitKreduce_kernel", 40, "CUDA"),
    ]
    assert device_kernels(events, cuda=True) == [
        "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_splitK_TNT",
        "splitKreduce_kernel",
    ]
    assert device_kernels(events, cuda=False) == ["aten::mm"]


def test_gemm_profile_cycles_weights_past_the_l2():
    """The graph timer's weight copies: together at least twice the L2, one per call at most."""
    weight_copies = load_bench("gemm_profile").weight_copies
    mib = 1 << 20
    assert weight_copies(32 * mib, 50 * mib, 20) == 4  # 4 x 32 >= 100 > 3 x 32
    assert weight_copies(100 * mib, 50 * mib, 20) == 1  # one alone is twice the L2
    assert weight_copies(1 * mib, 50 * mib, 20) == 20  # capped at one per call
    assert weight_copies(8 * mib, 0, 20) == 1  # L2 unknown: the one matrix


def test_a_calibration_serves_its_own_kernel_family_only(h100_calibration, capsys):
    out, _ = h100_calibration
    assert with_gemm_calibration(get_hardware("h200"), out).gemm_fit is not None  # the H100's die
    code = main(["cost", "--model", "llama-3-8b", "--hardware", "b200", "--gemm-calibration", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "fitted on h100-sxm (hopper)" in err[0] and "b200's (blackwell)" in err[0]


def test_sweep_applies_a_calibration_to_its_own_part(h100_calibration, capsys, tmp_path):
    out, data = h100_calibration
    trace = str(ROOT / "traces" / "sequential-reverse_words")
    base = ["sweep", trace, "--hardware", "h100-sxm,h200", "--model", "llama-3-8b", "--rate", "8"]
    base += ["--num-requests", "20", "--workers", "1", "--json"]

    def rows(extra: list[str], folder: str) -> dict[str, dict]:
        assert main([*base, *extra, "--out", str(tmp_path / folder)]) == 0
        capsys.readouterr()
        import pandas as pd

        table = pd.read_parquet(tmp_path / folder / "sweep.parquet")
        return {row["hardware"]: row for row in table.to_dict("records")}

    plain = rows([], "plain")
    calibrated = rows(["--gemm-calibration", str(out)], "cal")
    assert json.loads(calibrated["h100-sxm"]["gemm_calibration"]) == data["params"]
    assert not isinstance(calibrated["h200"].get("gemm_calibration"), str)  # missing: NaN in the table
    assert calibrated["h100-sxm"]["mean_e2el_ms"] != pytest.approx(plain["h100-sxm"]["mean_e2el_ms"], rel=1e-9)
    assert calibrated["h200"]["mean_e2el_ms"] == pytest.approx(plain["h200"]["mean_e2el_ms"], rel=1e-12)
    code = main([*base[:3], "b200", *base[4:], "--gemm-calibration", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "fitted on h100-sxm, which is not among --hardware b200" in err[0]
    code = main([*base, "--gemm-calibration", str(out), "--gemm-calibration", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "two calibrations for h100-sxm" in err[0]


def test_a_vidur_profile_calibrates(tmp_path, capsys):
    """vidur's per-op profile format: its projections' GEMMs, each (K, N) from the layer shape and
    TP degree in the file (phi-2 at TP 1: QKV, output, up and down, 259 token counts each)."""
    profile = ROOT / "simulator" / "data" / "vidur-a100" / "phi-2.mlp.csv"
    rows = read_gemm_table(profile)
    assert len(rows) == 1036 and sorted(set(zip(rows["K"], rows["N"]))) == [
        (2560.0, 2560.0),
        (2560.0, 7680.0),
        (2560.0, 10240.0),
        (10240.0, 2560.0),
    ]
    out = tmp_path / "phi2.json"
    assert main(["calibrate", str(profile), "--hardware", "a100-80g", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["shapes"] == 4 and data["heldout"]["fitted"]["n"] == 1036
    assert data["heldout"]["split"].startswith("(K, N) shapes halved")  # 4 shapes: enough to hold 2 out
    assert data["heldout"]["fitted"]["median"] < 10 and data["in_sample"]["median"] < 10


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda w: w.drop(columns=["n_embd"]), "without its column 'n_embd'"),
        (lambda w: w.assign(n_head=0), "row 1: n_head must be a whole number >= 1, got '0'"),
        (lambda w: w.assign(num_tensor_parallel_workers=3), "num_tensor_parallel_workers 3 does not divide n_head 32"),
        (lambda w: w.assign(num_tokens="many"), "row 1: num_tokens must be a whole number >= 1, got 'many'"),
        (lambda w: w.assign(n_embd=2560.5), "n_embd must be a whole number"),
        (
            lambda w: w.assign(**{"time_stats.attn_pre_proj.median": "slow"}),
            "row 1: time_stats.attn_pre_proj.median is not a number ('slow')",
        ),
        (lambda w: w.assign(n_kv_head=5), "layer shape or times cannot be read"),
        (lambda w: w.head(1), "4 GEMMs from "),
        (
            lambda w: w.assign(**{"time_stats.mlp_up_proj.median": -1.0}),
            "row 1: time_stats.mlp_up_proj.median must be a positive",
        ),
        # was: the cell quoted whole, an error line of 5,000 characters
        (lambda w: w.assign(num_tokens="9" * 5000), "got '" + "9" * 59 + "... (5002 characters)"),
        # was: bool() of the text: "maybe" made the column text and every "False" beside it True (gated MLP
        # shapes, calibrated without a word); an empty cell took the next row's value
        (
            lambda w: w.assign(use_gated_mlp=["maybe"] + [False] * (len(w) - 1)),
            "row 1: use_gated_mlp must be True or False, got 'maybe'",
        ),
        (
            lambda w: w.assign(use_gated_mlp=[None] + [False] * (len(w) - 1)),
            "row 1: use_gated_mlp must be True or False, got 'nan'",
        ),
        (lambda w: w.drop(columns=["use_gated_mlp"]), "without its column 'use_gated_mlp'"),
    ],
)
def test_bad_vidur_profiles_are_one_line_exit_2(tmp_path, capsys, edit, needle):
    import pandas as pd

    wide = pd.read_csv(ROOT / "simulator" / "data" / "vidur-a100" / "phi-2.mlp.csv")
    profile = tmp_path / "phi-2.mlp.csv"
    edit(wide).to_csv(profile, index=False)
    code = main(["calibrate", str(profile), "--hardware", "a100-80g", "--out", str(tmp_path / "cal.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("solm calibrate: error:"), err
    assert needle in err[0]


@pytest.mark.parametrize("time", [0.0, -0.5, float("inf"), float("-inf"), -1e-300])
def test_a_vidur_time_that_is_no_time_is_refused_even_beside_a_repeat(tmp_path, time):
    """Was: a 0, negative or -0.5 ms median at a token count measured twice became the median of the two (a
    plausible time), and an infinite one was dropped as if not measured: the file read as clean, exit 0."""
    import pandas as pd

    wide = pd.read_csv(ROOT / "simulator" / "data" / "vidur-a100" / "phi-2.mlp.csv")
    keys = ["num_tensor_parallel_workers", "num_tokens"]
    row = int(np.flatnonzero(wide.duplicated(keys, keep=False))[0])  # a token count measured twice
    wide.loc[row, "time_stats.mlp_up_proj.median"] = time
    profile = tmp_path / "phi-2.mlp.csv"
    wide.to_csv(profile, index=False)
    with pytest.raises(
        UsageError, match=rf"row {row + 1}: time_stats.mlp_up_proj.median must be a positive number of ms"
    ):
        read_gemm_table(profile)


def test_several_tables_are_pooled(tmp_path, capsys):
    """Two files of one part's GEMMs (XLA's H100 GEMMs with n and k 256 or 4096: 4 (K, N) shapes at
    5 token counts, cut in two, one in FLOP/s and one in us) calibrate as one table."""
    import pandas as pd

    table = pd.read_csv(H100_TABLE)
    table = table[table.n.isin([256, 4096]) & table.k.isin([256, 4096])]
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    table.iloc[:10].to_csv(first, index=False)
    table.iloc[10:].assign(time_us=lambda t: 2e6 * t.m * t.n * t.k / t.bf16_flops_per_s).drop(
        columns="bf16_flops_per_s"
    ).to_csv(second, index=False)
    out = tmp_path / "cal.json"
    code = main(["calibrate", str(first), str(second), "--hardware", "h100-sxm", "--out", str(out), "--json"])
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and data["rows"] == 20 and data["shapes"] == 4 and data["source"] == f"{first}, {second}"
    assert data["heldout"]["fitted"]["n"] == 20
    small, other = tmp_path / "small.csv", tmp_path / "other.csv"  # one file twice is refused (test_abuse_sim)
    small.write_text(GOOD_HEADER + _good_rows(4))
    other.write_text(GOOD_HEADER + _good_rows(4))
    code = main(["calibrate", str(small), str(other), "--hardware", "h100-sxm", "--out", str(tmp_path / "s.json")])
    assert code == 0  # 4 + 4 GEMMs pooled reach the minimum of 8
    capsys.readouterr()


def test_a_flops_column_reads_as_the_time_of_2mnk_flops(tmp_path):
    """An achieved FLOP/s column is 2*M*N*K FLOPs over the time: 2 * 1024^3 FLOP at 2.147e12 FLOP/s is 1 ms."""
    table = tmp_path / "flops.csv"
    table.write_text("m,n,k,bf16_flops_per_s\n1024,1024,1024,2147483648000\n")
    assert read_gemm_table(table)["time_s"].tolist() == pytest.approx([1e-3], rel=1e-12)


@pytest.mark.parametrize("column", ["m", "n", "k", "time_us"])
def test_a_zero_in_a_table_is_refused(tmp_path, column):
    """Sizes and times must be > 0: a zero is one clear line naming its row and column."""
    row = {"m": "64", "n": "4096", "k": "4096", "time_us": "10", column: "0"}
    table = tmp_path / "zero.csv"
    table.write_text(GOOD_HEADER + ",".join(row[c] for c in ("m", "n", "k", "time_us")) + "\n" + _good_rows(7))
    with pytest.raises(ValueError, match=f"row 1: {column} must be a positive number, got '0'"):
        read_gemm_table(table)


def test_sizes_up_to_2_to_the_24_are_read(tmp_path):
    table = tmp_path / "big.csv"
    table.write_text(f"{GOOD_HEADER}{1 << 24},64,64,100\n")
    assert read_gemm_table(table)["num_tokens"].tolist() == [1 << 24]
    table.write_text(f"{GOOD_HEADER}{(1 << 24) + 1},64,64,100\n")
    with pytest.raises(ValueError, match="row 1: m must be a whole number up to 2\\^24"):
        read_gemm_table(table)


def test_times_faster_than_twice_the_peak_are_refused(tmp_path, capsys):
    """GEMMs at 3x the part's dense peak were not timed on it (another part, another unit): refused."""
    peak = get_hardware("h100-sxm").peak_flops_per_s
    rows = [(64 * (i + 1), 4096, 4096) for i in range(MIN_ROWS)]
    table = tmp_path / "fast.csv"
    table.write_text(GOOD_HEADER + "".join(f"{m},{n},{k},{2 * m * n * k / (3 * peak) * 1e6!r}\n" for m, n, k in rows))
    code = main(["calibrate", str(table), "--hardware", "h100-sxm", "--out", str(tmp_path / "cal.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "the 64x4096x4096 GEMM" in err[0] and "over 2x h100-sxm's" in err[0], err


def test_an_empty_vidur_time_drops_its_rows(tmp_path):
    """A vidur profile's empty timing cells are a GEMM not measured (at one token count here): left out, the rest read."""
    import pandas as pd

    source = ROOT / "simulator" / "data" / "vidur-a100" / "phi-2.mlp.csv"
    wide = pd.read_csv(source)
    wide.loc[wide["num_tokens"] == wide["num_tokens"].iloc[0], "time_stats.mlp_up_proj.median"] = None
    profile = tmp_path / "phi-2.mlp.csv"
    wide.to_csv(profile, index=False)
    assert len(read_gemm_table(profile)) == len(read_gemm_table(source)) - 1


def test_held_out_figures_come_from_fits_that_did_not_see_the_rows_they_score(monkeypatch):
    """Two fits on complementary halves (each scored on the other), then the refit on every row
    (the fitter replaced by one that records its rows and answers the carried parameters)."""
    import simulator.gemm_fit as gemm_fit
    from simulator.gemm_calibration import calibrate

    part = get_hardware("h100-sxm")
    seen: list[set] = []

    def spy(rows, *args, **kwargs):
        seen.append(set(zip(rows["num_tokens"], rows["K"], rows["N"])))
        return default_params(part).gemm

    monkeypatch.setattr(gemm_fit, "fit_gemm", spy)
    rows = read_gemm_table(H100_TABLE)
    every = set(zip(rows["num_tokens"], rows["K"], rows["N"]))
    calibrate(rows, part)
    assert len(seen) == 3 and seen[0] and seen[1] and not seen[0] & seen[1]
    assert seen[0] | seen[1] == every == seen[2]


@pytest.mark.parametrize("value", [True, "0.8"])
def test_a_calibration_param_that_is_not_a_number_is_refused(tmp_path, value):
    """true (JSON's boolean, which Python counts as 1) or text is not a fitted parameter."""
    cal = tmp_path / "cal.json"
    params = {**GemmParams().to_json(), "tensor_eff": value}
    cal.write_text(
        json.dumps({"format": "solm-gemm-calibration", "version": 1, "hardware": "h100-sxm", "params": params})
    )
    with pytest.raises(ValueError, match="params must be finite numbers"):
        read_calibration(cal)


def test_a_calibration_with_a_field_too_many_is_refused(tmp_path):
    cal = tmp_path / "cal.json"
    params = {**GemmParams().to_json(), "warp_eff": 0.5}
    cal.write_text(
        json.dumps({"format": "solm-gemm-calibration", "version": 1, "hardware": "h100-sxm", "params": params})
    )
    with pytest.raises(ValueError, match="params must name exactly"):
        read_calibration(cal)


@pytest.mark.parametrize(
    "field,value",
    [("tensor_eff", 5e-324), ("memory_eff", 5e-324), ("feed_bytes_per_clock", 5e-324), ("fill_iters", 1e308)]
    + [("launch_overheads", 1e308), ("overlap_p", 1e308), ("choice_q", 1e308)],
)
def test_a_calibration_param_far_outside_the_fitted_range_is_refused(tmp_path, capsys, field, value):
    """Within GemmParams' own ranges but far outside what `solm calibrate` fits: were exit 0 with the
    step times "nan" (or 5e307 ms) in `solm cost` and NaN latencies in `solm simulate`."""
    cal = tmp_path / "cal.json"
    params = {**GemmParams().to_json(), field: value}
    cal.write_text(
        json.dumps({"format": "solm-gemm-calibration", "version": 1, "hardware": "h100-sxm", "params": params})
    )
    for command in (
        ["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gemm-calibration", str(cal), "--json"],
        ["simulate", str(ROOT / "traces" / "sequential-reverse_words"), "--hardware", "h100-sxm"]
        + ["--gemm-calibration", str(cal), "--json"],
    ):
        code = main(command)
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(f"solm {command[0]}: error:"), (code, err)
        assert f"params.{field} is" in err[0] and not captured.out


def test_a_calibration_at_the_defaults_or_the_fit_bounds_is_read(tmp_path):
    """GemmParams' defaults (choice_q 0) and the fitter's own bounds are a calibration's values."""
    from simulator.gemm_fit import _LOWER, _UPPER, FIT_FIELDS

    for params in (
        GemmParams().to_json(),
        dict(zip(FIT_FIELDS, _LOWER.tolist())),
        dict(zip(FIT_FIELDS, _UPPER.tolist())),
    ):
        cal = tmp_path / "cal.json"
        cal.write_text(
            json.dumps({"format": "solm-gemm-calibration", "version": 1, "hardware": "h100-sxm", "params": params})
        )
        assert read_calibration(cal)[1] == GemmParams(**params)
