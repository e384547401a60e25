"""Generation into the dock, the one loop the collocated actor (mindrl/workers/roles.py)
and the disaggregated rollout workers (mindrl/workers/rollout_worker.py) share.

A rank generates its indexes in chunks of about ``GENERATION_CHUNK`` samples
(``mindrl/workers/chunks.py``), so the dock (and the progress bar, and streaming stages)
see results early; each chunk is put as soon as it is sampled, ``response_ids`` with
``rollout_logprob`` (the raw log-prob of each token under the weights that sampled it).

Partial rollout (``rollout.partial_rollout_budget``): a response gets at most
``budget`` new tokens per call. One still unfinished is *paused*: its tokens so far and
their log-probs go into the dock as ``paused_ids`` / ``paused_logprob`` instead, so no
stage claims it; the next iteration's call continues it from exactly that prefix (prompt
+ prefix in, the rest out) with that iteration's weights, and once it finishes the whole
response is put as ``response_ids`` / ``rollout_logprob``. Each token's log-prob is the
one of the policy that sampled it, so ``rollout_logprob`` is the behaviour policy of
every token, and the loss corrects the older ones (trainers/core.py,
``behaviour_weights``).

Versions: where a trained token may come from older weights than the trained ones
(``RunPlan.tokens_may_lag``) each token also records the weights version that sampled it
(``rollout_version``, a paused one's ``paused_version``), and the put tells the stages'
TD controllers the oldest of them (``DockClient.versions``: the staleness bound reads
it). Continuous generation on the rollout workers (mindrl/workers/continuous.py) puts the
same fields: a sequence a checkpoint interrupts is a paused response, continued from its
prefix as partial rollout continues one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from backends.generation import GenerationResult, SamplingParams
from mindrl.dock import DockClient
from mindrl.workers.chunks import chunk_samples
from mindrl.workers.sequences import unpadded

Generate = Callable[[list[list[int]], SamplingParams], list[GenerationResult]]

#: The fields one put stores of a finished response and of a paused one (tokens, log-probs
#: and, where tokens may lag, each token's weights version).
RESPONSE_FIELDS = ("response_ids", "rollout_logprob", "rollout_version")
PAUSED_FIELDS = ("paused_ids", "paused_logprob", "paused_version")


@dataclass(frozen=True)
class PartialRollout:
    """What one call of a partial rollout may do.

    Attributes:
        budget: most new tokens a response gets in this call.
        max_tokens: most tokens of a whole response (``rollout.max_response_length``).
        resumed: indexes whose paused prefix is in the dock (the others start afresh).
        weights_loaded: the engine holds this iteration's weights already (a round after
            the first: no update ran since), so the actor does not reshard them again.
        version: the weights version (updates included) sampling this round, recorded
            per token; None: none recorded.
    """

    budget: int
    max_tokens: int
    resumed: np.ndarray
    weights_loaded: bool = False
    version: int | None = None


@dataclass
class Response:
    """A response so far: its tokens, the behaviour log-prob of each and, where recorded,
    the weights version that sampled each."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int] | None = None

    def extend(self, token_ids: list[int], logprobs: list[float], version: int | None) -> None:
        """Append tokens sampled by weights ``version``."""
        self.token_ids += token_ids
        self.logprobs += logprobs
        if self.versions is not None:
            self.versions += [-1 if version is None else version] * len(token_ids)

    @property
    def oldest_version(self) -> int | None:
        """The oldest weights version among its tokens (None: none recorded)."""
        return min(self.versions, default=None) if self.versions else None


def generate_into_dock(
    dock: DockClient,
    generate: Generate,
    indexes: np.ndarray,
    params: SamplingParams,
    group_size: int,
    put: bool = True,
    version: int | None = None,
    partial: PartialRollout | None = None,
    token_versions: bool = False,
) -> dict:
    """Sample one response per index in chunks and put each chunk into the dock.

    Args:
        dock: this process's dock client.
        generate: the generation engine's ``generate``.
        indexes: the samples to generate (their ``prompt_ids`` are in the dock).
        params: sampling settings; each chunk's seed is ``params.seed + its first index``.
        group_size: responses per prompt (chunks hold whole groups).
        put: False on a TP peer that sampled the same responses as its leader.
        version: the weights version to stamp on every put (disaggregated rollout).
        partial: partial rollout's budget and the resumed indexes; None: to the end. Its
            ``version``, when set, is recorded per token (and stamped on the puts).
        token_versions: record ``version`` on every token too (``rollout_version``).

    Returns:
        ``response_tokens`` (tokens generated in this call) and, with ``partial``,
        ``paused``: the indexes left unfinished.
    """
    chunk_size = chunk_samples(group_size)
    if partial is not None and len(partial.resumed):
        # One engine call for the round: paused responses continue in the same batch as
        # the fresh prompts (chunks serve the stream pipeline, which partial rollout does
        # not use; two calls of B steps cost twice one on the CPU engine). A round with
        # nothing resumed is chunked as a whole rollout, so a budget no response reaches
        # samples exactly today's responses.
        chunk_size = max(chunk_size, len(indexes))
    tokens, paused = 0, []
    if partial is not None and partial.version is not None:
        version = partial.version
    for first in range(0, len(indexes), chunk_size):
        chunk = indexes[first : first + chunk_size]
        seed = None if params.seed is None else params.seed + int(chunk[0])
        chunk_params = dataclasses.replace(params, seed=seed)
        if partial is None:
            responses = _sample(generate, _prompts(dock, chunk), chunk_params)
            if token_versions:
                for response in responses:
                    response.versions = [-1 if version is None else version] * len(
                        response.token_ids
                    )
            tokens += sum(len(r.token_ids) for r in responses)
            finished = np.ones(len(chunk), dtype=bool)
        else:
            responses, finished, new = _continue(dock, generate, chunk, chunk_params, partial)
            tokens += new
            paused.append(chunk[~finished])
        if put:
            put_responses(dock, chunk, responses, finished, version)
    report = {"response_tokens": tokens}
    if partial is not None:
        report["paused"] = np.concatenate(paused) if paused else np.zeros(0, dtype=np.int64)
    return report


