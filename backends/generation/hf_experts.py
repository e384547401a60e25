"""transformers 5's fused MoE expert tensors and the one-tensor-per-expert names.

transformers >= 5 keeps a MoE layer's experts in memory as ``experts.gate_up_proj
[E, 2I, H]`` (each expert's gate rows, then its up rows) and ``experts.down_proj
[E, H, I]``. Safetensors checkpoints, vLLM and the resharder's HF conversion name one
tensor per expert: ``experts.{e}.{gate,up,down}_proj.weight``. This module is the one
place that knows how the two correspond; it only slices and views, never copies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

_EXPERT_NAME = re.compile(
    r"(?P<prefix>.*\.experts\.)(?P<expert>\d+)\.(?P<proj>gate|up|down)_proj\.weight"
)


def unfuse_experts(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every fused expert tensor split into per-expert checkpoint names.

    Other entries pass through; works on meta tensors too (shapes only).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        prefix, _, fused = name.rpartition(".experts.")
        if fused == "gate_up_proj" and tensor.dim() == 3:
            for e, both in enumerate(tensor):
                gate, up = both.chunk(2)
                out[f"{prefix}.experts.{e}.gate_proj.weight"] = gate
                out[f"{prefix}.experts.{e}.up_proj.weight"] = up
        elif fused == "down_proj" and tensor.dim() == 3:
            out.update({f"{prefix}.experts.{e}.down_proj.weight": w for e, w in enumerate(tensor)})
        else:
            out[name] = tensor
    return out


def is_expert_name(name: str) -> bool:
    """``name`` is one expert's ``experts.{e}.{gate,up,down}_proj.weight``."""
    return _EXPERT_NAME.fullmatch(name) is not None


def fused_expert_view(
    name: str, fused: Mapping[str, torch.Tensor]
) -> tuple[str, torch.Tensor] | None:
    """Where the per-expert tensor ``name`` lives among ``fused`` tensors.

    Returns:
        ``(fused tensor's name, view of it that ``name`` fills)``, or ``None`` when
        ``name`` is not a per-expert name or ``fused`` has no such fused tensor.
    """
    match = _EXPERT_NAME.fullmatch(name)
    if match is None:
        return None
    proj = match["proj"]
    target = match["prefix"] + ("down_proj" if proj == "down" else "gate_up_proj")
    if target not in fused:
        return None
    view = fused[target][int(match["expert"])]
    if proj != "down":
        half = view.shape[0] // 2
        view = view[:half] if proj == "gate" else view[half:]
    return target, view
