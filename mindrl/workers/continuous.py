"""Continuous generation on a rollout worker (docs/architecture.md §8, "Continuous").

A decode loop in a thread of the rollout worker keeps up to ``slots`` sequences decoding
in one :class:`~backends.generation.base.ContinuousBatch`: a sequence that ends leaves at
once and the next fed group takes its slots, without waiting for the others. The driver
feeds groups of dock indexes whose prompts are in the dock (:meth:`feed`); a group goes
back to the dock as soon as all its responses ended, so the reward and reference stages
score it while the loop decodes the next.

Weights arrive while the loop runs (:meth:`offer_weights`, the rollout worker's
``receive_weights`` after its broadcast): the loop loads them between two decode steps
and the live sequences carry on under them. Every token records the weights version that
sampled it (``rollout_version``, mindrl/workers/generation.py), and each put tells the
stages' controllers the oldest version among its tokens, which the driver's staleness
bound reads.

A stop (:meth:`stop`: a checkpoint, the end of the run) interrupts the live sequences:
each is put as a paused response (``paused_ids`` / ``paused_logprob`` /
``paused_version``), exactly as partial rollout pauses one at its budget, and is
continued from that prefix when fed again (``resumed``) -- one mechanism for both.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from backends.generation import GenerationEngine, SamplingParams
from backends.generation.base import ContinuousBatch, SequenceOutput, SequenceRequest
from mindrl.dock import DockClient, group_slots
from mindrl.workers.generation import Response, paused_prefixes, prompts_of, put_responses

#: How long the idle loop waits for work before looking again (seconds).
IDLE_WAIT_S = 0.02


@dataclass
class _Sequence:
    """A live sequence: the response it continues and the version runs of its new tokens
    (``(first new token, version)``: from that token on, that version sampled)."""

    prefix: Response
    runs: list[tuple[int, int]]

    def extended(self, output: SequenceOutput) -> Response:
        """The response with ``output``'s new tokens, each with the version that sampled
        it."""
        versions = [
            next(v for start, v in reversed(self.runs) if start <= j)
            for j in range(len(output.token_ids))
        ]
        prefix = self.prefix
        return Response(
            prefix.token_ids + output.token_ids,
            prefix.logprobs + output.logprobs,
            (prefix.versions or []) + versions,
        )


@dataclass
class _Group:
    """A fed group's indexes and its members' finished responses so far."""

    indexes: list[int]
    done: dict[int, Response] = field(default_factory=dict)


@dataclass
class Feed:
    """Indexes of whole groups to generate; ``resumed`` of them continue the paused
    response the dock holds for them."""

    indexes: np.ndarray
    resumed: np.ndarray


class ContinuousGenerator:
    """The decode loop of one rollout worker (module docstring).

    Args:
        dock: the worker's dock client.
        engine: its generation engine (weights loaded).
        params: sampling settings (its ``max_tokens``: a whole response's cap; its seed
            seeds the batch).
        group_size: responses per prompt (a group goes to the dock whole).
        slots: sequences decoding at once at most (a group is admitted whole, when its
            members fit).
        max_model_len: the engine's context window.
        version: the weights version the engine holds.
    """

    def __init__(
        self,
        dock: DockClient,
        engine: GenerationEngine,
        params: SamplingParams,
        group_size: int,
        slots: int,
        max_model_len: int,
        version: int,
    ) -> None:
        self.dock, self.engine, self.params = dock, engine, params
        self.group_size, self.slots, self.max_model_len = group_size, slots, max_model_len
        self.version = version
        self._lock = threading.Condition()
        self._inbox: deque[tuple[np.ndarray, set[int]]] = deque()
        self._weights: tuple[int, list[tuple[str, torch.Tensor]]] | None = None
        self._stopping = False
        self._error: str | None = None
        self._groups: dict[int, _Group] = {}
        self._live: dict[int, _Sequence] = {}
        self.counts = {"steps": 0, "tokens": 0, "groups_put": 0, "weight_loads": 0}
        self.seconds = {"decode": 0.0, "load": 0.0, "dock": 0.0, "idle": 0.0}
        self._thread = threading.Thread(target=self._run, name="continuous", daemon=True)
        self._thread.start()

    # ---- called from the worker's actor thread -------------------------------------------
    def feed(self, feed: Feed) -> None:
        """Queue whole groups (their prompts, and the prefixes of ``resumed``, are in the
        dock)."""
        resumed = set(feed.resumed.tolist())
        groups = np.unique(group_slots(feed.indexes, self.group_size))
        with self._lock:
            for group in groups.tolist():
                members = feed.indexes[group_slots(feed.indexes, self.group_size) == group]
                self._inbox.append((members, resumed & set(members.tolist())))
            self._lock.notify_all()

    def offer_weights(self, version: int, named: list[tuple[str, torch.Tensor]]) -> None:
        """New weights for the loop to load between two decode steps (a later offer
        replaces one not loaded yet)."""
        with self._lock:
            self._weights = (version, named)
            self._lock.notify_all()

    def status(self) -> dict:
        """Counters and seconds so far; raises the loop's error if it failed."""
        self.raise_if_failed()
        with self._lock:
            queued = sum(len(members) for members, _ in self._inbox)
        return {
            **self.counts,
            **{f"{k}_s": v for k, v in self.seconds.items()},
            "live": len(self._live),
            "queued": queued,
            "version": self.version,
        }

    def stop(self) -> dict[str, np.ndarray]:
        """Interrupt the loop: live sequences go to the dock as paused responses, finished
        members of unfinished groups as finished ones. Returns the ``paused`` indexes and
        the ``unstarted`` ones (fed, no token yet: their prompts wait in the dock)."""
        self.request_stop()
        self._thread.join()
        self.raise_if_failed()
        return self._interrupted

    def request_stop(self) -> None:
        """Ask the loop to stop before its next decode step (:meth:`stop` waits for it)."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the continuous decode loop failed:\n{self._error}")

    # ---- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        batch = self.engine.continuous(self.params)
        try:
            while self._turn(batch):
                pass
            self._interrupted = self._interrupt(batch)
        except BaseException:  # reported by status() / stop(): the thread has no caller
            self._error = traceback.format_exc()
            self._interrupted = {}

    def _turn(self, batch: ContinuousBatch) -> bool:
        """One pass: load offered weights, admit fed groups into free slots, one decode
        step. False once stopping."""
        with self._lock:
            if self._stopping:
                return False
            weights, self._weights = self._weights, None
            admitted = self._admissible(batch.live)
            if weights is None and not admitted and not batch.live:
                idle = time.perf_counter()
                self._lock.wait(IDLE_WAIT_S)
                self.seconds["idle"] += time.perf_counter() - idle
                return True
        if weights is not None:
            self._load(batch, *weights)
        if admitted:
            self._admit(batch, admitted)
        if batch.live:
            started = time.perf_counter()
            ended = batch.step()
            self.seconds["decode"] += time.perf_counter() - started
            self.counts["steps"] += 1
            self._finish(ended)
        return True

    def _admissible(self, live: int) -> list[tuple[np.ndarray, set[int]]]:
        """Fed groups whose members fit the free slots (one group always, into an empty
        batch); called under the lock."""
        taken: list[tuple[np.ndarray, set[int]]] = []
        free = self.slots - live
        while self._inbox and (len(self._inbox[0][0]) <= free or (not live and not taken)):
            members, resumed = self._inbox.popleft()
            taken.append((members, resumed))
            free -= len(members)
        return taken

    def _load(self, batch: ContinuousBatch, version: int, named: list) -> None:
        """New weights between two steps: every live sequence's next token is theirs."""
        started = time.perf_counter()
        self.engine.load_weights(iter(named))
        for key, produced in batch.progress().items():
            self._live[key].runs.append((produced, version))
        self.version = version
        self.counts["weight_loads"] += 1
        self.seconds["load"] += time.perf_counter() - started

    def _admit(self, batch: ContinuousBatch, fed: list[tuple[np.ndarray, set[int]]]) -> None:
        started = time.perf_counter()
        indexes = np.concatenate([members for members, _ in fed])
        resumed = np.array(sorted(set().union(*(r for _, r in fed))), dtype=np.int64)
        prompts = prompts_of(self.dock, indexes)
        prefixes = paused_prefixes(self.dock, indexes, resumed, versions=True)
        self.seconds["dock"] += time.perf_counter() - started
        requests = []
        for index, prompt, prefix in zip(indexes.tolist(), prompts, prefixes, strict=True):
            context = prompt + prefix.token_ids
            room = self.max_model_len - len(context)
            left = self.params.max_tokens - len(prefix.token_ids)
            requests.append(SequenceRequest(index, context, min(left, room), room < left))
            self._live[index] = _Sequence(prefix, [(0, self.version)])
        for members, _ in fed:
            first = int(members[0])
            group = self._groups.setdefault(int(group_slots(first, self.group_size)), _Group([]))
            group.indexes += members.tolist()
        batch.add(requests)

    def _finish(self, ended: Iterable[SequenceOutput]) -> None:
        """Ended sequences join their group; a group whose members all ended goes to the
        dock."""
        complete = []
        for output in ended:
            response = self._live.pop(output.key).extended(output)
            self.counts["tokens"] += len(output.token_ids)
            group = self._groups[int(group_slots(output.key, self.group_size))]
            group.done[output.key] = response
            if len(group.done) == len(group.indexes):
                complete.append(self._groups.pop(int(group_slots(output.key, self.group_size))))
        for group in complete:
            started = time.perf_counter()
            indexes = np.array(group.indexes, dtype=np.int64)
            responses = [group.done[i] for i in group.indexes]
            put_responses(self.dock, indexes, responses, np.ones(len(indexes), dtype=bool))
            self.seconds["dock"] += time.perf_counter() - started
            self.counts["groups_put"] += 1

    def _interrupt(self, batch: ContinuousBatch) -> dict[str, np.ndarray]:
        """Every unfinished group into the dock as it stands; the fed, unstarted rest
        named for the driver."""
        unstarted = [members for members, _ in self._inbox]
        self._inbox.clear()
        paused_keys, responses, finished, indexes = [], [], [], []
        for output in batch.interrupt():
            sequence = self._live.pop(output.key)
            if not output.token_ids and not sequence.prefix.token_ids:
                unstarted.append(np.array([output.key]))
                continue
            response = sequence.extended(output)
            indexes.append(output.key)
            responses.append(response)
            finished.append(False)
            paused_keys.append(output.key)
        for group in self._groups.values():
            for index, response in group.done.items():
                indexes.append(index)
                responses.append(response)
                finished.append(True)
        self._groups.clear()
        if indexes:
            put_responses(self.dock, np.array(indexes), responses, np.array(finished))
        empty = np.zeros(0, dtype=np.int64)
        return {
            "paused": np.array(sorted(paused_keys), dtype=np.int64),
            "unstarted": np.sort(np.concatenate(unstarted)) if unstarted else empty,
        }


__all__ = ["ContinuousGenerator", "Feed", "SamplingParams"]
