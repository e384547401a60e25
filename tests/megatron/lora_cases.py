"""LoRA scenarios run inside spawned ranks by ``test_lora.py`` (float64, tiny models)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from backends.megatron import GPTSpec, MegatronEngine, OptimSpec, ParallelSpec
from backends.megatron.builder import destroy_parallel
from backends.megatron.checkpoint import CheckpointError
from backends.megatron.families import get_family
from backends.megatron.lora import DEFAULT_TARGETS, OUTPUT_TARGET, LoRASpec
from backends.megatron.sharding import gather_full_state_dict
from tests.megatron.cases import (
    DENSE,
    MICRO,
    batches,
    full_weights_for,
    named_weights,
    policy_loss,
    train_steps,
)
from trainers.export import write_weights

#: Untied, so the output layer takes an adapter too (on the last pipeline stage only).
SPEC = dataclasses.replace(DENSE, dtype="float64", tie_word_embeddings=False)
LORA = LoRASpec(rank=4, alpha=8.0, targets=(*DEFAULT_TARGETS, OUTPUT_TARGET))
OPTIM = OptimSpec(lr=1e-2, clip_grad=0.0)


def _finish() -> None:
    destroy_parallel()
    dist.barrier()


def base_weights(spec: GPTSpec = SPEC) -> dict[str, torch.Tensor]:
    """The shared base (per-name weights of the model without adapters)."""
    return {k: v.to(spec.torch_dtype) for k, v in full_weights_for(spec).items()}


def lora_engine(
    parallel: ParallelSpec,
    optim: OptimSpec | None = OPTIM,
    trained_adapters: bool = True,
    seed: int = 0,
    spec: GPTSpec = SPEC,
) -> MegatronEngine:
    """A LoRA engine on the shared base; ``trained_adapters``: its adapters replaced by
    per-name non-zero ones (``B`` too), as after some training, so every adapter gradient
    is non-zero; otherwise the fresh ``B = 0`` adapters."""
    base = base_weights(spec)
    engine = MegatronEngine(spec, parallel, optim, seed=seed, lora=LORA)
    engine.load_full_state_dict(base)
    if trained_adapters:
        adapters = {
            name: weight.to(spec.torch_dtype)
            for name, weight in named_weights(engine.param_layouts()).items()
            if ".lora." in name
        }
        engine.load_full_state_dict({**base, **adapters})
    return engine


def one_step(parallel: ParallelSpec, optim: OptimSpec = OPTIM, spec: GPTSpec = SPEC) -> dict:
    """One LoRA training step: loss, full grads (of what has any), weights after, and
    what the optimizer holds state of."""
    engine = lora_engine(parallel, optim, spec=spec)
    batch = batches(spec)
    before = engine.forward(batch, MICRO)["logprobs"]
    metrics = engine.train_step(batch, policy_loss, MICRO, with_entropy=True)
    result = {
        "logprobs": before,
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "grads": _grads(engine),
        "weights": engine.full_state_dict(),
        "trainable": sorted(n for n, p in engine.named_parameters().items() if p.requires_grad),
        "state_tensors": len(engine.optimizer_state_tensors()),
        "state_numel": sum(t.numel() for t in engine.optimizer_state_tensors() if t.dim() > 0),
        "adapter_numel": sum(p.numel() for p in engine.model.parameters() if p.requires_grad),
        "trainable_params": engine.trainable_params(),
        "policy": engine.policy_state_dict(),
    }
    _finish()
    return result


def _grads(engine: MegatronEngine) -> dict[str, torch.Tensor]:
    if engine.distributed is None:
        return gather_full_state_dict(engine.model, grads=True)
    return {}  # DDP keeps them in its buffers (main_grad); the step's result is compared


def fresh_adapters_and_reference(rank: int, world: int) -> dict:
    """Log-probs of the base model, of a fresh LoRA model on it (``B = 0``), and of a
    trained LoRA model with its adapters on and off; adapter counts."""
    batch = batches(SPEC)
    base = MegatronEngine(SPEC, ParallelSpec())
    base.load_full_state_dict(base_weights())
    reference = base.forward(batch, MICRO)["logprobs"]
    fresh = lora_engine(ParallelSpec(), trained_adapters=False)
    fresh_logprobs = fresh.forward(batch, MICRO)["logprobs"]
    trained = lora_engine(ParallelSpec())
    with trained.adapters_off():
        off = trained.forward(batch, MICRO)["logprobs"]
    on = trained.forward(batch, MICRO)["logprobs"]
    as_built = MegatronEngine(SPEC, ParallelSpec(), lora=LORA)  # its own init, nothing loaded
    policy, weights = as_built.policy_state_dict(), as_built.full_state_dict()
    as_built_policy_is_base = all(torch.equal(policy[n], weights[n]) for n in policy)
    _finish()
    return {
        "base": reference,
        "fresh": fresh_logprobs,
        "off": off,
        "on": on,
        "as_built_policy_is_base": as_built_policy_is_base,
    }


BASE = {"random_init_seed": 0}
RESUME_OPTIM = OptimSpec(lr=1e-2, lr_schedule="cosine", lr_warmup_steps=1, total_steps=4)
#: Under the checkpoint root: a LoRA run's steps whose base is an HF folder (``HF_BASE``).
HF_ORIGIN, HF_BASE, RERUN = "hf_origin", "hf_of_the_base", "rerun"


def resume(checkpoint_root: str) -> dict:
    """Losses of 4 LoRA steps straight vs 2, save, a fresh engine, resume, 2 more; what
    resuming on another base or without LoRA says. The same step saved again as a run
    whose base is an HF folder (written here) saves no base of its own."""
    optim = RESUME_OPTIM
    straight = lora_engine(ParallelSpec(), optim, trained_adapters=False)
    uninterrupted = train_steps(straight, 0, 4)
    first = lora_engine(ParallelSpec(), optim, trained_adapters=False)
    first.base_origin = BASE
    train_steps(first, 0, 2)
    step_dir = first.save_checkpoint(checkpoint_root, data_position={"next_step": 2})
    first.finish_checkpoint()
    policy = first.policy_state_dict()
    hf_base = str(Path(checkpoint_root) / HF_BASE)
    write_weights(base_weights(), base_weights(), SPEC, hf_base)
    first.base_origin = {"hf_path": hf_base, "gguf_package": None}
    hf_origin_step = first.save_checkpoint(Path(checkpoint_root) / HF_ORIGIN, {"next_step": 2})
    resumed = lora_engine(ParallelSpec(), optim, trained_adapters=False, seed=5)
    resumed.base_origin = BASE
    position = resumed.load_checkpoint(checkpoint_root)
    after = train_steps(resumed, position["next_step"], 4)
    rerun = Path(checkpoint_root) / RERUN  # a fresh run into a folder another run used
    first.save_checkpoint(rerun, {"next_step": 2})
    fresh_run = MegatronEngine(SPEC, ParallelSpec(), optim, lora=LORA)  # its own init
    fresh_run.base_origin = BASE
    fresh_run.save_checkpoint(rerun, {"next_step": 0})
    fresh_base = fresh_run.full_state_dict()
    other_base = lora_engine(ParallelSpec(), optim, trained_adapters=False)
    other_base.base_origin = {"hf_path": "/elsewhere", "gguf_package": None}
    full_weights = MegatronEngine(SPEC, ParallelSpec(), optim)
    refusals = [_refusal(engine, checkpoint_root) for engine in (other_base, full_weights)]
    _finish()
    return {
        "uninterrupted": uninterrupted,
        "resumed": after,
        "step_dir": str(step_dir),
        "hf_origin_step_dir": str(hf_origin_step),
        "fresh_base": fresh_base,
        "policy": policy,
        "refusals": refusals,
    }


def _refusal(engine: MegatronEngine, root: str) -> str | None:
    try:
        engine.load_checkpoint(root)
    except CheckpointError as exc:
        return str(exc)
    return None


def unmatched_target_refusal() -> str | None:
    """Building a LoRA engine whose target names no linear of the model (MLA has no fused
    ``linear_qkv``): the refusal, or None."""
    from tests.megatron.deepseek_cases import tiny_spec

    spec = tiny_spec()
    try:
        MegatronEngine(
            spec, ParallelSpec(), OPTIM, lora=dataclasses.replace(LORA, targets=("qkv",))
        )
    except ValueError as exc:
        return str(exc)
    finally:
        destroy_parallel()
    return None


def tied_output_refusal() -> str | None:
    """Building a LoRA engine with the ``output`` target on a tied model: the refusal."""
    try:
        MegatronEngine(DENSE, ParallelSpec(), OPTIM, lora=LORA)
    except ValueError as exc:
        return str(exc)
    finally:
        destroy_parallel()
    return None


TINY = Path(__file__).parents[2] / "configs" / "tiny.yaml"


def handover(rank: int, world: int) -> dict:
    """The tiny recipe's actor with LoRA (training TP2 -> generation TP1, swap on): what
    each hand-over moved and whether the engine then holds exactly the policy, first,
    after LoRA steps, and after a new base is loaded."""
    from mindrl.config.layout import training_layout
    from mindrl.config.loader import load_config
    from mindrl.config.specs import engine_specs
    from mindrl.workers.model_setup import initial_model
    from mindrl.workers.rollout import Rollout

    config = load_config(TINY, ["rollout.swap=true", "actor.lora.rank=8"])
    initial = initial_model(config.model)
    specs = engine_specs(config.actor, training_layout(config.actor, config.model, world), 10)
    trainer = MegatronEngine(initial.spec, specs.parallel, specs.optim, lora=specs.lora)
    rollout = Rollout(trainer, config, initial, world)
    family = get_family(initial.spec.family)
    engine_weights = dict(rollout.generator.model.named_parameters())

    def hand_over() -> dict:
        rollout.refresh_weights()
        rollout.restore_training_state()  # the trainer's weights are on the host until then
        policy = family.megatron_to_hf(trainer.policy_state_dict(), initial.spec)
        same = all(torch.equal(engine_weights[n], w) for n, w in policy.items())
        return {"bytes": rollout.take_handover_bytes(), "engine_is_policy": same}

    def train(steps: int) -> None:
        for step in range(steps):
            batch = batches(initial.spec, seed=step)
            trainer.train_step(batch, policy_loss, MICRO, with_entropy=True)

    full = trainer.full_state_dict()
    sizes = {
        "base": sum(t.nbytes for n, t in full.items() if ".lora." not in n),
        "adapters": sum(t.nbytes for n, t in full.items() if ".lora." in n),
    }
    first = hand_over()
    as_handed = trainer.policy_state_dict()
    train(3)
    trained = trainer.policy_state_dict()
    moved = [n for n, w in as_handed.items() if not torch.equal(trained[n], w)]
    later = [hand_over()]
    train(1)
    later.append(hand_over())
    trainer.load_full_state_dict({n: t * 0.5 for n, t in full.items() if ".lora." not in n})
    reloaded = hand_over()
    _finish()
    return {"sizes": sizes, "first": first, "later": later, "reloaded": reloaded, "moved": moved}


def on_one_rank(rank: int, world: int, checkpoint_root: str) -> dict:
    return {
        "unmatched": unmatched_target_refusal(),
        "tied_output": tied_output_refusal(),
        "base": base_weights(),
        "tp1": one_step(ParallelSpec()),
        "logprobs": fresh_adapters_and_reference(rank, world),
        "resume": resume(checkpoint_root),
    }


def resume_at_tp2(checkpoint_root: str) -> list[float]:
    """Losses of the 2 steps after resuming :func:`resume`'s checkpoint (one rank) at TP=2,
    on an engine as built (its own random base, drawn for this layout), as a run whose
    base is a random init resumes: the checkpoint's ``base/`` replaces it."""
    engine = MegatronEngine(SPEC, ParallelSpec(tp=2), RESUME_OPTIM, lora=LORA)
    engine.base_origin = BASE
    position = engine.load_checkpoint(checkpoint_root)
    losses = train_steps(engine, position["next_step"], 4)
    _finish()
    return losses


def on_two_ranks(rank: int, world: int, checkpoint_root: str) -> dict:
    # Megatron's distributed optimizer takes no float64 weights: float32.
    distributed = dataclasses.replace(OPTIM, distributed_optimizer=True)
    return {
        "resumed_at_tp2": resume_at_tp2(checkpoint_root),
        "tp2": one_step(ParallelSpec(tp=2)),
        "pp2": one_step(ParallelSpec(pp=2)),
        "tp2_distributed_fp32": one_step(
            ParallelSpec(tp=2), distributed, spec=dataclasses.replace(SPEC, dtype="float32")
        ),
        "handover": handover(rank, world),
    }
