"""The generation-engine interface every rollout engine implements.

Rollout workers hand token ids in and get token ids, log-probs and finish reasons out;
they never see a tokenizer or a model class. Weights arrive from the resharder as
HF-named full tensors through :meth:`GenerationEngine.load_weights` (a LoRA policy: its
base once, then its adapters each time through :meth:`GenerationEngine.apply_adapters`),
and the engine gives its device memory back around the update stage with :meth:`sleep` /
:meth:`wake_up`.

Conventions shared by every engine:

* Results are flat and prompt-major: ``len(prompts) * params.n`` results, the ``n``
  samples of prompt 0 first. Each carries its ``prompt_index`` and ``sample_index``.
* ``logprobs[t]`` is the log-probability of ``token_ids[t]`` under the RAW model
  (temperature-1 logits, before top-k / top-p), because RL compares it with the
  training engine's recomputed log-probs, which never see sampling settings.
* A stop token that ends a response is part of ``token_ids`` (and has a log-prob):
  the policy produced it and the loss must see it. Engines stop only on
  ``params.stop_token_ids`` (pass the tokenizer's EOS there) and on
  ``params.stop_sequences`` (a response that ends with one of these id sequences, which
  it keeps: a tool call's closing tag as the tokenizer spells it).
* Prompts that are empty, longer than the engine's ``max_model_len - 1`` or hold ids
  outside the vocabulary are refused with :class:`InvalidPromptError`; they are never
  truncated. A response cut by the context window says so: finish reason
  ``"context_limit"``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from transformers import PretrainedConfig

FinishReason = Literal["stop", "length", "context_limit"]


class InvalidPromptError(ValueError):
    """A prompt the engine cannot generate from (empty, too long, unknown token id)."""


class EngineStateError(RuntimeError):
    """The engine was asked to generate while asleep or before its weights were loaded."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample the responses of one :meth:`GenerationEngine.generate` call.

    Attributes:
        n: responses per prompt (GRPO's group size).
        temperature: softmax temperature; ``0`` means greedy (argmax) decoding.
        top_p: nucleus sampling mass in ``(0, 1]``; ``1`` disables it.
        top_k: keep only the ``top_k`` most likely tokens; ``0`` disables it.
        max_tokens: most tokens generated per response.
        stop_token_ids: generation of a response ends after any of these ids.
        stop_sequences: generation of a response ends once it ends with any of these id
            sequences (kept in the response, like a stop token).
        seed: fixes the sampling RNG for this call; ``None`` draws fresh randomness.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    stop_sequences: tuple[tuple[int, ...], ...] = field(default_factory=tuple)
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        sequences = tuple(tuple(int(t) for t in seq) for seq in self.stop_sequences)
        object.__setattr__(self, "stop_sequences", sequences)
        if any(not seq for seq in sequences):
            raise ValueError("SamplingParams.stop_sequences must not hold an empty sequence")
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        """True when decoding is argmax (``temperature == 0``)."""
        return self.temperature == 0


def ends_with_stop(token_ids: Sequence[int], params: SamplingParams) -> bool:
    """True when ``token_ids`` ends with a stop token or a stop sequence of ``params``."""
    if not token_ids:
        return False
    if token_ids[-1] in params.stop_token_ids:
        return True
    return any(
        len(token_ids) >= len(seq) and tuple(token_ids[-len(seq) :]) == seq
        for seq in params.stop_sequences
    )


def stop_end(token_ids: Sequence[int], params: SamplingParams) -> int | None:
    """How many of ``token_ids`` a response keeps when it ends at its first stop (the stop
    token or the last id of the stop sequence included); None when it holds no stop."""
    return next(
        (end for end in range(1, len(token_ids) + 1) if ends_with_stop(token_ids[:end], params)),
        None,
    )


@dataclass
class GenerationResult:
    """One sampled response.

    Attributes:
        prompt_index: index of its prompt in the ``prompts`` argument.
        sample_index: which of the ``n`` samples of that prompt (0-based).
        token_ids: response token ids (stop token included when one ended it).
        logprobs: raw-model log-prob of each token in ``token_ids``.
        finish_reason: ``"stop"`` (a stop token), ``"length"`` (``max_tokens``) or
            ``"context_limit"`` (prompt + response reached ``max_model_len``).
    """

    prompt_index: int
    sample_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


@dataclass
class EngineConfig:
    """What every engine is built from.

    Attributes:
        model: an HF model directory (``config.json`` + weights) or a
            ``PretrainedConfig``; with a config the weights start random (vLLM:
            ``load_format="dummy"``) and come from :meth:`GenerationEngine.load_weights`.
        max_model_len: longest prompt + response the engine accepts.
        dtype: parameter / activation dtype.
        memory_fraction: share of one device's memory the engine may use for weights
            and KV cache (vLLM's ``gpu_memory_utilization``).
        tensor_parallel_size: generation TP (vLLM only; the HF engine needs 1).
        expert_parallel: shard MoE experts over the TP x DP ranks (vLLM only).
        expert_parallel_size: ranks of one expert-parallel group (vLLM, with
            ``expert_parallel``). Beyond ``tensor_parallel_size`` the group spans
            ``expert_parallel_size / tensor_parallel_size`` data-parallel replicas (the
            paper's TP2 EP64); see :func:`expert_group_launch`.
        kv_cache_bytes: explicit KV cache size, overriding ``memory_fraction`` for the
            cache (useful on a shared CPU host).
        enforce_eager: run without graph capture / torch.compile (vLLM only).
        seed: engine-level seed for calls whose params carry none.
        device: device name for the HF engine (``None``: the device layer's choice).
        share_prompt_prefill: HF engine: run the prompt of identical rows (GRPO's N
            copies, ``SamplingParams.n``) through the model once and copy its KV cache;
            off only to measure what it saves. vLLM shares through its prefix cache.
        takes_adapters: the policy arrives as a base (:meth:`GenerationEngine.load_weights`)
            and LoRA adapters (:meth:`GenerationEngine.apply_adapters`); an engine that
            cannot read its weights back (vLLM) then keeps a host copy of the base as loaded.
    """

    model: str | PretrainedConfig
    max_model_len: int = 2048
    dtype: torch.dtype = torch.float32
    memory_fraction: float = 0.5
    tensor_parallel_size: int = 1
    expert_parallel: bool = False
    expert_parallel_size: int = 1
    kv_cache_bytes: int | None = None
    enforce_eager: bool = False
    seed: int = 0
    device: str | None = None
    share_prompt_prefill: bool = True
    takes_adapters: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(
                f"EngineConfig.memory_fraction must be in (0, 1], got {self.memory_fraction}"
            )
        if self.max_model_len < 2:
            raise ValueError(f"EngineConfig.max_model_len must be >= 2, got {self.max_model_len}")
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"EngineConfig.tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}"
            )


