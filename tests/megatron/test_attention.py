"""The torch core attention (backends/megatron/attention.py) computes what Megatron's
local attention computes, in float64: outputs and gradients for causal rows, for a
shared-prompt group packed with a plain document and a tail pad, for packed documents,
and for Megatron's own dense mask, with grouped-query heads and with MLA's shape (q / k
wider than v, its own softmax scale); FlexAttention's BlockMask (forward only on the CPU)
agrees; whole dense, MoE and DeepSeek-V3 models at TP2 with sequence parallelism score
and train the same with either attention. On a CUDA GPU (skipped here) the compiled
FlexAttention kernel, forward and backward, equals per-document SDPA."""

from __future__ import annotations

import pytest
import torch

from backends.megatron.attention import PackedMask, attend, packed_kernel, spans_of
from tests.megatron import attention_cases as cases
from tests.support.devices import device_params
from tests.support.spawn import run_ranks

EXACT = {"rtol": 1e-10, "atol": 1e-12}


@pytest.fixture(scope="module")
def modules() -> dict:
    (result,) = run_ranks(cases.module_outputs, 1)
    return result


@pytest.mark.parametrize("mask", list(cases.masks()))
@pytest.mark.parametrize("shape", list(cases.SHAPES))
def test_the_torch_attention_equals_megatrons_local_attention(modules, shape, mask):
    local, fused = modules[shape, mask]["local"], modules[shape, mask]["torch"]
    torch.testing.assert_close(fused["out"], local["out"], **EXACT)
    for name, got, want in zip("qkv", fused["grads"], local["grads"], strict=True):
        torch.testing.assert_close(got, want, **EXACT, msg=f"grad of {name}")


@pytest.mark.parametrize("mask", ["shared_prompt", "documents"])
@pytest.mark.parametrize("shape", list(cases.SHAPES))
def test_flex_attentions_block_mask_gives_the_same_output(modules, shape, mask):
    result = modules[shape, mask]
    torch.testing.assert_close(result["flex"], result["local"]["out"], **EXACT)


def test_a_packed_mask_hides_other_documents_and_other_responses():
    mask = cases.masks()["shared_prompt"]
    visible = mask.visible()[0]
    # Second response's first token (7): the prompt (0-2) and itself, not response 1.
    assert visible[7].nonzero().flatten().tolist() == [0, 1, 2, 7]
    # The plain document (9-12) sees only its own earlier tokens; the pad only itself.
    assert visible[11].nonzero().flatten().tolist() == [9, 10, 11]
    assert visible[13].nonzero().flatten().tolist() == [13]
    assert mask.spans == (((0, 9, True), (9, 13, False), (13, 14, False)),)


def test_the_mask_is_found_again_from_its_ids_after_a_detach_as_recompute_hands_them_back():
    mask = cases.masks()["shared_prompt"]
    assert PackedMask.of_ids(mask.ids.detach()) is mask  # same storage: its spans, its cache
    copy = PackedMask.of_ids(mask.ids.clone())  # another storage: made from the values
    assert copy is not mask and copy.spans == mask.spans
    assert torch.equal(copy.visible(), mask.visible())


def test_a_document_split_in_two_is_refused():
    with pytest.raises(ValueError, match="contiguous"):
        spans_of(torch.tensor([0, 0, 1, 0]), torch.zeros(4))
    with pytest.raises(ValueError, match=r"\[b, s\]"):
        PackedMask.of(torch.zeros(3), torch.zeros(3))


def test_flex_attention_is_the_packed_kernel_on_cuda_only_where_triton_imports(monkeypatch):
    import sys

    assert packed_kernel(torch.device("cpu")) == "sdpa"
    monkeypatch.setitem(sys.modules, "triton", None)  # an import of it raises ImportError
    assert packed_kernel(torch.device("cuda")) == "sdpa"
    monkeypatch.setitem(sys.modules, "triton", type(sys)("triton"))  # FAKE Triton
    assert packed_kernel(torch.device("cuda")) == "flex"
    assert packed_kernel(torch.device("cuda"), (64, 64)) == "flex"
    assert packed_kernel(torch.device("cuda"), (16, 8)) == "sdpa"  # too narrow for Inductor


@pytest.fixture(scope="module")
def models() -> list[dict]:
    return run_ranks(cases.model_steps, 2)


@pytest.mark.parametrize("family", ["dense", "moe", "deepseek"])
def test_models_at_tp2_with_sequence_parallelism_train_the_same_with_either_attention(
    models, family
):
    for rank in models:
        fused, local = rank[family, "torch"], rank[family, "local"]
        for key, value in local["scored"].items():
            assert value.dtype == torch.float64
            torch.testing.assert_close(fused["scored"][key], value, **EXACT)
        assert fused["loss"] == pytest.approx(local["loss"], rel=1e-12)
        assert fused["grads"].keys() == local["grads"].keys()
        for name, grad in local["grads"].items():
            torch.testing.assert_close(fused["grads"][name], grad, **EXACT, msg=name)


def kernel_outputs(device: str, kernel: str, shape: str, mask_name: str) -> list[torch.Tensor]:
    """Output and q / k / v grads of :func:`attend` with ``kernel`` on ``device`` (fp32),
    at :data:`~tests.megatron.attention_cases.GPU_SHAPES` (FlexAttention's narrowest)."""
    heads, groups, width, value_width, scale = cases.GPU_SHAPES[shape]
    mask = cases.masks()[mask_name].to(device)
    gen = torch.Generator().manual_seed(3)
    widths = ((heads, width), (groups, width), (groups, value_width))
    qkv = [torch.randn(1, n, cases.SEQ, w, generator=gen).to(device).requires_grad_()
           for n, w in widths]  # fmt: skip
    out = attend(*qkv, mask, scale or width**-0.5, kernel=kernel)
    out.backward(torch.linspace(-1, 1, out.numel(), device=device).reshape(out.shape))
    return [out.detach().cpu()] + [t.grad.cpu() for t in qkv]


@pytest.mark.parametrize("mask", ["shared_prompt", "documents"])
@pytest.mark.parametrize("shape", list(cases.GPU_SHAPES))
@pytest.mark.parametrize("device", device_params(platforms=("cuda",)))
def test_compiled_flex_attention_trains_like_per_document_sdpa_on_a_gpu(device, shape, mask):
    """The GPU's packed kernel (compiled FlexAttention, forward and backward, which the
    CPU cannot run) against one SDPA call per document on the same GPU."""
    assert packed_kernel(torch.device(device), cases.GPU_SHAPES[shape][2:4]) == "flex"
    flex = kernel_outputs(device, "flex", shape, mask)
    sdpa = kernel_outputs(device, "sdpa", shape, mask)
    for name, got, want in zip(["out", "q", "k", "v"], flex, sdpa, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
