"""The static batch-1 decode path (`runtime.static_decode`, the compiled-decode flag) on a tiny
random Llama on CPU: the same greedy tokens as the engines' path, eager and traced as one graph by
torch.compile (backend "eager": dynamo only, no codegen); bad modes are clear errors. The inductor
and CUDA-graph modes are run by bench/decode_efficiency.py (on a GPU: bench/gpu_run.sh)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install 'solm[hf]')")

from runtime.engines import GenerationConfig, Request, SequentialEngine
from runtime.hf_adapter import build_arch
from runtime.static_decode import StaticDecoder


@pytest.fixture(scope="module")
def model():
    return build_arch("tiny-llama", seed=2)


class Bytes:
    eos_id, bos_id = 300, 301

    def chat_ids(self, text):
        return [self.bos_id, *text.encode()]

    def decode(self, ids, skip_control=False):
        return ""


@pytest.mark.parametrize("mode", ["eager", "trace"])
def test_static_greedy_equals_engine_path(model, mode):
    ref = SequentialEngine(model, Bytes(), GenerationConfig(max_tokens=12)).generate(Request(0, "hello there"))
    dec = StaticDecoder(model, capacity=64, mode=mode)
    assert dec.greedy(Bytes().chat_ids("hello there"), 12)[: len(ref.output_ids)] == ref.output_ids


def test_bad_modes(model):
    with pytest.raises(ValueError, match="mode must be one of"):
        StaticDecoder(model, 64, mode="fast")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        StaticDecoder(model, 64, mode="cuda-graphs")
    with pytest.raises(ValueError, match="exceeds"):
        StaticDecoder(model, 10**6)


def test_decode_efficiency_bench_on_cpu(capsys):
    """bench/decode_efficiency.py's CPU path: both paths timed, their tokens compared (the whole
    continuation and its equal prefix), the inductor flag recorded; JSON last."""
    import json

    from tests.benches import load_bench

    decode_efficiency = load_bench("decode_efficiency")
    args = ["--arch", "tiny-llama", "--device", "cpu", "--context", "12", "--passes", "4", "--warmup", "1"]
    assert decode_efficiency.main([*args, "--modes", "engine,static", "--coordinate-descent"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["bench"] == "decode_efficiency" and out["coordinate_descent_tuning"] is True
    static = out["modes"]["static"]
    assert static["tokens_equal_engine"] is True and static["tokens_equal_prefix"] == 5  # warm-up + timed
    assert static["pass_ms_median"] > 0 and static["efficiency"] is None  # no peak known for a CPU
    assert decode_efficiency.equal_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert decode_efficiency.equal_prefix([1, 2], [1, 2, 3]) == 2