@dataclass(frozen=True)
class SequenceRequest:
    """One sequence for a :class:`ContinuousBatch` to decode.

    Attributes:
        key: the caller's name for it (a dock index), echoed in its output.
        context: the prompt, followed by the response so far when it continues one (an
            interrupted sequence: partial rollout's paused response, or one a checkpoint
            stopped); the engine never rewrites it.
        max_tokens: most new tokens; reaching it ends the sequence with ``"length"``.
        room_limited: ``max_tokens`` is the context window's room, not the response cap,
            so reaching it ends the sequence with ``"context_limit"``.
    """

    key: int
    context: list[int]
    max_tokens: int
    room_limited: bool = False


@dataclass
class SequenceOutput:
    """The new tokens of one sequence of a :class:`ContinuousBatch`: its raw log-probs
    (the :class:`GenerationEngine` convention) and why it stopped (``"interrupted"``: the
    caller stopped the batch while it was live)."""

    key: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | Literal["interrupted"]


class ContinuousBatch(ABC):
    """Sequences decoding together, joined and left one at a time (continuous batching).

    Every :meth:`step` gives each live sequence its next token (a newly added one its
    first, from its context's prefill) and returns the sequences that ended; a caller
    refills their slots with :meth:`add` at once, without waiting for the others. The
    engine's :meth:`GenerationEngine.load_weights` may run between two steps: the live
    sequences carry on under the new weights (their KV cache, computed by the old ones,
    is kept; each token's log-prob is the one of the weights that sampled it, so the
    behaviour policy of every token is exact). Sampling follows the batch's
    ``SamplingParams`` (``max_tokens`` and ``n`` are per request here: one sequence each),
    seeded once per batch.
    """

    @abstractmethod
    def add(self, requests: list[SequenceRequest]) -> None:
        """Queue sequences; the next :meth:`step` prefills them and samples their first
        token.

        Raises:
            InvalidPromptError: a context the engine cannot serve (empty, too long,
                unknown ids), as :meth:`GenerationEngine.validate_prompts` words it.
        """

    @abstractmethod
    def step(self) -> list[SequenceOutput]:
        """One token for every live sequence; the ones that ended (stop token, their
        ``max_tokens``), with every token they produced in this batch."""

    @abstractmethod
    def progress(self) -> dict[int, int]:
        """Key -> tokens produced so far, for every sequence added and not ended."""

    @abstractmethod
    def interrupt(self) -> list[SequenceOutput]:
        """Stop every sequence added and not ended, returning what each produced so far
        (``"interrupted"``); the batch is empty afterwards."""

    @property
    def live(self) -> int:
        """Sequences added and not ended."""
        return len(self.progress())


