"""Multi-turn episodes into the dock: the rollout of a run with an environment.

Each index the rank generates is one episode (docs/architecture.md §12): the
environment's ``reset`` gives the text it starts with, then turn by turn the model writes
(until the stop token, one of the class's ``stop_strings``, ``env.max_turn_tokens`` or the
trajectory's room), the environment
``step``s on the turn's text, and its observation's tokens are appended, until ``done``,
``env.max_turns`` turns, or no room for the observation and one more token (the context:
``rollout.max_response_length`` tokens after the prompt). The observation of the last
step is not appended: no model turn follows it, so a trajectory ends with a model token.

Batching: every episode whose observation is back goes into the next engine call, one
call for all of them. Steps run on the environment workers (Ray actors,
mindrl/workers/env_worker.py) concurrently; after a call the loop waits for the first
step to come back, then for the others at most as long again, and a step still running
joins a later call: a slow step delays its own episode, not the batch.

What goes into the dock per episode, once it ends: ``response_ids`` (every turn and
observation after the prompt), ``rollout_logprob`` (the sampling log-prob of each model
token, 0 on observations), ``loss_mask`` (1 on the model's tokens, 0 on observations) and
``env_reward`` (the sum of its step rewards); ``prompt_ids`` too when ``reset`` returned
another text than the record's prompt.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import torch
from ray.actor import ActorHandle

from backends.generation import GenerationResult, SamplingParams
from mindrl.config.schema import MindRLConfig
from mindrl.data.dataset import render_prompt
from mindrl.data.records import RECORD_FIELDS, PromptRecord, records_from_fields
from mindrl.dock import DockClient
from mindrl.envs import EnvironmentFailed
from mindrl.rewards import decode_responses
from mindrl.run_plan import ENV_REWARD, LOSS_MASK
from mindrl.workers.sequences import unpadded

Generate = Callable[[list[list[int]], SamplingParams], list[GenerationResult]]

#: After the first step of a round comes back, the loop waits for the rest at most this
#: many times as long as that step took (and at least MIN_WAIT_S): steps of one kind end
#: together and go into one engine call; a much slower one does not hold it up.
WAIT_FACTOR = 1.0
MIN_WAIT_S = 0.005
#: Each turn's sampling seed: the draw's seed + first index + turn x this (turn 0 is the
#: single-turn rollout's seed, so an episode of one turn samples what it samples).
TURN_SEED_STRIDE = 1_000_003

#: How an episode ended: the environment said done, or it was cut.
DONE, MAX_TURNS, CONTEXT = "done", "max_turns", "context"


class TextCodec:
    """Text <-> tokens as the episode loop needs them, with the run's tokenizer."""

    def __init__(self, tokenizer: Any, chat: str) -> None:
        self.tokenizer, self.chat = tokenizer, chat

    def encode(self, text: str) -> list[int]:
        """An observation's tokens, appended as they are (no special tokens added)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """A model turn's text for ``step``, decoded as the verifiers decode a response
        (cut at the stop token; other special tokens kept as written)."""
        return decode_responses([ids], self.tokenizer)[0]

    def stop_sequences(self, stops: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """The stop strings as the tokenizer spells them: the engine stops a row on these."""
        return tuple(tuple(self.encode(text)) for text in stops)

    def stop_end(self, ids: Sequence[int], stops: Sequence[str]) -> int:
        """How many of a turn's ``ids`` it keeps: through the token whose text completes the
        first stop string, however the model spelled it (a spelling other than the
        tokenizer's own, e.g. a token that also carries the next character, does not stop
        the engine); all of them when the turn holds none."""
        if not stops or not any(text in self.decode(ids) for text in stops):
            return len(ids)
        return next(
            end for end in range(1, len(ids) + 1) if any(t in self.decode(ids[:end]) for t in stops)
        )

    def render(self, text: str) -> list[int]:
        """A start ``reset`` made, as the dataset makes a prompt's ids (chat template)."""
        return list(self.tokenizer(render_prompt(text, self.tokenizer, self.chat))["input_ids"])


@dataclass
class EnvSettings:
    """The ``env`` section as the episode loop reads it, with the lengths resolved."""

    max_turns: int
    max_turn_tokens: int
    room: int  # tokens after the prompt (rollout.max_response_length)
    max_prompt: int  # rollout.max_prompt_length: a start reset makes must fit it

    @classmethod
    def of(cls, config: MindRLConfig) -> EnvSettings:
        rollout, env = config.rollout, config.env
        turn = env.max_turn_tokens or rollout.max_response_length
        return cls(env.max_turns, turn, rollout.max_response_length, rollout.max_prompt_length)


