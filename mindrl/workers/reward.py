"""Reward workers: rule-based scoring and advantage estimation on CPU processes.

Each worker serves the ``reward`` and ``advantage`` stages of the run plan (its
:class:`~mindrl.workers.context.StageContext`): it fetches what each stage reads (the
responses, the ground truth and group the driver put beside each prompt) and puts what
the stage writes. The algorithm (shaping, advantages, group filter) is the object the
trainer handed over.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray
import torch
from ray.actor import ActorHandle

from mindrl.data import load_tokenizer
from mindrl.data.records import PromptRecord, records_from_fields
from mindrl.dock import DockHandle
from mindrl.rewards.inputs import RewardInput
from mindrl.rewards.judge import serve_model
from mindrl.rewards.registry import decode_responses
from mindrl.rewards.report import scoring_report
from mindrl.rewards.routing import reward_spec_of
from mindrl.rewards.scoring import RewardScorer
from mindrl.run_plan import ENV_REWARD, FILTER_READS, GROUP_ID, LOSS_MASK
from mindrl.workers.context import StageContext
from mindrl.workers.sequences import last_counted, loss_mask
from mindrl.workers.stage_report import stage_report
from mindrl.workers.timed_dock import TimedDockClient


class RewardWorker:
    """Scores responses and computes advantages (one of ``size`` CPU workers)."""

    def __init__(
        self, rank: int, size: int, context: StageContext, judge: ActorHandle | None = None
    ) -> None:
        """``judge``: the run's judge server (mindrl/workers/judge_server.py), which the
        ``judge`` reward asks instead of loading ``reward.judge.model`` here."""
        self.rank, self.context, self.config = rank, context, context.config
        self.algorithm, self.options = context.algorithm, context.options
        config = self.config
        if judge is not None:
            serve_model(config.reward.judge["model"], _asking(judge))
        self.tokenizer = load_tokenizer(config.model.tokenizer)
        self.scorer = None
        if not config.env.enabled:  # an episode's reward is its environment's
            spec = reward_spec_of(config.reward)
            self.scorer = RewardScorer(spec, config.reward.processes_per_worker)
        self.reward_model = None
        if config.reward.reward_model:
            from mindrl.rewards.model import RewardModel

            self.reward_model = RewardModel(config.reward.reward_model)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def attach(self, dock: DockHandle) -> None:
        """Talk to this dock from now on (it is made after the workers are placed)."""
        self.dock = TimedDockClient(dock)

    def close(self) -> None:
        """End the reward functions' processes (the run is over)."""
        if self.scorer is not None:
            self.scorer.close()

    def score(self, indexes: np.ndarray) -> dict[str, Any]:
        """Put the sequence ``reward`` of every sample in ``indexes``: its route's functions'
        weighted sum (and the reward model's score), or with an environment the sum of its
        step rewards."""
        start = time.perf_counter()
        reads = self.context.stage("reward").reads
        if ENV_REWARD in reads:
            return self._episode_rewards(indexes, start)
        data = self.dock.fetch(indexes, list(reads))
        rewards, scoring = self._rewards(indexes, data)
        self.dock.put(indexes, {"reward": rewards})
        return self._score_report(indexes, data, rewards, start) | scoring

    def score_with_advantages(self, indexes: np.ndarray) -> dict[str, Any]:
        """The ``reward`` stage and a group-local estimator's ``advantage`` stage on whole
        groups ``indexes`` in one call: one fetch and one put instead of two of each.
        Continuous generation scores each group as it finishes, in small chunks, where
        the second stage's claim, fetch, put and report cost more than its arithmetic."""
        start = time.perf_counter()
        reads = [*self.context.stage("reward").reads, *self.context.stage("advantage").reads]
        data = self.dock.fetch(indexes, [f for f in dict.fromkeys(reads) if f != "reward"])
        rewards, scoring = self._rewards(indexes, data)
        advantages, _ = self._advantages_of(data, rewards)
        self.dock.put(indexes, {"reward": rewards, **advantages})
        return self._score_report(indexes, data, rewards, start) | scoring

    def _rewards(self, indexes: np.ndarray, data: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """Each fetched sample's reward (0 where it failed: the driver's failure policy
        decides what becomes of it), and the reward part of the stage's report."""
        responses = _responses(data)
        texts = decode_responses(responses, self.tokenizer)
        inputs = [
            RewardInput.of(record, text)
            for record, text in zip(records_from_fields(data), texts, strict=True)
        ]
        fetched = set(data.keys())  # a TensorDict iterates over its rows, not its keys
        groups = data[GROUP_ID].numpy() if GROUP_ID in fetched else None
        scored = self.scorer.score(inputs, groups)
        rewards = torch.from_numpy(scored.rewards)
        if self.reward_model is not None:
            rewards = rewards + self._model_scores(data, responses)
        return rewards, scoring_report(scored, indexes, inputs)

    def _score_report(
        self, indexes: np.ndarray, data: Any, rewards: torch.Tensor, start: float
    ) -> dict[str, Any]:
        lengths = data["response_ids_lengths"].tolist()
        return {
            "reward_sum": float(rewards.sum()),
            "response_tokens": float(sum(lengths)),
            "count": len(indexes),
            # Per sample, for a driver whose scored samples train in different iterations
            # (continuous generation): its record sums the trained ones.
            "indexes": np.asarray(indexes),
            "sample_rewards": rewards.numpy().astype(np.float64),
            "sample_tokens": np.asarray(lengths, dtype=np.float64),
            **self._timing(start),
        }

    def _episode_rewards(self, indexes: np.ndarray, start: float) -> dict[str, float]:
        """A multi-turn run's rewards: what its environment gave each episode."""
        data = self.dock.fetch(indexes, list(self.context.stage("reward").reads))
        rewards = data[ENV_REWARD].float()
        self.dock.put(indexes, {"reward": rewards})
        return {
            "reward_sum": float(rewards.sum()),
            "response_tokens": float(data["response_ids_lengths"].sum()),
            "count": len(indexes),
            **self._timing(start),
        }

    def _model_scores(self, data: Any, responses: list[list[int]]) -> torch.Tensor:
        """The reward model's score of each decoded prompt + response."""
        prompt_rows = zip(data["prompt_ids"], data["prompt_ids_lengths"].tolist(), strict=True)
        return self._model_scores_of([row[:n].tolist() for row, n in prompt_rows], responses)

    def _model_scores_of(self, prompts: list[list[int]], responses: list[list[int]]):
        texts = decode_responses(responses, self.tokenizer)
        return self.reward_model.score([self.tokenizer.decode(p) for p in prompts], texts)

    def score_held_out(
        self, prompts: list[list[int]], responses: list[list[int]], records: list[PromptRecord]
    ) -> tuple[list[float], list[bool] | None]:
        """Validation: the rewards of responses the driver hands over (never in the dock,
        so never trained on), scored exactly like training's, and whether each passed:
        every function that scored it gave full credit (1.0; None without any function)."""
        texts = decode_responses(responses, self.tokenizer)
        inputs = [RewardInput.of(record, text) for record, text in zip(records, texts, strict=True)]
        scored = self.scorer.score(inputs)
        rewards = torch.from_numpy(scored.rewards)
        if self.reward_model is not None:
            rewards = rewards + self._model_scores_of(prompts, responses)
        if not self.scorer.functions:
            return rewards.tolist(), None
        return rewards.tolist(), scored.passed.tolist()

    def _timing(self, start: float) -> dict[str, float]:
        return stage_report(start, self.dock)

    def keep(self, indexes: np.ndarray) -> np.ndarray:
        """The subset of ``indexes`` the algorithm trains on (DAPO: groups whose rewards differ)."""
        data = self.dock.fetch(indexes, list(FILTER_READS))
        mask = self.algorithm.keep_mask(data["reward"], data[GROUP_ID], self.options)
        return indexes[mask.numpy().astype(bool)]

    def advantages(self, indexes: np.ndarray) -> dict[str, float]:
        """Put ``advantages`` (and ``returns`` with a critic, whose values the stage reads)
        for whole groups ``indexes``."""
        start = time.perf_counter()
        data = self.dock.fetch(indexes, list(self.context.stage("advantage").reads))
        put, score = self._advantages_of(data, data["reward"])
        self.dock.put(indexes, put)
        return {"score_mean": score, **self._timing(start)}

    def _advantages_of(
        self, data: Any, rewards: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], float]:
        """The fields the advantage stage puts for fetched whole groups with sequence
        ``rewards``, and the mean shaped score."""
        reads = self.context.stage("advantage").reads
        inputs = [f for f in reads if f not in ("reward", "response_ids", GROUP_ID, LOSS_MASK)]
        lengths = data["response_ids_lengths"]
        width = data["response_ids"].shape[1]
        mask = loss_mask(lengths, width, data[LOSS_MASK] if LOSS_MASK in reads else None)
        token_rewards = torch.zeros(len(lengths), width)
        token_rewards[torch.arange(len(lengths)), last_counted(mask)] = rewards
        shaped = self.algorithm.shape_rewards(
            token_rewards * mask, mask, self.config.rollout.max_response_length, self.options
        )
        batch = {"token_rewards": shaped, "response_mask": mask}
        batch["group_ids"] = data[GROUP_ID]
        for name in inputs:  # values, and what the estimator reads beyond them
            batch[name] = data[name][:, :width].float()
        out = self.algorithm.compute_advantages(batch, self.options)
        put = {"advantages": out["advantages"].float(), "advantages_lengths": lengths}
        if "returns" in out:
            put |= {"returns": out["returns"].float(), "returns_lengths": lengths}
        return put, float((shaped * mask).sum(-1).mean())


def _responses(data: Any) -> list[list[int]]:
    """Each fetched response's token ids, without padding."""
    lengths = data["response_ids_lengths"].tolist()
    return [row[:n].tolist() for row, n in zip(data["response_ids"], lengths, strict=True)]


def _asking(server: ActorHandle):
    """``generate(prompts)`` answered by the judge server."""

    def generate(prompts: list[str]) -> list[str]:
        return ray.get(server.generate.remote(prompts))

    return generate