class GenerationEngine(ABC):
    """A rollout engine: sampling with log-probs, weight refresh, sleep / wake.

    An engine declares what it supports in the class attributes below; the config check,
    the planner and ``rollout.engine: auto`` read them (never an engine's name), and they
    read without the engine's library: an engine module imports it when an engine starts.
    """

    #: Registry name (``"hf"``, ``"vllm"``).
    name: ClassVar[str]
    #: The distribution that must be installed for it (None: the base install's).
    library: ClassVar[str | None] = None
    #: How to install :attr:`library`, for the error when it is missing.
    install_hint: ClassVar[str] = ""
    #: ``rollout.engine: auto`` picks the installed engine ranked highest.
    auto_rank: ClassVar[int] = 0
    #: Splits one model over ``tensor_parallel_size`` ranks (generation TP).
    tensor_parallel: ClassVar[bool] = False
    #: Spreads the experts over ``expert_parallel_size`` ranks (generation EP).
    expert_parallel: ClassVar[bool] = False
    #: Continues a response from its prefix: given prompt + prefix as the prompt, samples
    #: the rest and reports the raw log-probs of the new tokens only, which is how partial
    #: rollout resumes a paused response. An engine that rewrites or truncates its prompt
    #: (a text-in server with a chat template, a prompt cap below max_model_len) must not.
    continues_prefix: ClassVar[bool] = False
    #: Allocates its whole KV-cache budget when it starts and holds it while awake (the
    #: planner counts it through the update); False: a KV cache per call, sized by the
    #: rows it batches.
    preallocates_kv_cache: ClassVar[bool] = False

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids the model accepts."""

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        """Sample ``params.n`` responses per prompt.

        Args:
            prompts: token ids of each prompt (no padding).
            params: sampling settings.

        Returns:
            ``len(prompts) * params.n`` results, prompt-major.

        Raises:
            InvalidPromptError: a prompt is empty, too long or holds unknown ids.
            EngineStateError: the engine is asleep or its weights were discarded.
        """

    @abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named full tensors into the model (any subset of its parameters).

        An engine that runs tensor-parallel inside the caller's process group (vLLM with
        TP > 1 there) takes this rank's contiguous 1/tp shard of every TP-split tensor
        instead, with the vocabulary tensors and norms whole.

        Raises:
            KeyError: a name the model does not have.
            ValueError: a tensor whose shape does not match the parameter.
        """

    @abstractmethod
    def apply_adapters(
        self, adapters: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scale: float
    ) -> None:
        """Make each named linear's weight its base plus a LoRA adapter.

        ``adapters`` maps HF linear module names (``model.layers.0.self_attn.q_proj``) to
        full ``(A [rank, in], B [out, rank])``; each weight becomes
        ``backends.lora_merge.merged_weight(base, A, B, scale)``, where ``base`` is a
        pristine copy of the weight as :meth:`load_weights` last loaded it, kept by the
        engine in its own dtype on the host (it holds exactly what was loaded; promoted
        to float32 for each merge). Never merged into the live weight and taken out
        again: in 16 bits each round trip rounds and the weights drift from the base.
        A later :meth:`load_weights` of a name replaces its pristine copy. An engine
        holding a TP shard of a weight merges its own part of the adapter.

        Raises:
            KeyError: a module the model does not have.
            EngineStateError: a base to merge into is missing (never loaded, or
                discarded by ``sleep(level=2)`` and not loaded again).
        """

    @abstractmethod
    def sleep(self, level: int = 1) -> None:
        """Release device memory before the update stage.

        Level 1 keeps the weights (offloaded to host where the platform can) and drops
        the KV cache; level 2 drops the weights too, so :meth:`load_weights` must run
        after :meth:`wake_up` and before the next :meth:`generate`.
        """

    @abstractmethod
    def wake_up(self) -> None:
        """Take the device memory back after :meth:`sleep`."""

    def continuous(self, params: SamplingParams) -> ContinuousBatch:
        """An empty :class:`ContinuousBatch` sampling with ``params`` (its ``seed`` seeds
        the batch once; its ``max_tokens`` and ``n`` are ignored: each request has its
        own).

        Raises:
            NotImplementedError: an engine without continuous batching.
        """
        raise NotImplementedError(f"the '{self.name}' engine has no continuous batching")

    def wake_weights(self) -> None:
        """Take back the weights' memory only, so :meth:`load_weights` can fill them while
        the KV cache still waits; :meth:`wake_up` then takes the rest. An engine whose KV
        cache is allocated per call (transformers) wakes whole."""
        self.wake_up()

    def validate_prompts(self, prompts: list[list[int]]) -> None:
        """Refuse prompts this engine cannot serve; never truncate them silently.

        Raises:
            InvalidPromptError: naming the first offending prompt and the fix.
        """
        if not prompts:
            raise InvalidPromptError("no prompts given: pass at least one list of token ids")
        limit = self.config.max_model_len - 1  # room for at least one response token
        vocab = self.vocab_size  # once: an engine may look it up in the model each time
        for i, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise InvalidPromptError(f"prompt {i} is empty: every prompt needs >= 1 token")
            if len(prompt) > limit:
                raise InvalidPromptError(
                    f"prompt {i} has {len(prompt)} tokens but max_model_len="
                    f"{self.config.max_model_len} leaves room for {limit}: shorten it "
                    "or raise EngineConfig.max_model_len"
                )
            if min(prompt) < 0 or max(prompt) >= vocab:
                bad = next(t for t in prompt if not 0 <= t < vocab)
                raise InvalidPromptError(
                    f"prompt {i} holds token id {bad} outside the vocabulary "
                    f"[0, {vocab}): check the tokenizer matches the model"
                )


