"""The transformers engine: the CPU fallback when vLLM is absent.

Sampling is KV-cached ``model.generate``; the raw (unprocessed) logits of every step
come back with ``output_logits=True`` and give the log-probs. Prompts are batched
shortest-first with left padding; the batch size follows the memory budget.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import torch

from backends.device import get_device
from backends.generation.base import (
    ContinuousBatch,
    EngineConfig,
    EngineStateError,
    FinishReason,
    GenerationEngine,
    GenerationResult,
    SamplingParams,
    stop_end,
)
from backends.generation.hf_experts import fused_expert_view
from backends.generation.padding import PAD_ID, left_padded
from backends.generation_memory import kv_bytes_per_token, prompts_per_call, sequence_bytes
from backends.lora_merge import merged_weight

if TYPE_CHECKING:  # transformers' model classes load when an engine starts, not with its
    # capabilities (the config check and the planner read them)
    from transformers import DynamicCache, GenerationConfig, PreTrainedModel


def build_hf_model(config: EngineConfig) -> PreTrainedModel:
    """The causal LM named by ``config.model`` (a directory or a ``PretrainedConfig``)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    if isinstance(config.model, str):
        model = AutoModelForCausalLM.from_pretrained(config.model, dtype=config.dtype)
    else:
        model = AutoModelForCausalLM.from_config(config.model, dtype=config.dtype)
    # The engine stops only on SamplingParams.stop_token_ids, never on a config's EOS.
    model.generation_config = GenerationConfig()
    return model.eval()


