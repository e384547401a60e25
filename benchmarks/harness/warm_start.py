"""A supervised warm start for a benchmark's policy: the config's model trained by teacher
forcing on the right answers of its digit task, saved as an HF folder to run from
(``model.hf_path``).

Why: RL starts from a fine-tuned model in practice, and some measurements need its
behaviour. Partial rollout is one: an untrained policy rarely emits eos, so every response
runs to ``rollout.max_response_length`` and no response is long *because its prompt asks
for more*. After this warm start a policy answers ``synthetic:longtail``'s short prompts in
2-3 tokens and its 12-digit ones in ~13, the per-prompt long tail the paper and Kimi k1.5
describe. The pairs' "chosen" responses are the right answers (mindrl/data/pairs.py:
prompt with the run's template, answer + eos), so the tokens are the ones the run sees.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from mindrl.config.schema import MindRLConfig


def warm_start(
    config: MindRLConfig, out_dir: Path, steps: int, lr: float = 1e-3, seed: int = 0
) -> dict:
    """Train ``config``'s model for ``steps`` AdamW steps of ``data.global_batch_size``
    teacher-forced (prompt, right answer) pairs of ``data.source``; save it to ``out_dir``.

    Returns:
        ``{"hf_path", "steps", "loss_first", "loss_last", "seconds"}``.
    """
    from transformers import AutoModelForCausalLM

    from mindrl.data.pairs import pair_dataset
    from mindrl.data.tokenizer import load_tokenizer
    from mindrl.workers.model_setup import initial_model, pretrained_config

    torch.manual_seed(seed)
    tokenizer = load_tokenizer(config.model.tokenizer)
    pairs = pair_dataset(config, tokenizer)
    model = AutoModelForCausalLM.from_config(
        pretrained_config(initial_model(config.model).hf_config)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    start, losses = time.perf_counter(), []
    for _ in range(steps):
        batch = pairs.next_pairs()
        ids, labels = _teacher_forced(batch.prompt_ids, batch.chosen_ids, tokenizer.eos_token_id)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    return {
        "hf_path": str(out_dir),
        "steps": steps,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "seconds": time.perf_counter() - start,
    }


def _teacher_forced(
    prompts: list[list[int]], answers: list[list[int]], pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prompt + answer rows; labels score the answer tokens only (-100
    elsewhere: transformers' ignore index)."""
    width = max(len(p) + len(a) for p, a in zip(prompts, answers, strict=True))
    ids = torch.full((len(prompts), width), pad)
    labels = torch.full((len(prompts), width), -100)
    for row, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        sequence = torch.tensor(prompt + answer)
        ids[row, : len(sequence)] = sequence
        labels[row, len(prompt) : len(sequence)] = torch.tensor(answer)
    return ids, labels
