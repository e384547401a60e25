"""The TRL side of benchmarks/e2e.py: TRL's ``GRPOTrainer`` set up like a mindrl config.

Every GRPO setting is read from the resolved mindrl config, so both systems train the
same weights on the same prompts (in the same order), with the same reward code, batch
shape, lengths, optimizer and seed. Install TRL with ``bash scripts/install_trl.sh``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindrl.config import MindRLConfig
from mindrl.data.run_prompts import prompt_dataset
from mindrl.rewards import decode_responses, score_batch

# mindrl's loss aggregation -> TRL's loss_type with the same normaliser. "dapo" divides
# by the active-token count of the whole accumulated generation batch = token-mean
# over the global batch ("bnpo" would divide per micro-batch instead).
LOSS_TYPES = {
    "token-mean": "dapo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum-norm": "dr_grpo",
}


class TrlMissingError(RuntimeError):
    """TRL (or its datasets dependency) is not importable."""


def import_trl() -> Any:
    """The ``trl`` module, or a one-line error saying how to install it."""
    try:
        import datasets  # noqa: F401  (TRL's trainer needs it; fail here, not later)
        import trl
    except ImportError as error:
        raise TrlMissingError(
            f"TRL is not installed ({error.name} missing); run: bash scripts/install_trl.sh"
        ) from None
    return trl


@dataclass
class TrlSteps:
    """What one TRL run records per optimizer step (= one mindrl iteration)."""

    step_end_s: list[float] = field(default_factory=list)
    reward_mean: list[float] = field(default_factory=list)
    prompt_length_mean: list[float] = field(default_factory=list)
    response_length_mean: list[float] = field(default_factory=list)
    logged: list[dict[str, float]] = field(default_factory=list)  # TRL's own, per step


def iteration_prompts(config: MindRLConfig, tokenizer: Any) -> tuple[list[str], list[str]]:
    """Prompt texts and answers in the order mindrl's data loader serves them.

    The same records, chat template and per-epoch shuffle as mindrl (PromptDataset with
    the run's seed): TRL, given them unshuffled, sees mindrl's batch ``k`` at step ``k``.
    """
    dataset = prompt_dataset(config, tokenizer)
    texts: list[str] = []
    answers: list[str] = []
    for _ in range(config.iterations):
        batch = dataset.next_batch()
        texts += batch.texts
        answers += batch.ground_truths
    return texts, answers


def make_reward_function(config: MindRLConfig, tokenizer: Any, steps: TrlSteps):
    """A TRL reward function scoring with mindrl's verifiers and decoding.

    TRL hands over ``completion_ids`` (cut after eos) and the dataset's extra columns;
    mindrl's ``decode_responses`` keeps special tokens TRL's text would drop, so the
    reward of a response is the same number in both systems.
    """
    verifiers = list(config.reward.verifiers)

    def mindrl_reward(completions, completion_ids, answer, prompt_tokens, **_):
        texts = decode_responses(completion_ids, tokenizer)
        rewards = score_batch(texts, answer, verifiers)
        steps.reward_mean.append(float(rewards.mean()))
        steps.prompt_length_mean.append(sum(prompt_tokens) / len(prompt_tokens))
        steps.response_length_mean.append(sum(map(len, completion_ids)) / len(completion_ids))
        return rewards.tolist()

    return mindrl_reward


def grpo_config(config: MindRLConfig, output_dir: Path) -> Any:
    """TRL ``GRPOConfig`` equal to the mindrl config's GRPO settings (one step = G x N)."""
    from trl import GRPOConfig

    from trainers.registry import get_algorithm

    samples = config.data.global_batch_size * config.data.n_samples_per_prompt
    micro = min(config.actor.micro_batch_size, samples)
    if samples % micro:
        micro = samples  # TRL needs whole micro-batches; one micro-batch is always valid
    optim = config.actor.optim
    algo = get_algorithm("grpo").resolve(config.algorithm)  # with GRPO's defaults
    return GRPOConfig(
        output_dir=str(output_dir),
        max_steps=config.iterations,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=samples // micro,
        num_generations=config.data.n_samples_per_prompt,
        max_completion_length=config.rollout.max_response_length,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        top_k=max(config.rollout.top_k, 0),  # mindrl -1 = TRL 0 = off
        learning_rate=optim.lr,
        lr_scheduler_type="constant" if optim.lr_schedule == "constant" else "cosine",
        warmup_steps=optim.lr_warmup_steps,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.adam_beta1,
        adam_beta2=optim.adam_beta2,
        adam_epsilon=optim.adam_eps,
        max_grad_norm=optim.clip_grad,
        beta=algo.kl_coef,  # TRL's KL is k3 = mindrl's low_var_kl without the clamps
        epsilon=algo.clip_low,
        epsilon_high=algo.clip_high,
        delta=algo.clip_c,  # caps the ratio: mindrl's dual clip for negative advantages
        scale_rewards="group" if algo.norm_adv_by_std else "none",
        loss_type=LOSS_TYPES[algo.loss_agg_mode],
        entropy_coef=algo.entropy_coef,
        num_iterations=config.actor.ppo_epochs,
        shuffle_dataset=False,  # the dataset is already in mindrl's order
        use_vllm=False,
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16; mindrl trains in the config's float32
        gradient_checkpointing=False,  # TRL defaults to on; mindrl's config has it off
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=config.seed,
        data_seed=config.seed,
    )


# TRL's logged names -> mindrl's metric names, kept to compare the two runs' training.
LOGGED_KEYS = {"grad_norm": "grad_norm", "entropy": "entropy", "loss": "loss", "kl": "kl"}


def step_timer(steps: TrlSteps) -> Any:
    """A TrainerCallback stamping the wall time at the start and after every step, and
    keeping TRL's logged grad norm, entropy, loss and KL of each step."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            steps.step_end_s.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            steps.step_end_s.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:  # a training step's log (not the final summary)
                kept = {ours: float(logs[theirs]) for theirs, ours in LOGGED_KEYS.items()
                        if logs.get(theirs) is not None}  # fmt: skip
                steps.logged.append(kept)

    return StepTimer()


def train_trl(config: MindRLConfig, model_folder: Path, tokenizer: Any, work_dir: Path) -> dict:
    """Run TRL's GRPOTrainer for ``config.iterations`` steps; mindrl-style records.

    Returns:
        ``{"setup_s": ..., "records": [...]}``, one record per step with the keys of
        mindrl's metrics.jsonl: iteration, reward_mean, iteration_time_s,
        prompt_length_mean, response_length_mean.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    started = time.perf_counter()
    texts, answers = iteration_prompts(config, tokenizer)
    prompt_tokens = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    dataset = Dataset.from_dict(
        {"prompt": texts, "answer": answers, "prompt_tokens": prompt_tokens}
    )
    dtype = getattr(torch, config.model.dtype)
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=dtype)
    steps = TrlSteps()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=make_reward_function(config, tokenizer, steps),
        args=grpo_config(config, work_dir / "trl-output"),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[step_timer(steps)],
    )
    trainer.remove_callback(PrinterCallback)  # one dict per step on stdout; we report ours
    setup_s = time.perf_counter() - started
    trainer.train()
    return {"setup_s": setup_s, "records": trl_records(steps)}


def trl_records(steps: TrlSteps) -> list[dict]:
    """One mindrl-style record per finished optimizer step."""
    ends = steps.step_end_s
    return [
        {
            "iteration": index,
            "reward_mean": steps.reward_mean[index],
            "iteration_time_s": ends[index + 1] - ends[index],
            "prompt_length_mean": steps.prompt_length_mean[index],
            "response_length_mean": steps.response_length_mean[index],
            **(steps.logged[index] if index < len(steps.logged) else {}),
        }
        for index in range(min(len(ends) - 1, len(steps.reward_mean)))
    ]
