"""Megatron-core runs on the CPU inside the device layer's compat scope (issue 2)."""

from __future__ import annotations

import torch

from backends.device import get_device
from backends.megatron.cpu_compat import megatron_compat
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