class HFGenerationEngine(GenerationEngine):
    """Generation with transformers' ``generate`` on the device layer's device."""

    name = "hf"
    continues_prefix = True

    def __init__(self, config: EngineConfig, model: PreTrainedModel | None = None) -> None:
        """Build the engine.

        Args:
            config: engine settings; ``tensor_parallel_size`` must be 1.
            model: an already-built model to serve (e.g. loaded from GGUF); by default
                it is built from ``config.model``.
        """
        super().__init__(config)
        if config.tensor_parallel_size != 1 or config.expert_parallel:
            raise ValueError(
                "the 'hf' engine runs one unsharded replica: set tensor_parallel_size=1 "
                "and expert_parallel=False, or use the 'vllm' engine"
            )
        self.device = get_device(config.device)
        self.model = (model or build_hf_model(config)).to(self.device.device())
        from transformers import GenerationConfig

        self.model.generation_config = GenerationConfig()
        self._params = dict(self.model.named_parameters(remove_duplicate=False))
        # Persistent buffers are weights too (DeepSeek's router expert bias): they load
        # like parameters.
        self._params |= {
            name: buffer
            for name, buffer in self.model.state_dict(keep_vars=True).items()
            if name not in self._params
        }
        self._storage_bytes: dict[str, int] = {}  # params discarded by sleep(level=2)
        #: Adapted weights as loaded with the base (host, their dtype): what every
        #: :meth:`apply_adapters` merges into, never the live weight.
        self._pristine: dict[str, torch.Tensor] = {}
        self._asleep = False
        self._seeds = random.Random(config.seed)

    @property
    def vocab_size(self) -> int:
        return self.model.get_input_embeddings().weight.shape[0]

    # ---- weights and memory -----------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            target, param_view = self._target(name)
            if tuple(tensor.shape) != tuple(param_view.shape):
                raise ValueError(
                    f"load_weights: '{name}' has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(param_view.shape)}"
                )
            # The view shares the parameter's storage, so it is valid once restored.
            self._restore_storage(target, self._params[target])
            param_view.copy_(tensor)
            self._pristine.pop(target, None)  # a new base: copied again at the next merge

    @torch.no_grad()
    def apply_adapters(
        self, adapters: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scale: float
    ) -> None:
        for module, (a, b) in adapters.items():
            name = f"{module}.weight"
            if name not in self._params:
                raise KeyError(f"apply_adapters: the model has no linear '{module}'")
            weight = self._params[name]
            if name not in self._pristine:
                if name in self._storage_bytes:
                    raise EngineStateError(
                        f"apply_adapters: '{name}' was discarded by sleep(level=2): "
                        "load the base with load_weights() before its adapters"
                    )
                self._pristine[name] = weight.detach().to("cpu", copy=True)
            weight.copy_(merged_weight(self._pristine[name], a, b, scale))

    def _target(self, name: str) -> tuple[str, torch.Tensor]:
        """The parameter ``name`` lands in and the view of it that ``name`` fills.

        Checkpoint-format expert names (``...experts.{e}.gate_proj.weight``, what the
        resharder's HF conversion and every MoE checkpoint use) land in transformers
        5's fused expert tensors: ``experts.gate_up_proj[e]`` holds gate rows then up
        rows, ``experts.down_proj[e]`` the down projection.
        """
        if name in self._params:
            return name, self._params[name]
        target = fused_expert_view(name, self._params)
        if target is None:
            raise KeyError(f"load_weights: the model has no parameter '{name}'")
        return target

    def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if level == 2:
            # resize_(0) frees the bytes but keeps every Parameter object valid.
            for name, param in self._unique_params():
                self._storage_bytes[name] = param.untyped_storage().nbytes()
                param.untyped_storage().resize_(0)
        elif self.device.torch_device_type != "cpu":
            self.model.to("cpu")
        self._asleep = True

    def wake_up(self) -> None:
        if self._asleep and not self._storage_bytes:
            self.model.to(self.device.device())
        self._asleep = False

    def _unique_params(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return iter(self.model.named_parameters())

    def _restore_storage(self, name: str, param: torch.nn.Parameter) -> None:
        """Re-allocate storage discarded by sleep(level=2), for this name and its ties."""
        for other, p in self._params.items():
            if p is param and other in self._storage_bytes:
                param.untyped_storage().resize_(self._storage_bytes.pop(other))

    def check_ready(self) -> None:
        if self._asleep:
            raise EngineStateError("the engine is asleep: call wake_up() before generate()")
        if self._storage_bytes:
            missing = sorted(self._storage_bytes)
            raise EngineStateError(
                f"weights were discarded by sleep(level=2) and {len(missing)} are not "
                f"reloaded (first: '{missing[0]}'): call load_weights() with all of them"
            )

    # ---- generation -------------------------------------------------------------------
    def continuous(self, params: SamplingParams) -> ContinuousBatch:
        # Loaded here, not with the module: the slots import transformers' cache classes.
        from backends.generation.hf_slots import HFContinuousBatch

        seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
        return HFContinuousBatch(self, params, self.device.device(), seed)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        self.check_ready()
        self.validate_prompts(prompts)
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
        shortest_first = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        batch_size = self._prompts_per_batch(params)
        results: list[GenerationResult] = []
        with self._private_rng(seed), torch.no_grad():
            for start in range(0, len(shortest_first), batch_size):
                batch = shortest_first[start : start + batch_size]
                results.extend(self._generate_batch(prompts, batch, params))
        return sorted(results, key=lambda r: (r.prompt_index, r.sample_index))

    @contextlib.contextmanager
    def _private_rng(self, seed: int) -> Iterator[None]:
        """Seed sampling without disturbing the caller's global RNG state."""
        kind = self.device.torch_device_type
        devices = [] if kind == "cpu" else [self.device.current_index()]
        with torch.random.fork_rng(devices=devices, device_type=kind):
            torch.manual_seed(seed)
            yield

    def _prompts_per_batch(self, params: SamplingParams) -> int:
        """How many prompts fit the memory budget: KV cache + stored raw logits."""
        cfg = self.model.config.get_text_config()
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        elem = torch.finfo(self.config.dtype).bits // 8
        kv_per_token = kv_bytes_per_token(cfg.num_hidden_layers, kv_heads, head_dim, elem)
        steps = min(params.max_tokens, self.config.max_model_len)
        per_sequence = sequence_bytes(
            self.config.max_model_len, steps, kv_per_token, self.vocab_size
        )
        budget = self.config.kv_cache_bytes
        if budget is None:
            weights = sum(p.numel() * p.element_size() for _, p in self._unique_params())
            budget = self.config.memory_fraction * self.device.total_memory() - weights
        return prompts_per_call(budget, per_sequence, params.n)

    def _generate_batch(
        self, prompts: list[list[int]], batch: list[int], params: SamplingParams
    ) -> list[GenerationResult]:
        # One row per sample, prompt-major: prompt batch[k] fills rows k*n .. k*n+n-1.
        rows = [prompts[i] for i in batch for _ in range(params.n)]
        input_ids, attention_mask = self._left_pad(rows)  # (B*n, L_max)
        room = self.config.max_model_len - min(len(r) for r in rows)
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=self._shared_prompt_cache(input_ids, attention_mask),
            generation_config=self._generation_config(params, min(params.max_tokens, room)),
            stopping_criteria=_stop_sequence_criteria(params, input_ids.shape[1]),
        )
        response_ids = out.sequences[:, input_ids.shape[1] :]  # (B*n, T)
        logprobs = _sampled_logprobs(out.logits, response_ids)  # (B*n, T)
        results = []
        for row in range(response_ids.shape[0]):
            prompt_index = batch[row // params.n]
            results.append(
                self._finish(
                    prompt_index,
                    row % params.n,
                    response_ids[row].tolist(),
                    logprobs[row].tolist(),
                    params,
                    self.config.max_model_len - len(prompts[prompt_index]),
                )
            )
        return results

    def _shared_prompt_cache(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> DynamicCache | None:
        """The KV cache of every row's prompt but its last token, each distinct prompt
        computed once.

        GRPO sends each prompt N times (or asks for n samples of it); ``generate`` would
        run the prefill, most of the work for short responses, on every copy. Here the
        distinct rows are prefilled once and the cache rows copied to their duplicates;
        ``generate`` then runs only the last prompt token of each row. Positions follow
        ``generate``'s own rule for left padding, so the cached keys are the ones it
        would have computed. None (plain ``generate``) when no row repeats, the prompts
        are one token long, or ``EngineConfig.share_prompt_prefill`` is off.
        """
        if not self.config.share_prompt_prefill or input_ids.shape[1] < 2:
            return None
        # The mask is part of the key: pad id 0 is also a real token, so [0, 5] and a
        # left-padded [5] have the same ids.
        width = input_ids.shape[1]
        rows_and_masks = torch.cat([input_ids, attention_mask], dim=1)
        distinct, copy_of = torch.unique(rows_and_masks, dim=0, return_inverse=True)
        if len(distinct) == len(input_ids):
            return None
        ids, mask = distinct[:, : width - 1], distinct[:, width:-1]  # all but the last token
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache.batch_select_indices(copy_of)
        return cache

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return left_padded(rows, self.device.device())

    def _generation_config(self, params: SamplingParams, max_new_tokens: int) -> GenerationConfig:
        sampling = {}
        if not params.greedy:
            sampling = {
                "temperature": params.temperature,
                "top_p": params.top_p,
                # 0 turns top-k off; None would let transformers fill in its default of 50
                # (5.x does), which the continuous batch and vLLM do not apply.
                "top_k": params.top_k,
            }
        from transformers import GenerationConfig

        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not params.greedy,
            eos_token_id=list(params.stop_token_ids) or None,
            pad_token_id=PAD_ID,
            return_dict_in_generate=True,
            output_logits=True,
            **sampling,
        )

    @staticmethod
    def _finish(
        prompt_index: int,
        sample_index: int,
        token_ids: list[int],
        logprobs: list[float],
        params: SamplingParams,
        room: int,
    ) -> GenerationResult:
        """Cut one padded row at its stop token or its own length cap."""
        cap = min(params.max_tokens, room)
        end = stop_end(token_ids[:cap], params)
        reason: FinishReason = "stop"
        if end is None:
            end = cap
            reason = "length" if cap == params.max_tokens else "context_limit"
        return GenerationResult(prompt_index, sample_index, token_ids[:end], logprobs[:end], reason)


def _stop_sequence_criteria(params: SamplingParams, prompt_width: int) -> list | None:
    """``generate``'s stopping criterion for ``params.stop_sequences`` (None without any):
    a row is done once its response ends with one. transformers' own ``stop_strings``
    needs a tokenizer, which engines never hold; ``eos_token_id`` takes single ids only."""
    if not params.stop_sequences:
        return None
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _EndsWithStopSequence(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
            done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            generated = input_ids.shape[1] - prompt_width
            for seq in params.stop_sequences:
                if generated >= len(seq):
                    tail = torch.tensor(seq, device=input_ids.device)
                    done |= (input_ids[:, -len(seq) :] == tail).all(dim=1)
            return done

    return StoppingCriteriaList([_EndsWithStopSequence()])


def _sampled_logprobs(step_logits: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> torch.Tensor:
    """``log softmax(raw logits)[token]`` per row and step, ``(B, T)`` float32.

    One step at a time: stacking the ``T`` steps' ``(B, V)`` logits and taking their
    log-softmax would hold two more copies of every logit the engine already keeps (a
    third and a fifth of the rollout's memory with a 150K vocabulary), for the same
    numbers.
    """
    columns = [
        torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, t : t + 1])
        for t, logits in enumerate(step_logits)
    ]
    return (
        torch.cat(columns, dim=1)
        if columns
        else tokens.new_zeros(tokens.shape, dtype=torch.float32)
    )
