"""Hardware and model catalogs: every listed entry exists, lookups fail helpfully, overrides
validate, and the derived sizes match the public model cards."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.hardware import HARDWARE, HardwareSpec, get_hardware, host_cpu_spec, override
from simulator.models import MODELS, ModelSpec, get_model

PARTS = (
    "a100-40g",
    "a100-80g",
    "a10",
    "a40",
    "l4",
    "l40s",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "b200",
    "mi300x",
    "host-cpu",
)
MODEL_NAMES = (
    "llama-2-7b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "gemma-7b",
    "qwen3-4b",
    "qwen2.5-7b",
    "dream-7b",
    "phi-2",
)


@pytest.mark.parametrize("name", PARTS)
def test_every_part_exists_with_a_source(name: str) -> None:
    spec = get_hardware(name)
    assert spec.name == name
    assert spec.source
    assert spec.peak_flops_per_s > 0 and spec.hbm_bytes_per_s > 0 and spec.hbm_capacity_bytes > 0


def test_datasheet_figures() -> None:
    assert get_hardware("a100-80g").peak_flops_per_s == 312e12
    assert get_hardware("a100-40g").hbm_bytes_per_s == 1.555e12
    assert get_hardware("a100-80g").hbm_bytes_per_s == 2.039e12
    assert get_hardware("h100-sxm").hbm_bytes_per_s == 3.35e12
    assert get_hardware("h200").hbm_bytes_per_s == 4.8e12
    assert get_hardware("h200").hbm_capacity_bytes == 141 * 2**30
    assert get_hardware("b200").peak_flops_per_s == 2.25e15


@pytest.mark.parametrize("lookup,table", [(get_hardware, HARDWARE), (get_model, MODELS)])
def test_unknown_name_lists_the_valid_ones(lookup, table) -> None:
    with pytest.raises(KeyError) as info:
        lookup("no-such-thing")
    message = str(info.value.args[0])
    assert "no-such-thing" in message
    for name in table:
        assert name in message


def test_override_makes_a_named_hypothetical_part() -> None:
    faster = override("h100-sxm", hbm_bytes_per_s=6e12)
    base = HARDWARE["h100-sxm"]
    assert faster.hbm_bytes_per_s == 6e12
    assert faster.name == "h100-sxm-custom"
    assert faster.peak_flops_per_s == base.peak_flops_per_s
    assert override("h100-sxm", name="h100-6tb").name == "h100-6tb"
    assert base.hbm_bytes_per_s == 3.35e12  # the catalog entry is untouched


@pytest.mark.parametrize(
    "field,value",
    [
        ("hbm_bytes_per_s", 0),
        ("hbm_bytes_per_s", -1e12),
        ("peak_flops_per_s", 0),
        ("hbm_capacity_bytes", 0),
        ("interconnect_bytes_per_s", -5.0),
        ("memory_efficiency", 1.5),
        ("launch_overhead_s", -1e-6),
    ],
)
def test_override_rejects_impossible_values(field: str, value: float) -> None:
    with pytest.raises(ValueError) as info:
        override("a100-80g", **{field: value})
    message = str(info.value)
    assert field in message and "\n" not in message


def test_override_rejects_unknown_fields_and_parts() -> None:
    with pytest.raises(ValueError, match="hbm_gbps"):
        override("a100-80g", hbm_gbps=3.0)
    with pytest.raises(KeyError):
        override("a100-81g", hbm_bytes_per_s=3e12)


def test_replace_on_a_spec_validates_too() -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(HARDWARE["l4"], peak_flops_per_s=0.0)


def test_host_cpu_spec_from_this_machine() -> None:
    spec = host_cpu_spec(cores=4)
    assert isinstance(spec, HardwareSpec) and spec.kind == "cpu"
    assert spec.name == "host-cpu-4c"
    assert spec.peak_flops_per_s == pytest.approx(2 * host_cpu_spec(cores=2).peak_flops_per_s)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_exists(name: str) -> None:
    spec = get_model(name)
    assert spec.name == name
    assert spec.n_heads % spec.n_kv_heads == 0
    assert spec.weight_bytes == spec.params * spec.dtype_bytes


def test_kv_bytes_per_token() -> None:
    # 2 (K and V) x 32 layers x 8 KV heads x 128 head_dim x 2 bytes (bf16)
    assert get_model("llama-3-8b").kv_bytes_per_token == 131072
    assert get_model("llama-2-7b").kv_bytes_per_token == 2 * 32 * 32 * 128 * 2
    assert get_model("gemma-7b").head_dim == 256  # explicit, not 3072 / 16
    assert get_model("qwen3-4b").head_dim == 128  # explicit, not 2560 / 32


@pytest.mark.parametrize(
    "name,billions",
    [
        # parameter counts from the model cards / papers
        ("llama-2-7b", 6.74),
        ("llama-2-70b", 68.98),
        ("llama-3-8b", 8.03),
        ("llama-3-70b", 70.55),
        ("gemma-7b", 8.54),
        ("qwen3-4b", 4.02),
        ("qwen2.5-7b", 7.61),
        ("phi-2", 2.78),
    ],
)
def test_parameter_counts_match_the_model_cards(name: str, billions: float) -> None:
    assert get_model(name).params / 1e9 == pytest.approx(billions, rel=0.01)


def test_phi2_is_plain_mlp_with_parallel_blocks() -> None:
    phi = get_model("phi-2")
    assert not phi.gated_mlp and phi.parallel_attn_mlp and phi.norms_per_layer == 1


def test_dream_is_qwen25_shaped() -> None:
    dream, qwen = get_model("dream-7b"), get_model("qwen2.5-7b")
    assert dataclasses.replace(dream, name=qwen.name) == qwen


def test_from_trace_meta() -> None:
    meta = {
        "schema_version": 1,
        "model": {
            "name": "tiny-2l",
            "n_layers": 2,
            "d_model": 64,
            "n_heads": 4,
            "n_kv_heads": 2,
            "d_ff": 192,
            "vocab_size": 294,
            "dtype_bytes": 4,
            "params": 136256,
            "trained": False,
        },
    }
    spec = ModelSpec.from_trace_meta(meta)
    assert (spec.name, spec.n_layers, spec.head_dim, spec.dtype_bytes) == ("tiny-2l", 2, 16, 4)
    assert spec.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert ModelSpec.from_trace_meta(meta["model"]) == spec  # the model dict alone works too
    with_head_dim = {**meta["model"], "head_dim": 32}
    assert ModelSpec.from_trace_meta(with_head_dim).head_dim == 32


def test_from_trace_meta_names_missing_keys() -> None:
    with pytest.raises(ValueError, match="d_ff, vocab_size"):
        ModelSpec.from_trace_meta(
            {"model": {"name": "x", "n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "dtype_bytes": 2}}
        )


def test_model_validation() -> None:
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelSpec("bad", n_layers=2, d_model=64, n_heads=4, n_kv_heads=3, d_ff=128, vocab_size=10)
    with pytest.raises(ValueError, match="n_layers"):
        ModelSpec("bad", n_layers=0, d_model=64, n_heads=4, n_kv_heads=4, d_ff=128, vocab_size=10)


@pytest.mark.parametrize("name", PARTS)
def test_every_part_has_links_with_a_source(name: str) -> None:
    spec = get_hardware(name)
    assert spec.links_source and spec.topology in ("nvswitch", "nvlink_pairs", "pcie", "mesh")
    assert spec.pcie_bytes_per_s > 0 and spec.network_bytes_per_s > 0 and spec.price_per_gpu_hour is None


def test_link_figures_and_overrides() -> None:
    assert get_hardware("h100-sxm").nvlink_generation == 4 and get_hardware("a100-80g").nvlink_generation == 3
    assert get_hardware("h100-sxm").pcie_bytes_per_s == 128e9 and get_hardware("l4").topology == "pcie"
    assert get_hardware("h100-sxm").network_bytes_per_s == 50e9  # 400 Gb/s per GPU
    priced = override("h100-sxm", topology="nvlink_pairs", price_per_gpu_hour=2.5)
    assert priced.topology == "nvlink_pairs" and priced.price_per_gpu_hour == 2.5
    for bad in ({"topology": "torus"}, {"price_per_gpu_hour": -1.0}, {"network_bytes_per_s": 0}):
        with pytest.raises(ValueError):
            override("h100-sxm", **bad)


def test_a_generation_set_alone_sets_its_link_bandwidth() -> None:
    """PCIe x16 doubles per generation; NVLink keeps the part's links at the generation's rate per
    link (gen 4 and 3: 50 GB/s each, gen 5: 100); a bandwidth given too wins; a part without
    NVLink has no link count to carry, so a generation alone is refused."""
    h100 = get_hardware("h100-sxm")  # PCIe gen 5, NVLink gen 4
    assert override("h100-sxm", pcie_generation=6).pcie_bytes_per_s == 2 * h100.pcie_bytes_per_s
    assert override("h100-sxm", pcie_generation=4).pcie_bytes_per_s == h100.pcie_bytes_per_s / 2
    assert override("h100-sxm", pcie_generation=6, pcie_bytes_per_s=1e11).pcie_bytes_per_s == 1e11
    assert override("h100-sxm", nvlink_generation=5).interconnect_bytes_per_s == 2 * h100.interconnect_bytes_per_s
    assert override("h100-sxm", nvlink_generation=3).interconnect_bytes_per_s == h100.interconnect_bytes_per_s
    assert override("a100-80g", nvlink_generation=6).interconnect_bytes_per_s == 4 * 600e9
    with pytest.raises(ValueError, match="l40s has no NVLink") as info:
        override("l40s", nvlink_generation=4)
    assert "\n" not in str(info.value)
    assert override("l40s", nvlink_generation=4, interconnect_bytes_per_s=9e11).interconnect_bytes_per_s == 9e11
    with pytest.raises(ValueError, match="pcie_generation must be a whole number in 1..7"):
        override("h100-sxm", pcie_generation=9)


@pytest.mark.parametrize("field", ["boost_clock_hz", "links_source"])
def test_fields_no_model_reads_are_refused_by_override(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} is recorded for reference and no model reads it") as info:
        override("h100-sxm", **{field: 3e9 if field == "boost_clock_hz" else "x"})
    assert "\n" not in str(info.value)


def test_a_sustained_clock_above_the_boost_lifts_the_boost() -> None:
    """A part rated at a clock reaches it: setting the sustained clock above the catalog's maximum
    is a what-if, not an impossible part (the boost clock itself cannot be set: nothing reads it)."""
    fast = override("a100-80g", sustained_clock_hz=1.8e9)
    assert fast.boost_clock_hz == 1.8e9 and fast.peak_flops_per_s == pytest.approx(312e12 * 1.8 / 1.41)
    assert override("h100-sxm", sustained_clock_hz=1.5e9).boost_clock_hz == get_hardware("h100-sxm").boost_clock_hz


def test_every_settable_hardware_field_is_read_somewhere() -> None:
    """A catalog field that no model reads answers a `--set` what-if with the part unchanged:
    each field is read (as `.field`) outside the catalog's module, or derives another field in
    `override`, or is refused there (`REFERENCE_ONLY`)."""
    import re
    from pathlib import Path

    from simulator.hardware import REFERENCE_ONLY

    root = Path(__file__).resolve().parents[2]
    sources = [
        path.read_text()
        for package in ("simulator", "solm", "dashboard", "profiler", "runtime", "scheduling")
        for path in (root / package).rglob("*.py")
        if path.name != "hardware.py"
    ]
    derived_in_override = {"tensor_flops_per_sm_per_clock", "nvlink_generation", "pcie_generation"}
    unread = [
        f.name
        for f in dataclasses.fields(HardwareSpec)
        if f.name not in REFERENCE_ONLY and f.name not in derived_in_override
        if not any(re.search(rf"\.{f.name}\b", text) for text in sources)
    ]
    assert unread == []


def test_set_keeps_text_fields_as_text_and_refuses_what_no_part_has() -> None:
    """`--set name=123` names the part "123" (was: the int 123, printed as a number in the JSON);
    an empty or multi-line name, and a fractional byte count, are one clear error."""
    from solm.commands.simulate import parse_set

    fields = parse_set(["name=123", "hbm_bytes_per_s=4e12", "topology=pcie"])
    assert fields == {"name": "123", "hbm_bytes_per_s": 4e12, "topology": "pcie"}
    assert override("h100-sxm", **fields).name == "123"
    for bad, message in (
        ({"name": ""}, "hardware name must be printable text"),
        ({"name": "a\nb"}, "hardware name must be printable text"),
        ({"hbm_capacity_bytes": 1.5}, "hbm_capacity_bytes must be a whole number"),
        ({"l2_bytes": 2.5}, "l2_bytes must be a whole number"),
        # was: an H100 named h200, its figures printed and written as the h200's
        ({"name": "h200", "hbm_bytes_per_s": 4e12}, "name 'h200' is a catalog part's"),
        ({"name": "h100-sxm"}, "name 'h100-sxm' is a catalog part's"),
    ):
        with pytest.raises(ValueError, match=message) as info:
            override("h100-sxm", **bad)
        assert "\n" not in str(info.value)
    assert override("h100-sxm", hbm_capacity_bytes=80e9).hbm_capacity_bytes == 80e9


def test_a_part_never_sustains_more_than_its_boost_clock_nor_counts_sms_in_booleans() -> None:
    """`override` lifts the boost to a sustained clock set above it; a spec built directly with a
    sustained clock over its boost (beyond rounding), or a chip count given as a bool, is refused."""
    a100 = get_hardware("a100-80g")
    with pytest.raises(ValueError, match="sustained_clock_hz exceeds boost_clock_hz"):
        dataclasses.replace(a100, sustained_clock_hz=a100.boost_clock_hz * 1.01)
    assert dataclasses.replace(a100, sustained_clock_hz=a100.boost_clock_hz * 1.00005).sustained_clock_hz > 0
    with pytest.raises(ValueError, match="num_sms must be a number > 0, got True"):
        override("a100-80g", num_sms=True)
