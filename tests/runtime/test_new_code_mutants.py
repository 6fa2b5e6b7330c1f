"""Contracts of the attention strategies, kernel-name tiles, first-pass ratios, shape profiles,
`gemm_profile --kernels` and validate's attention warning that the other tests left open (a
mutation round: each test here fails under a plausible change to the code it names)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import runtime.attention as attention
from runtime.attention import masked_sdpa, set_sdpa_strategy
from simulator.hardware import get_hardware
from simulator.kernel_names import LibraryTile, library_tile, library_vs_model
from tests.benches import load_bench


@pytest.fixture
def strategy():
    """Set a strategy for one test; the environment's is read again after."""
    yield set_sdpa_strategy
    set_sdpa_strategy(None)


def inputs(n: int, s: int, heads: int = 4, kv_heads: int = 2, d: int = 8):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, n, d, generator=g)
    K, V = torch.randn(1, kv_heads, s, d, generator=g), torch.randn(1, kv_heads, s, d, generator=g)
    mask = torch.rand(1, 1, n, s, generator=g) < 0.4
    mask[..., 0] = True
    return q, K, V, mask


# runtime/attention.py


@pytest.mark.parametrize(("n", "s", "seen"), [(3, 100, (4, 128)), (4, 64, (4, 64)), (1, 1, (1, 1)), (2, 3, (2, 4))])
def test_bucket_pads_every_count_that_is_not_a_power_of_two(strategy, monkeypatch, n, s, seen):
    """`bucket`: the kernel sees the next power of two of the rows and of the keys (3 rows: 4),
    the counts themselves where they are powers of two; the result keeps the caller's rows."""
    shapes = []
    sdpa = attention.F.scaled_dot_product_attention

    def spy(q, K, V, attn_mask, **kw):
        shapes.append((q.shape[2], K.shape[2]))
        return sdpa(q, K, V, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    strategy("bucket")
    q, K, V, mask = inputs(n, s)
    assert masked_sdpa(q, K, V, mask).shape == q.shape
    assert shapes == [seen]


def test_each_strategy_asks_pytorch_for_its_own_backends(strategy, monkeypatch):
    """`no-cudnn`: flash, memory-efficient and math (no cuDNN); `math`: math alone; `efficient`:
    the memory-efficient kernel with math as its fallback; `auto` and `bucket` restrict nothing."""
    from torch.nn.attention import SDPBackend

    asked = []
    real = attention.sdpa_kernel

    def spy(backends):
        asked.append(list(backends))
        return real(backends)

    monkeypatch.setattr(attention, "sdpa_kernel", spy)
    q, K, V, mask = inputs(5, 37)
    expected = {
        "no-cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
        "math": [SDPBackend.MATH],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    }
    for name, backends in expected.items():
        strategy(name)
        masked_sdpa(q, K, V, mask)
        assert asked.pop() == backends and asked == []
        assert SDPBackend.CUDNN_ATTENTION not in backends
    for name in ("auto", "bucket"):
        strategy(name)
        masked_sdpa(q, K, V, mask)
        assert asked == []


@pytest.mark.parametrize("compiling", [False, True])
def test_masked_sdpa_resolves_the_strategy_for_its_device_and_torch_compile(strategy, monkeypatch, compiling):
    """The strategy is resolved with the query's device and whether torch.compile is tracing."""
    calls = []
    real = attention.effective_strategy

    def spy(name, cuda, is_compiling=False):
        calls.append((name, cuda, is_compiling))
        return real(name, cuda, is_compiling)

    monkeypatch.setattr(attention, "effective_strategy", spy)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    strategy("default")
    masked_sdpa(*inputs(2, 8))
    assert calls == [("default", False, compiling)]


# simulator/kernel_names.py


def test_split_k_is_read_however_the_name_cases_it():
    """ "splitK", "SplitK" and "splitk" all say the kernel splits K."""
    xmma = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1"
    assert library_tile(f"{xmma}_splitk_kernel") == LibraryTile(256, 128, True)
    assert library_tile(f"{xmma}_kernel+cublasLt::SplitKReduce") == LibraryTile(256, 128, True)
    assert library_tile(f"{xmma}_kernel") == LibraryTile(256, 128, False)


def test_the_first_gemm_kernel_named_gives_the_tile():
    """Of two GEMM kernels in one call, the first launched names the tile."""
    ampere = "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn"
    nvjet = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"
    assert library_tile(f"{ampere}+{nvjet}") == LibraryTile(64, 128, False)
    assert library_tile(f"{nvjet}+{ampere}") == LibraryTile(8, 64, False)


@pytest.fixture
def fake_gemm_model(monkeypatch):
    """The tile model's pick by N (8x64 everywhere: a 2-CTA cluster at N=4096), 20 us each."""
    import simulator.gemm_transfer

    labels = {4096: "8x64x64c2", 8192: "8x64x64", 14336: "8x64x64"}

    def gemm_kernel(m, k, n, hw, params):
        return SimpleNamespace(tile=[labels[int(n)]], split=1.0, time_s=20e-6)

    monkeypatch.setattr(simulator.gemm_transfer, "gemm_kernel", gemm_kernel)  # what tile_kernels calls


def test_library_vs_model_takes_the_common_tile_split_share_and_both_tile_dimensions(fake_gemm_model):
    """Per token count the library's most common tile (not its first) and the share of its GEMMs
    that split K; a tile agrees only when both its dimensions do; the model's median absolute
    percentage error apart where it agrees and where it does not; unnamed rows left out."""
    table = pd.DataFrame(
        {
            "M": [1, 1, 1, 16],
            "K": [4096] * 4,
            "N": [8192, 4096, 14336, 4096],
            "time_s": [40e-6, 10e-6, 8e-6, 30e-6],
            "kernels": [
                "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT",  # 8x128 against the model's 8x64: 20 us for 40 (-50%)
                "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT",  # 8x64, agrees: 20 us for 10 (+100%)
                "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT",  # 8x64 split-K, agrees: +150%
                "aten::mm",
            ],
        }
    )
    report = library_vs_model(table, get_hardware("h200"))
    assert report == {
        "gemms": 4,
        "named": 3,
        "per_tokens": [
            {
                "tokens": 1,
                "gemms": 3,
                "library": "8x64",
                "library_split_share": 0.333,
                "model": "8x64",
                "model_split_share": 0.0,  # the fake model never splits K
                "agree_share": 0.667,
            }
        ],
        "agree_share": 0.667,
        "agree_median_ape_percent": 125.0,
        "disagree_median_ape_percent": 50.0,
    }


def test_library_vs_model_needs_a_part_with_a_tile_model_and_a_named_kernel(fake_gemm_model):
    table = pd.DataFrame({"M": [1], "K": [64], "N": [4096], "time_s": [1e-6], "kernels": ["aten::mm"]})
    with pytest.raises(ValueError, match="host-cpu has no GEMM tile model"):
        library_vs_model(table, get_hardware("host-cpu"))
    assert library_vs_model(table, get_hardware("h200")) == {"gemms": 1, "named": 0, "per_tokens": []}


# runtime/rows_sweep.py


class FakeProfile:
    """torch.profiler.profile's stand-in: the activities asked for, fixed operator totals (us)."""

    activities: list = []

    def __init__(self, activities):
        FakeProfile.activities.append(list(activities))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def key_averages(self):
        ev = SimpleNamespace
        return [
            ev(key="aten::add", count=5, self_cpu_time_total=500.0, self_device_time_total=3000.0),
            ev(key="aten::mm", count=3, self_cpu_time_total=2000.0, self_device_time_total=1000.0),
            ev(key="aten::softmax", count=1, self_cpu_time_total=1000.0, self_device_time_total=0.0),
        ]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_shape_profile_reports_each_pass_in_seconds_ranked_and_cut_to_top(monkeypatch, device):
    """Operator totals from microseconds to seconds, their call counts, the `top` by self CPU and
    (on a GPU only, the profiler then asked for CUDA activity too) by self device time; the pass's
    span and keys as the sweep counts them; a first ("new") and a second ("seen") pass."""
    from torch.profiler import ProfilerActivity

    import runtime.rows_sweep as rs

    FakeProfile.activities = []
    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    passes = iter([(0.03, 30, 96), (0.01, 30, 96)])
    monkeypatch.setattr(rs, "timed_pass", lambda model, kv, context, attention: next(passes))
    monkeypatch.setattr(rs, "decode_context", lambda model, page_size, r, s: (None, (r, s)))
    model = SimpleNamespace(embed=SimpleNamespace(weight=SimpleNamespace(device=SimpleNamespace(type=device))))
    out = rs.shape_profile(model, 3, 64, top=2)
    mm = {"name": "aten::mm", "calls": 3, "self_cpu_s": 2e-3, "self_device_s": 1e-3}
    softmax = {"name": "aten::softmax", "calls": 1, "self_cpu_s": 1e-3, "self_device_s": 0.0}
    add = {"name": "aten::add", "calls": 5, "self_cpu_s": 5e-4, "self_device_s": 3e-3}
    by_device = [add, mm] if device == "cuda" else []
    assert out == {
        "rows": 3,
        "slots_asked": 64,
        "attention": "mask",
        "slots": 96,
        "keys": 30,
        "new": {"duration_s": 0.03, "by_self_cpu": [mm, softmax], "by_self_device": by_device},
        "seen": {"duration_s": 0.01, "by_self_cpu": [mm, softmax], "by_self_device": by_device},
    }
    cuda = [ProfilerActivity.CUDA] if device == "cuda" else []
    assert FakeProfile.activities == [[ProfilerActivity.CPU, *cuda]] * 2


# bench/gemm_profile.py


def test_device_kernels_on_a_cpu_keeps_every_matrix_product_operator():
    """On a CPU: aten::mm, aten::addmm and aten::bmm (launch order, once each), not their callers."""
    device_kernels = load_bench("gemm_profile").device_kernels

    def event(name, start):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start), device_type="DeviceType.CPU")

    events = [event("aten::bmm", 3), event("aten::matmul", 0), event("aten::addmm", 1), event("aten::mm", 2)]
    assert device_kernels(events, cuda=False) == ["aten::addmm", "aten::mm", "aten::bmm"]
    assert device_kernels(events, cuda=True) == []


