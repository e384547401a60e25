"""Megatron-core runs on the CPU inside the device layer's compat scope; the TE-absent
fixes reach every device, the CPU redirection only CPU processes."""

from __future__ import annotations

import pytest
import torch

from backends.device import get_device
from backends.device.registry import reset_device
from backends.megatron.cpu_compat import AcceleratorProcessError, megatron_compat
from tests.support.spawn import run_ranks

VOCAB, SEQ = 128, 16


def gpt_logits_and_grad_norm(rank: int, world: int) -> tuple[torch.Tensor, float]:
    """Full-vocabulary logits and the squared grad norm of a seeded GPTModel at TP=world."""
    import torch.distributed as dist

    device = get_device("cpu")
    with megatron_compat(device):
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer import TransformerConfig

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
        tensor_parallel.model_parallel_cuda_manual_seed(123)
        torch.manual_seed(0)  # CPU initialisation draws the full master weights from here
        config = TransformerConfig(
            num_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            use_cpu_initialization=True,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        )
        model = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=VOCAB,
            max_sequence_length=SEQ,
        )
        tokens = torch.arange(2 * SEQ).reshape(2, SEQ) % VOCAB
        positions = torch.arange(SEQ).expand(2, SEQ)
        local_logits = model(tokens, positions, None)  # [b, s, vocab / world]
        shards = [torch.empty_like(local_logits) for _ in range(world)]
        dist.all_gather(shards, local_logits.detach().contiguous())
        logits = torch.cat(shards, dim=-1)
        loss = torch.logsumexp(logits, -1).mean()  # full-vocab loss: needs a gathered graph
        local_loss = torch.logsumexp(local_logits, -1).mean()
        local_loss.backward()
        grad_sq = sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None)
        parallel_state.destroy_model_parallel()
    return logits, float(loss), grad_sq


def test_a_tp2_gpt_model_runs_forward_and_backward_over_gloo_and_matches_tp1():
    tp2 = run_ranks(gpt_logits_and_grad_norm, 2)
    (tp1,) = run_ranks(gpt_logits_and_grad_norm, 1)
    assert tp2[0][0].shape == (2, SEQ, VOCAB)
    torch.testing.assert_close(tp2[0][0], tp2[1][0])
    torch.testing.assert_close(tp2[0][0], tp1[0], rtol=1e-4, atol=1e-4)
    assert all(grad_sq > 0 for _, _, grad_sq in tp2)


def _patched_names() -> tuple:
    from megatron.core import utils as mp_utils
    from megatron.core.fusions import fused_softmax
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as mp_optimizer
    from megatron.core.tensor_parallel import random as mp_random

    return (
        torch.Tensor.cuda,
        torch.Tensor.type,
        "type" in vars(torch.Tensor),  # inherited from the C base: must not be copied over
        torch.cuda.current_device,
        torch.cuda.get_rng_state,
        mp_random._get_cuda_rng_state,
        fused_softmax.get_default_causal_mask,
        mp_optimizer.torch,
        clip_grads.torch,
        mp_utils.torch,
    )


def test_the_compat_scope_restores_torch_cuda_and_megatron_on_exit():
    before = _patched_names()
    try:
        with megatron_compat(get_device("cpu")):
            assert torch.cuda.current_device() == "cpu"
            assert torch.zeros(2).type() == "torch.cuda.FloatTensor"  # distrib_optimizer's test
            assert torch.zeros(2).type(torch.float64).dtype == torch.float64  # conversion as is
            raise KeyError("boom")
    except KeyError:
        pass
    assert _patched_names() == before
    assert torch.zeros(2).type() == "torch.FloatTensor"


# ---- TE-absent fixes on every device; the CPU redirection on the CPU only -----------------


@pytest.fixture
def te_absent_bugs(monkeypatch):
    """Megatron 0.16.1's two TE-absent bugs as a fresh import leaves them (no TE here)."""
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    monkeypatch.delattr(moe_utils, "te_general_gemm", raising=False)
    monkeypatch.setattr(multi_latent_attention, "HAVE_TE", True)
    return moe_utils, multi_latent_attention


@pytest.fixture
def fake_cuda_process(monkeypatch):
    """A FAKE CUDA process on this CPU-only torch: CUDA reported available with one
    device and the process's device set to the real CudaDevice class (never computed on)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    reset_device()
    yield get_device("cuda")
    reset_device()


def test_an_accelerator_process_gets_the_te_absent_fixes_and_no_cpu_redirection(
    te_absent_bugs, fake_cuda_process
):
    moe_utils, mla = te_absent_bugs
    current_device = torch.cuda.current_device
    with megatron_compat(fake_cuda_process):
        assert torch.cuda.current_device is current_device  # not redirected to "cpu"
        assert moe_utils.te_general_gemm is None  # the router's torch.mm branch
        assert mla.HAVE_TE is False  # MLA no longer isinstance-checks a MagicMock
    assert mla.HAVE_TE is False  # permanent: a Megatron bug fixed, not a CPU scope


def test_the_cpu_redirection_refuses_an_accelerator_process(fake_cuda_process):
    from backends.device.cpu import CpuDevice

    current_device = torch.cuda.current_device
    with (
        pytest.raises(AcceleratorProcessError, match="whose device is 'cuda'"),
        megatron_compat(CpuDevice()),
    ):
        pass
    assert torch.cuda.current_device is current_device  # nothing was patched


def test_the_cpu_redirection_refuses_a_process_that_initialised_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # FAKE: a CUDA context
    refused = pytest.raises(AcceleratorProcessError, match="has initialised cuda")
    with refused, megatron_compat(get_device("cpu")):
        pass


def test_compiled_functions_run_eagerly_under_the_cpu_redirection():
    """Dynamo never starts inside the scope: its device-property cache would read the
    redirected torch.cuda.current_device() wherever CUDA is available."""

    def refuse_to_compile(graph, inputs):
        raise AssertionError("compiled under the CPU redirection")

    add_one = torch.compile(lambda x: x + 1, backend=refuse_to_compile)
    try:
        with megatron_compat(get_device("cpu")):
            assert add_one(torch.ones(2)).tolist() == [2.0, 2.0]
        with pytest.raises(Exception, match="compiled under the CPU redirection"):
            add_one(torch.ones(2))  # outside the scope dynamo compiles as usual
    finally:
        torch._dynamo.reset()