@dataclass(frozen=True)
class ExpertGroupLaunch:
    """How one rank joins a vLLM engine whose expert group spans data-parallel replicas.

    Attributes:
        data_parallel_size: vLLM's ``data_parallel_size`` (replicas inside one group).
        env_rank: the ``RANK`` vLLM's external launcher reads. With data parallelism
            the rank inside the group: vLLM derives its data-parallel rank as
            ``RANK // tp`` and checks it against ``data_parallel_size``; the process
            group's other groups are vLLM's "external" replicas, consecutive ranks, as
            the resharder's ``GenLayout`` places experts (expert rank = rank % ep).
            Without it the global rank, as a TP-only launch always had.
        data_parallel_rank: the replica this rank serves inside its group.
    """

    data_parallel_size: int
    env_rank: int
    data_parallel_rank: int


def expert_group_launch(rank: int, world: int, tp: int, ep: int) -> ExpertGroupLaunch:
    """vLLM data-parallel + expert-parallel launch facts of ``rank`` (TP x DP = EP).

    Raises:
        ValueError: ``ep`` is not a multiple of ``tp`` or does not divide ``world``.
    """
    group = max(ep, tp)
    if group % tp or world % group:
        raise ValueError(
            f"expert_parallel_size={ep} must be a multiple of tensor_parallel_size={tp} "
            f"and divide the {world} generation ranks"
        )
    local, data_parallel = rank % group, group // tp
    return ExpertGroupLaunch(data_parallel, local if data_parallel > 1 else rank, local // tp)