def test_kernel_names_joins_the_kernels_with_plus_as_library_tile_reads_them(monkeypatch):
    gemm_profile = load_bench("gemm_profile")
    names = ["nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT", "splitKreduce_kernel"]
    monkeypatch.setattr(gemm_profile, "device_kernels", lambda events, cuda: list(names))
    joined = gemm_profile.kernel_names(torch, 2, 16, 8, torch.float32, "cpu")
    assert joined == "+".join(names) and library_tile(joined) == LibraryTile(8, 64, True)


def test_kernel_names_on_a_gpu_profiles_cuda_activity_and_waits_for_the_kernels(monkeypatch):
    """On a CUDA device the profiler records CUDA activity too, the profiled call is synchronized
    and the device's kernels (cuda=True) are named; a warm-up call comes before the profiled one."""
    from torch.profiler import ProfilerActivity

    gemm_profile = load_bench("gemm_profile")
    log = []

    class Profile:
        def __init__(self, activities):
            log.append(("profile", list(activities)))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return []

    fake_torch = SimpleNamespace(
        randn=lambda *shape, dtype, device: log.append(("randn", shape, device)),
        matmul=lambda a, b: log.append("matmul"),
        cuda=SimpleNamespace(synchronize=lambda device: log.append(("sync", device))),
    )
    monkeypatch.setattr(torch.profiler, "profile", Profile)
    monkeypatch.setattr(gemm_profile, "device_kernels", lambda events, cuda: ["kernel"] if cuda else ["aten::mm"])
    assert gemm_profile.kernel_names(fake_torch, 2, 16, 8, torch.bfloat16, "cuda:0") == "kernel"
    assert log == [
        ("randn", (2, 8), "cuda:0"),
        ("randn", (8, 16), "cuda:0"),
        "matmul",
        ("profile", [ProfilerActivity.CPU, ProfilerActivity.CUDA]),
        "matmul",
        ("sync", "cuda:0"),
    ]