def prompts_of(dock: DockClient, indexes: np.ndarray) -> list[list[int]]:
    """The prompt tokens of ``indexes`` from the dock, unpadded."""
    return _prompts(dock, indexes)


def _prompts(dock: DockClient, indexes: np.ndarray) -> list[list[int]]:
    batch = dock.fetch(indexes, ["prompt_ids"])
    return [row.tolist() for row in unpadded(batch["prompt_ids"], batch["prompt_ids_lengths"])]


def _sample(generate: Generate, prompts: list[list[int]], params: SamplingParams) -> list[Response]:
    return [Response(list(r.token_ids), list(r.logprobs)) for r in generate(prompts, params)]


def _continue(
    dock: DockClient,
    generate: Generate,
    chunk: np.ndarray,
    params: SamplingParams,
    partial: PartialRollout,
) -> tuple[list[Response], np.ndarray, int]:
    """Up to ``partial.budget`` more tokens for every response of ``chunk``, each from its
    prefix; returns the responses, which finished, and how many tokens were new."""
    prefixes = paused_prefixes(dock, chunk, partial.resumed, partial.version is not None)
    room = [partial.max_tokens - len(p.token_ids) for p in prefixes]
    # One engine call: as many steps as the roomiest response may take, each cut to its room.
    step = dataclasses.replace(params, max_tokens=min(partial.budget, max(room)))
    contexts = [
        prompt + prefix.token_ids
        for prompt, prefix in zip(_prompts(dock, chunk), prefixes, strict=True)
    ]
    results = generate(contexts, step)
    responses, finished, new = [], np.zeros(len(chunk), dtype=bool), 0
    for k, (prefix, result, left) in enumerate(zip(prefixes, results, room, strict=True)):
        ids, logprobs = result.token_ids[:left], result.logprobs[:left]
        prefix.extend(ids, logprobs, partial.version)
        responses.append(prefix)
        # Ended by a stop token or the context window, or out of room: nothing follows.
        finished[k] = len(ids) == left or result.finish_reason != "length"
        new += len(ids)
    return responses, finished, new


def paused_prefixes(
    dock: DockClient, chunk: np.ndarray, resumed: np.ndarray, versions: bool = False
) -> list[Response]:
    """Each index's paused response from the dock (empty for an index not resumed), with
    its tokens' versions when ``versions`` (they were recorded)."""
    prefixes = [Response([], [], [] if versions else None) for _ in chunk]
    rows = np.flatnonzero(np.isin(chunk, resumed))
    if len(rows) == 0:
        return prefixes
    fields = list(PAUSED_FIELDS if versions else PAUSED_FIELDS[:2])
    data = dock.fetch(chunk[rows], fields)
    lengths = data["paused_ids_lengths"].tolist()
    for k, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        prefixes[row] = Response(
            data["paused_ids"][k, :n].tolist(),
            data["paused_logprob"][k, :n].tolist(),
            data["paused_version"][k, :n].tolist() if versions else None,
        )
    return prefixes


def put_responses(
    dock: DockClient,
    indexes: np.ndarray,
    responses: list[Response],
    finished: np.ndarray,
    version: int | None = None,
) -> None:
    """Finished responses as what the stages read; paused ones where no stage looks. Each
    put names the oldest version among its tokens where they recorded theirs (else
    ``version``)."""
    for mask, fields in ((finished, RESPONSE_FIELDS), (~finished, PAUSED_FIELDS)):
        rows = np.flatnonzero(mask)
        if len(rows) == 0:
            continue
        ids, logprobs, versions = fields
        chosen = [responses[r] for r in rows]
        data = {
            ids: [torch.tensor(r.token_ids, dtype=torch.int64) for r in chosen],
            logprobs: [torch.tensor(r.logprobs, dtype=torch.float32) for r in chosen],
        }
        stamp = version
        if all(r.versions is not None for r in chosen):
            data[versions] = [torch.tensor(r.versions, dtype=torch.int64) for r in chosen]
            stamp = min((v for r in chosen if (v := r.oldest_version) is not None), default=version)
        dock.put(indexes[rows], data, version=stamp)
