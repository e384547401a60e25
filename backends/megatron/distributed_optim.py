"""Megatron's ``DistributedDataParallel`` + distributed optimizer, driven like the AdamW path.

Opt-in through ``OptimSpec.distributed_optimizer``. The Adam moments and the fp32 main
weights are sharded over data parallel: each DP rank keeps ``1/dp`` of them and updates
only its shard, then the new weights are all-gathered (Megatron's ZeRO-1). The step is
the AdamW path's step: same lr / betas / eps / decoupled weight decay on *every*
parameter (Megatron's default of no decay on biases and norms is switched off), same
global grad-norm clip, ``lr * lr_factor(step)``.

What the wrapping changes, and what it does not:

* the engine keeps the unwrapped ``GPTModel`` (canonical names, layouts, checkpoints);
  DDP only re-homes every parameter into one contiguous buffer (``param.data`` is a view)
  and accumulates grads into a second one (``param.main_grad``; ``param.grad`` stays
  ``None``);
* the engine's losses are already divided by the global normaliser, so DDP must *sum*
  over DP, not average: it is given a copy of the model config with
  ``calculate_per_token_loss`` set, Megatron's switch for exactly that;
* :func:`megatron.core.distributed.finalize_model_grads` replaces ``reduce_gradients``:
  DP reduce-scatter, TP sums of TP-replicated grads that saw only part of the data
  (sequence-parallel norms, q/k layernorms), tied embeddings across pipeline stages;
* routed experts are reduced over expert-DP, as on the AdamW path (Megatron only marks
  them so when EP > 1);
* checkpoints hold each DP rank's range of the moments (and of the fp32 main weights
  of 16-bit models) as boxes of the canonical full tensors (``sharded_state.py``), so a
  resume is exact and any layout, or torch AdamW, reads them; format-2 checkpoints held
  Megatron's DP-zero gather and still load (:meth:`DistributedOptimizer.load_state_dict`).

On the CPU the optimizer runs inside ``megatron_compat(device)``
(``backends/megatron/cpu_compat.py`` redirects its CUDA tensor factories).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from backends.megatron.layouts import is_expert_param
from backends.megatron.optim import OptimSpec, optimizer_state_tensors


class DistributedOptimizer:
    """Megatron DDP + distributed Adam over one model stage.

    Build, step and checkpoint it inside ``megatron_compat(get_device())``.

    Args:
        model: this rank's unwrapped ``GPTModel`` stage (stays the engine's model).
        optim: the step's settings (``distributed_optimizer`` is what chose this class).

    Attributes:
        ddp: the DDP wrapper (owns the parameter and gradient buffers).
        optimizer: Megatron's ``ChainedOptimizer`` (dense, and routed experts if any).
    """

    def __init__(self, model: nn.Module, optim: OptimSpec) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        for param in model.parameters():
            # Megatron's flag for "reduce over expert-DP"; it sets it only when EP > 1.
            param.allreduce = not is_expert_param(param)
        config = copy.copy(model.config)
        config.calculate_per_token_loss = True  # sum over DP: losses are pre-normalised
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            overlap_param_gather=False,
            use_distributed_optimizer=True,
        )
        self.ddp = DistributedDataParallel(config, ddp_config, model)
        optimizer_config = OptimizerConfig(
            optimizer="adam",
            lr=optim.lr,
            min_lr=optim.min_lr,
            weight_decay=optim.weight_decay,
            adam_beta1=optim.adam_beta1,
            adam_beta2=optim.adam_beta2,
            adam_eps=optim.adam_eps,
            clip_grad=optim.clip_grad,
            decoupled_weight_decay=True,
            use_distributed_optimizer=True,
            bf16=model.config.params_dtype == torch.bfloat16,
            params_dtype=model.config.params_dtype,
        )
        # config_overrides={}: no wd_mult=0 groups for biases and norms. The step uses the
        # groups' weight_decay (Megatron's scheduler, which applies wd_mult, is not used),
        # so every parameter decays, as with torch AdamW; this keeps the groups saying so.
        self.optimizer = get_megatron_optimizer(optimizer_config, [self.ddp], config_overrides={})

    def zero_grad(self) -> None:
        """Fresh, zeroed grad buffers for the next backward (re-allocated if released)."""
        self.ddp.restore_grad_buffers(synchronize=False)
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    def step(self, lr: float) -> float:
        """Reduce grads, clip, update at ``lr``; returns the grad norm before clipping."""
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.ddp])
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:  # only fp16 loss scaling skips steps, and that is never configured here
            raise RuntimeError("Megatron's optimizer skipped the step (inf/nan gradients)")
        return float(grad_norm)

    def release_gradients(self) -> None:
        """Free the grad buffers' memory (``resize_(0)``; every view stays valid)."""
        self.ddp.offload_grad_buffers(synchronize=False, empty_cache=False)

    def reload_model_params(self) -> None:
        """Copy the model's weights into the fp32 main weights after loading new ones.

        bf16 / fp16 models keep separate fp32 shards that would otherwise overwrite the
        loaded weights at the next step (fp32 models' main weights are views already).
        """
        self.optimizer.reload_model_params()

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor of the optimizer state: moments, steps and the fp32 main weights."""
        tensors = []
        for inner in self._inner_optimizers():
            for group in inner.param_groups:
                tensors += group["params"]
            tensors += optimizer_state_tensors(inner)
        return tensors

    def _inner_optimizers(self) -> list[torch.optim.Optimizer]:
        return [opt.optimizer for opt in self.optimizer.chained_optimizers]

    @torch.no_grad()  # the fp32 main weights of fp32 models are views of leaf parameters
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A format-2 checkpoint's state: param groups and steps, plus the parameter state
        gathered on DP rank 0 by ``get_parameter_state_dp_zero`` (collective; call after
        loading the model)."""
        self.optimizer.load_state_dict(state["groups"])
        for opt, param_state in zip(
            self.optimizer.chained_optimizers, state["param_state"], strict=True
        ):
            # torch AdamW (Megatron's optimizer without Apex/TE) keeps a per-parameter
            # "step" that the loader does not expect: it copies every state key from the
            # checkpoint, which has only param / exp_avg / exp_avg_sq (megatron/core/
            # optimizer/distrib_optimizer.py:938-940). And load_state_dict gave all
            # parameters one shared step tensor (:825), which AdamW would then advance
            # once per parameter. Set the steps aside, then give each its own copy.
            stepped = [(s, s.pop("step")) for s in opt.optimizer.state.values() if "step" in s]
            opt.load_parameter_state_from_dp_zero(param_state)
            for param_state_dict, step in stepped:
                param_state_dict["step"] = step.clone()