def test_gemm_profile_kernels_are_those_of_each_rows_own_shape(tmp_path, monkeypatch):
    """Each row's `kernels` come from a call of that row's (m, n, k) GEMM."""
    gemm_profile = load_bench("gemm_profile")
    monkeypatch.setattr(gemm_profile, "kernel_names", lambda torch, m, n, k, dtype, device: f"m{m}_n{n}_k{k}")
    args = ["--m", "1,8", "--n", "64,128", "--k", "64,96", "--device", "cpu", "--iters", "1", "--trials", "1"]
    assert gemm_profile.main([*args, "--kernels", "--out", str(tmp_path / "k.csv")]) == 0
    table = pd.read_csv(tmp_path / "k.csv")
    assert len(table) == 8
    assert table["kernels"].tolist() == [f"m{r.m}_n{r.n}_k{r.k}" for r in table.itertuples()]


# simulator/load_validation.py


def test_validate_warns_against_the_calibrations_attention_in_that_order(tmp_path):
    """The reference is the calibration's strategy (here `efficient`), not the first serving
    trace's; the warning names the serving trace's strategy, then the calibration's."""
    from simulator.load_validation import validate_load
    from tests.simulator.test_load_validation import TRUTH, _requests, serving_trace, write_toy_trace

    def set_sdpa(folder, name):
        meta = json.loads((folder / "meta.json").read_text())
        meta.setdefault("device", {})["sdpa"] = name
        (folder / "meta.json").write_text(json.dumps(meta))

    reqs, prompts = _requests(6, "seq")
    batch1 = write_toy_trace(tmp_path / "b1", reqs, prompts, timed_by=TRUTH, system="seq")
    set_sdpa(batch1, "efficient")
    plain = serving_trace(tmp_path / "plain", "seq", rate=20.0)
    efficient = serving_trace(tmp_path / "efficient", "seq", rate=20.0)
    set_sdpa(efficient, "efficient")
    v = validate_load([plain, efficient], batch1)
    assert v["sdpa"] == "efficient" and [lv["sdpa"] for lv in v["levels"]] == ["auto", "efficient"]
    (warning,) = v["warnings"]
    assert warning.startswith(f"{plain} ran attention as 'auto', the calibration as 'efficient' ")