@dataclass
class Episode:
    """One episode so far: its context and what the dock will get of it."""

    index: int
    record: PromptRecord
    worker: ActorHandle
    prompt: list[int]
    prompt_replaced: bool = False
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[float] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    observation_tokens: int = 0
    end: str | None = None
    action: list[int] = field(default_factory=list)  # the last turn's tokens

    def room(self, settings: EnvSettings) -> int:
        """Tokens the next turn may take."""
        return min(settings.max_turn_tokens, settings.room - len(self.tokens))

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        """Append a model turn (``logprobs``) or an observation (None)."""
        self.tokens += list(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.mask += [1.0 if logprobs is not None else 0.0] * len(ids)


@dataclass
class EpisodeReport:
    """The rank's episodes, summed: what the driver's record reports (``env_*``)."""

    episodes: int = 0
    turns: int = 0
    observation_tokens: int = 0
    response_tokens: int = 0
    step_s: float = 0.0  # summed over steps: seconds inside the environment's step
    step_queue_s: float = 0.0  # summed over steps: seconds a step waited to start
    steps: int = 0
    wait_s: float = 0.0  # the loop idle, every live episode waiting on its step
    engine_s: float = 0.0
    truncated_max_turns: int = 0
    truncated_context: int = 0

    def book(self, episode: Episode) -> None:
        self.episodes += 1
        self.turns += episode.turns
        self.observation_tokens += episode.observation_tokens
        self.response_tokens += len(episode.tokens)
        self.truncated_max_turns += episode.end == MAX_TURNS
        self.truncated_context += episode.end == CONTEXT

    def as_dict(self) -> dict[str, float]:
        return {f"env_{k}": float(v) for k, v in dataclasses.asdict(self).items()}


def run_episodes_into_dock(
    dock: DockClient,
    generate: Generate,
    workers: Sequence[ActorHandle],
    indexes: np.ndarray,
    params: SamplingParams,
    settings: EnvSettings,
    codec: TextCodec,
    put: bool = True,
) -> dict[str, float]:
    """Run one episode per index and put each trajectory into the dock as it ends.

    Args:
        dock: this process's dock client (the prompts and their records are in it).
        generate: the generation engine's ``generate``.
        workers: the environment workers; episode ``i`` lives on ``workers[i % W]``.
        indexes: the episodes to run (dock indexes).
        params: the draw's sampling settings (each turn's ``max_tokens`` is set here).
        settings: turns and lengths.
        codec: the run's tokenizer (observations in, turns out, replaced prompts).
        put: False on a TP peer that sampled the same episodes as its leader.

    Returns:
        ``response_tokens`` (every trajectory token after the prompts) and the ``env_*``
        figures of :class:`EpisodeReport`.

    Raises:
        EnvironmentFailed: an environment raised; the line names its class and the prompt.
    """
    report = EpisodeReport()
    stops = ray.get(workers[0].turn_stop_strings.remote())
    params = dataclasses.replace(
        params, stop_sequences=(*params.stop_sequences, *codec.stop_sequences(stops))
    )
    episodes = _start(dock, workers, indexes, codec, settings.max_prompt)
    ready, pending = list(episodes), {}
    turn = 0
    while ready or pending:
        if ready:
            start = time.perf_counter()
            _model_turn(generate, ready, params, settings, turn, codec, stops)
            report.engine_s += time.perf_counter() - start
            submitted = time.perf_counter()
            pending |= {
                ep.worker.step.remote(ep.index, codec.decode(ep.action)): (ep, submitted)
                for ep in ready
            }
            ready, turn = [], turn + 1
        start = time.perf_counter()
        stepped = _steps_back(pending)
        report.wait_s += time.perf_counter() - start
        finished = []
        for ref in stepped:
            episode, _ = pending.pop(ref)
            observation, reward, done, inside, queued = _get(ref)
            report.step_s, report.step_queue_s = (
                report.step_s + inside,
                report.step_queue_s + queued,
            )
            report.steps += 1
            if _after_step(episode, observation, reward, done, settings, codec):
                ready.append(episode)
            else:
                finished.append(episode)
        for episode in finished:
            report.book(episode)
        if finished and put:
            _put(dock, finished)
        _close(finished)
    return {"response_tokens": float(report.response_tokens), **report.as_dict()}


def _start(
    dock: DockClient,
    workers: Sequence[ActorHandle],
    indexes: np.ndarray,
    codec: TextCodec,
    max_prompt: int,
) -> list[Episode]:
    """Reset every episode (concurrently) with the record the driver put beside its prompt,
    and build its starting context.

    Raises:
        EnvironmentFailed: a start ``reset`` made is longer than ``max_prompt`` tokens.
    """
    data = dock.fetch(indexes, ["prompt_ids", *RECORD_FIELDS])
    prompts = unpadded(data["prompt_ids"], data["prompt_ids_lengths"])
    episodes = [
        Episode(int(i), record, workers[int(i) % len(workers)], p.tolist())
        for i, record, p in zip(indexes, records_from_fields(data), prompts, strict=True)
    ]
    starts = [ep.worker.reset.remote(ep.index, ep.record) for ep in episodes]
    for episode, ref in zip(episodes, starts, strict=True):
        text = _get(ref)
        if text != episode.record.text:  # the environment made its own start of it
            episode.prompt, episode.prompt_replaced = codec.render(text), True
        if len(episode.prompt) > max_prompt:
            raise EnvironmentFailed(
                f"environment reset made a start of {len(episode.prompt)} tokens, more "
                f"than rollout.max_prompt_length={max_prompt} (episode prompt "
                f"{episode.record.text!r:.80}); raise rollout.max_prompt_length"
            )
    return episodes


def _model_turn(
    generate: Generate,
    ready: list[Episode],
    params: SamplingParams,
    settings: EnvSettings,
    turn: int,
    codec: TextCodec,
    stops: Sequence[str],
) -> None:
    """One engine call for every ready episode's next turn, each cut to its own room and
    after its first stop string."""
    rooms = [ep.room(settings) for ep in ready]
    seed = None if params.seed is None else params.seed + ready[0].index + turn * TURN_SEED_STRIDE
    call = dataclasses.replace(params, max_tokens=max(rooms), seed=seed)
    results = generate([ep.prompt + ep.tokens for ep in ready], call)
    for episode, result, room in zip(ready, results, rooms, strict=True):
        ids = list(result.token_ids[:room])
        ids = ids[: codec.stop_end(ids, stops)]
        episode.add(ids, result.logprobs[: len(ids)])
        episode.turns += 1
        episode.action = ids


def _after_step(
    episode: Episode,
    observation: str,
    reward: float,
    done: bool,
    settings: EnvSettings,
    codec: TextCodec,
) -> bool:
    """Book a step; True when the episode goes on (its observation appended)."""
    episode.reward += reward
    if done:
        episode.end = DONE
        return False
    if episode.turns >= settings.max_turns:
        episode.end = MAX_TURNS
        return False
    ids = codec.encode(observation)
    if len(episode.tokens) + len(ids) + 1 > settings.room:  # no room for it and one token
        episode.end = CONTEXT
        return False
    episode.add(ids, None)
    episode.observation_tokens += len(ids)
    return True


def _steps_back(pending: dict[Any, tuple[Episode, float]]) -> list[Any]:
    """The steps that came back: wait for the first, then the others at most
    ``WAIT_FACTOR`` times as long as the latest round's steps have taken so far."""
    if not pending:
        return []
    refs = list(pending)
    first, rest = ray.wait(refs, num_returns=1)
    latest = max(submitted for _, submitted in pending.values())
    if rest:
        window = max(WAIT_FACTOR * (time.perf_counter() - latest), MIN_WAIT_S)
        more, _ = ray.wait(rest, num_returns=len(rest), timeout=window)
        first += more
    return sorted(first, key=lambda ref: pending[ref][0].index)  # a fixed order per batch


def _get(ref: Any) -> Any:
    """An environment worker's result; its environment's failure as one line."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, EnvironmentFailed):
            raise EnvironmentFailed(str(cause)) from None
        raise


def _put(dock: DockClient, finished: list[Episode]) -> None:
    """The finished episodes' trajectories, one put (prompts only where reset replaced
    them: a put stores all its fields for all its samples)."""
    for replaced in (False, True):
        group = [ep for ep in finished if ep.prompt_replaced == replaced]
        if not group:
            continue
        data = {
            "response_ids": [torch.tensor(ep.tokens, dtype=torch.int64) for ep in group],
            "rollout_logprob": [torch.tensor(ep.logprobs, dtype=torch.float32) for ep in group],
            LOSS_MASK: [torch.tensor(ep.mask, dtype=torch.float32) for ep in group],
            ENV_REWARD: torch.tensor([ep.reward for ep in group], dtype=torch.float32),
        }
        if replaced:
            data["prompt_ids"] = [torch.tensor(ep.prompt, dtype=torch.int64) for ep in group]
        dock.put(np.asarray([ep.index for ep in group], dtype=np.int64), data)


def _close(finished: list[Episode]) -> None:
    """Free the finished episodes' instances on their workers (not waited for)."""
    by_worker: dict[ActorHandle, list[int]] = {}
    for episode in finished:
        by_worker.setdefault(episode.worker, []).append(episode.index)
    for worker, keys in by_worker.items():
        worker.close.remote(keys)
