"""Run inside spawned ranks by test_attention.py: the torch core attention against
Megatron's local ``DotProductAttention``, module by module and in whole models, float64."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import torch

from backends.megatron import GPTSpec, ParallelSpec
from backends.megatron.attention import PackedMask, attend, torch_core_attention

SEQ = 14


def megatron_local_attention() -> type:
    """Megatron's local ``DotProductAttention``, the reference: it takes a
    :class:`PackedMask` (or its ids) as the dense Megatron mask it stands for, and MLA's
    ``k_channels`` / ``v_channels`` (the local kernel works on any q / k width and sizes
    its output by ``kv_channels``, the value width for MLA)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class LocalAttention(DotProductAttention):
        def __init__(self, config, *args, k_channels=None, v_channels=None, **kwargs) -> None:
            super().__init__(config, *args, **kwargs)

        def forward(self, query, key, value, attention_mask, *args, **kwargs):
            if isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.long:
                attention_mask = PackedMask.of_ids(attention_mask)  # the engine passes its ids
            if isinstance(attention_mask, PackedMask):
                attention_mask = attention_mask.megatron_mask()
            return super().forward(query, key, value, attention_mask, *args, **kwargs)

    return LocalAttention


def masks() -> dict[str, PackedMask | torch.Tensor | None]:
    """The masks every check runs: causal rows; one row packing a shared-prompt group
    (prompt 3, responses 4 and 2), a plain document of 4 and a 1-token tail pad; one row
    of plain packed documents (5, 6, 3); that first mask as Megatron's dense tensor."""
    shared = PackedMask.of(
        torch.tensor([[0] * 9 + [1] * 4 + [2]]),
        torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 0, 0, 0, 0, 0]]),
    )
    documents = PackedMask.of(torch.tensor([[0] * 5 + [1] * 6 + [2] * 3]), torch.zeros(1, SEQ))
    return {
        "causal": None,
        "shared_prompt": shared,
        "documents": documents,
        "megatron_dense": shared.megatron_mask(),
    }


#: (heads, query groups, q / k width, value width, softmax scale): GQA and MLA's shape.
SHAPES = {"gqa": (4, 2, 8, 8, None), "mla": (4, 4, 12, 8, 0.3)}
#: The same at the narrowest heads FlexAttention compiles for on a GPU.
GPU_SHAPES = {"gqa": (4, 2, 16, 16, None), "mla": (4, 4, 24, 16, 0.3)}


def _config(heads: int, groups: int, value_width: int):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=1, hidden_size=heads * value_width, num_attention_heads=heads,
        num_query_groups=groups, kv_channels=value_width, params_dtype=torch.float64,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
    )  # fmt: skip


def _run(module, qkv: list[torch.Tensor], mask) -> dict:
    inputs = [t.clone().requires_grad_() for t in qkv]
    out = module(*inputs, mask)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape))
    return {"out": out.detach(), "grads": [t.grad for t in inputs]}


def module_outputs(rank: int, world: int) -> dict:
    """For each shape and mask: the local attention's and the torch one's output and
    q / k / v grads, and FlexAttention's output (eager, forward only on the CPU)."""
    from megatron.core.transformer.enums import AttnMaskType

    from backends.device import get_device
    from backends.megatron.builder import destroy_parallel, initialize_parallel
    from backends.megatron.cpu_compat import megatron_compat

    results = {}
    initialize_parallel(ParallelSpec())
    with megatron_compat(get_device()):
        for shape, (heads, groups, width, value_width, scale) in SHAPES.items():
            config = _config(heads, groups, value_width)
            channels = {"k_channels": width, "v_channels": value_width}
            built = {
                name: cls(config, 1, AttnMaskType.causal, "self", softmax_scale=scale, **channels)
                for name, cls in (
                    ("local", megatron_local_attention()),
                    ("torch", torch_core_attention()),
                )
            }
            gen = torch.Generator().manual_seed(5)
            for mask_name, mask in masks().items():
                batch = 2 if mask is None else 1
                widths = ((heads, width), (groups, width), (groups, value_width))
                qkv = [
                    torch.randn(SEQ, batch, n, w, generator=gen, dtype=torch.float64)
                    for n, w in widths
                ]
                result = {name: _run(module, qkv, mask) for name, module in built.items()}
                if isinstance(mask, PackedMask):
                    q, k, v = (t.permute(1, 2, 0, 3) for t in qkv)
                    flex = attend(q, k, v, mask, built["torch"].softmax_scale, kernel="flex")
                    result["flex"] = flex.permute(2, 0, 1, 3).reshape(SEQ, batch, -1)
                results[shape, mask_name] = result
    destroy_parallel()
    return results


@contextlib.contextmanager
def local_attention_in_the_spec() -> Iterator[None]:
    """While active, engines are built with Megatron's local attention as core attention."""
    from backends.megatron import builder

    torch_attention = builder.torch_core_attention
    builder.torch_core_attention = megatron_local_attention
    try:
        yield
    finally:
        builder.torch_core_attention = torch_attention


def models() -> dict[str, GPTSpec]:
    from tests.megatron.cases import DENSE, MOE
    from tests.megatron.deepseek_cases import tiny_spec

    return {name: replace(spec, dtype="float64") for name, spec in
            {"dense": DENSE, "moe": MOE, "deepseek": tiny_spec()}.items()}  # fmt: skip


def model_steps(rank: int, world: int) -> dict:
    """Scores and one train step of each family on GRPO-like rows (shared prompts,
    uneven responses), with the torch attention and with Megatron's local one, at TP2
    with sequence parallelism (heads split over the two ranks)."""
    import torch.distributed as dist

    from tests.megatron.packing_cases import one_step

    out = {}
    for name, spec in models().items():
        out[name, "torch"] = one_step(spec, ParallelSpec(tp=2), True, False)
        dist.barrier()
        with local_attention_in_the_spec():
            out[name, "local"] = one_step(spec, ParallelSpec(tp=2), True, False)
        dist.barrier()
    return out
