"""The Megatron-core training engine: build, score (log-probs / entropy / values), train.

Algorithm-agnostic: a trainer hands :meth:`MegatronEngine.train_step` a
:class:`~backends.megatron.batch.ResponseBatch` and a ``loss_fn`` that maps the model
outputs of a micro-batch to a scalar or a per-token loss matrix; a matrix is masked with
the batch's ``response_mask`` and divided by the token count of the *whole global
batch* (all micro-batches, all DP ranks), so micro-batching and DP never change the
result (docs/architecture.md §6).

Inputs and outputs are response-aligned ``[B, R]`` (``batch.py``):
``logprobs[:, j] = log p(response token j | everything before it)``, ``entropy[:, j]``
the entropy of that same distribution and ``values[:, j]`` the critic's value of the
state token ``j`` was drawn in; 0 past each row's response. The vocabulary logits are
computed only at the positions that score response tokens (``logit_window.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from backends.device import get_device
from backends.layout import ParamLayout
from backends.megatron import checkpoint, legacy_checkpoint
from backends.megatron.attention import ulysses_divides
from backends.megatron.batch import (
    GlobalCounts,
    MicroBatching,
    ResponseBatch,
    rows_by_count,
    rows_by_tokens,
    split_to_count,
)
from backends.megatron.builder import (
    build_gpt,
    initialize_parallel,
    token_dispatcher,
    uses_te_attention,
)
from backends.megatron.cpu_compat import megatron_compat
from backends.megatron.distributed_optim import DistributedOptimizer
from backends.megatron.families import get_family
from backends.megatron.families.vla import VLAPolicy, VLASpec, build_vla
from backends.megatron.layouts import canonical_parameters, param_layouts
from backends.megatron.logprobs import (
    at_least_float32,
    vocab_parallel_entropy,
    vocab_parallel_logprobs,
)
from backends.megatron.lora import (
    LoRASpec,
    MergedWeights,
    adapters_disabled,
    add_adapters,
    is_adapter_name,
)
from backends.megatron.optim import (
    OptimSpec,
    clip_gradients,
    lr_factor,
    make_optimizer,
    optimizer_state_tensors,
    reduce_gradients,
)
from backends.megatron.packing import ContextSplit, pack_micro_batch, prompt_groups
from backends.megatron.pipeline import (
    MicroBatch,
    megatron_schedule,
    pad_to_multiple,
    run_micro_batches,
    sequence_multiple,
)
from backends.megatron.sharded_state import (
    MODEL,
    adam_pieces,
    distributed_pieces,
    distributed_states,
    ensure_adam_state,
    vocab_padding,
    weight_pieces,
)
from backends.megatron.sharded_store import Pieces
from backends.megatron.sharding import (
    gather_full_state_dict,
    gather_like,
    load_full_state_dict,
    merge_over_world,
)
from backends.megatron.spec import GPTSpec, ParallelSpec

#: loss_fn(outputs, micro-batch, global counts) -> scalar or per-token loss [b, R];
#: outputs holds logprobs / entropy or values, [b, R] each.
LossFn = Callable[[dict[str, torch.Tensor], ResponseBatch, GlobalCounts], torch.Tensor]
#: the rows of a batch one micro-batch holds
Rows = slice | list[int]


class MegatronEngine:
    """One rank's share of a Megatron-core GPT (actor, reference or critic).

    Construct it on every rank of a job after ``get_device().init_process_group(...)``;
    all methods are collective over the world unless stated otherwise.

    Args:
        spec: architecture.
        parallel: layout (DP = world / (TP * CP * PP)).
        optim: optimizer settings; ``None`` for a scoring-only role (reference). With
            ``optim.distributed_optimizer`` the parameters live in Megatron DDP's buffers
            and :attr:`optimizer` is Megatron's (see ``distributed_optim.py``).
        value_head: build a critic (values instead of vocabulary logits).
        seed: seed of the initial weights and of Megatron's TP RNG tracker.
        share_prompts: in a packed micro-batch, rows that share a prompt share one
            document: the prompt runs once (``packing.py``).
        pack: run each micro-batch as one packed row of documents, no padding between
            rows, where the attention takes a ``PackedMask`` (the torch core attention:
            every device without TransformerEngine, and every device under context
            parallelism); :attr:`packs` says if it does. Otherwise (TE, or
            ``pack=False``) right-padded rows with the causal mask.
        lora: train LoRA adapters on a frozen base (``lora.py``) instead of the weights;
            the optimizer then holds the adapters only. ``None`` (or rank 0): full weights.
        vla: build the vision-language-action policy of ``families/vla.py`` (image and
            state tokens, action ids, its own value head) instead of a text GPT; it scores
            and generates through :meth:`vla_policy` and trains with
            :meth:`train_vla_step`. Tensor and data parallel, AdamW, full weights only.

    Under context parallelism (``parallel.cp > 1``) each packed row is split over the CP
    ranks (``ContextSplit``); each rank scores the response tokens whose scoring position
    it holds and the CP group sums those outputs (:func:`_combined_over_context_parallel`),
    so every CP rank holds the whole micro-batch's outputs and computes the same loss.
    """

    def __init__(
        self,
        spec: GPTSpec,
        parallel: ParallelSpec,
        optim: OptimSpec | None = None,
        value_head: bool = False,
        seed: int = 0,
        share_prompts: bool = True,
        pack: bool = True,
        lora: LoRASpec | None = None,
        vla: VLASpec | None = None,
    ) -> None:
        self.spec, self.parallel, self.optim = spec, parallel, optim
        self.value_head = value_head
        self.device = get_device()
        # TE's fused attention is built for the causal mask type: it gets padded rows.
        self.packs = pack and not uses_te_attention(parallel)
        if parallel.cp > 1 and not self.packs:
            raise ValueError("context parallelism (cp > 1) splits packed rows: pass pack=True")
        self.share_prompts = share_prompts and self.packs
        initialize_parallel(parallel, seed)
        self.vla = vla
        if vla is None:
            self.model = build_gpt(spec, parallel, value_head=value_head, seed=seed)
        else:
            _refuse_for_vla(value_head, lora, optim)
            self.model = build_vla(spec, vla, parallel, seed=seed)
        self.lora = lora if lora is not None and lora.rank > 0 else None
        if self.lora is not None:
            with megatron_compat(self.device):
                add_adapters(self.model, self.lora, seed)
        #: Counts loads of the base weights (a checkpoint, base weights given to
        #: :meth:`load_full_state_dict`): with LoRA the generation engine keeps the base it
        #: was handed and gets the adapters only, until this count moves.
        self.base_version = 0
        #: Where the base came from (set by the caller: model source, seed); a LoRA
        #: checkpoint records it and refuses to resume on another base.
        self.base_origin: dict[str, Any] | None = None
        # The ``base/`` folder this LoRA base was read from or written as (``_save_base``).
        self._base_folder: Path | None = None
        self._trainable_params: int | None = None
        self.optimizer, self.scheduler = None, None
        self.distributed: DistributedOptimizer | None = None
        if optim is not None and optim.distributed_optimizer:
            with megatron_compat(self.device):
                self.distributed = DistributedOptimizer(self.model, optim)
            self.optimizer = self.distributed.optimizer
        elif optim is not None:
            self.optimizer, self.scheduler = make_optimizer(self.model, optim)
        self.step = 0
        self._pending_save: checkpoint.PendingSave | None = None

    # ---- layout ----------------------------------------------------------------------
    def data_parallel_rank(self) -> int:
        """This rank's data-parallel index: ranks with the same index hold the same data
        (the CP ranks of a replica too: they split each row, not the batch)."""
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_rank()

    def data_parallel_size(self) -> int:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_world_size()

    def is_data_leader(self) -> bool:
        """First TP, PP and CP rank of its data-parallel replica (writes results once)."""
        from megatron.core import parallel_state as ps

        return (
            ps.get_tensor_model_parallel_rank() == 0
            and ps.get_pipeline_model_parallel_rank() == 0
            and ps.get_context_parallel_rank() == 0
        )

    def named_parameters(self) -> dict[str, torch.nn.Parameter]:
        """This rank's parameters under canonical names (what the resharder moves)."""
        return canonical_parameters(self.model)

    # ---- weights ---------------------------------------------------------------------
    def param_layouts(self) -> dict[str, ParamLayout]:
        """Canonical name -> layout of every parameter on this rank (adapters included)."""
        return param_layouts(self.model)

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """This rank's parameters but the adapters, under canonical names: the weights
        the generation engine gets (the resharder keeps this dict and reads it at every
        hand-over). Without LoRA the whole policy; with LoRA the frozen base, which the
        engine is handed once per :attr:`base_version` and merges
        :meth:`adapter_weights` into itself (docs/architecture.md §13)."""
        return {n: p for n, p in self.named_parameters().items() if not is_adapter_name(n)}

    def adapter_weights(self) -> dict[str, torch.Tensor]:
        """This rank's LoRA adapter matrices under canonical names (``<linear>.lora.A`` /
        ``.B``; none without LoRA): what each hand-over moves besides a changed base."""
        return {n: p for n, p in self.named_parameters().items() if is_adapter_name(n)}

    def policy_layouts(self) -> dict[str, ParamLayout]:
        """Canonical name -> layout of each of :meth:`policy_weights`."""
        return self._layouts_of(self.policy_weights())

    def adapter_layouts(self) -> dict[str, ParamLayout]:
        """Canonical name -> layout of each of :meth:`adapter_weights`."""
        return self._layouts_of(self.adapter_weights())

    def _layouts_of(self, weights: dict[str, torch.Tensor]) -> dict[str, ParamLayout]:
        layouts = self.param_layouts()
        return {name: layouts[name] for name in weights}

    def trainable_params(self) -> int:
        """Elements of the whole model the optimizer trains, every shard counted once
        (collective): every weight, or with LoRA the adapters."""
        if self._trainable_params is None:
            layouts = self.param_layouts()
            local = {
                name: math.prod(layouts[name].full_shape)
                for name, param in self.named_parameters().items()
                if param.requires_grad
            }
            self._trainable_params = sum(merge_over_world(local).values())
        return self._trainable_params

    def adapters_off(self):
        """Context manager: inside it the model is the base alone (the adapters add
        nothing): the reference policy of a LoRA actor. A no-op without LoRA."""
        return adapters_disabled(self.model)

    def load_hf_state_dict(self, hf: dict[str, torch.Tensor]) -> None:
        """Load full HF tensors (every rank passes the same dict; each keeps its shard)."""
        family = get_family(self.spec.family)
        full = family.hf_to_megatron(hf, self.spec, tp=self.parallel.tp)
        self.load_full_state_dict(full)

    def load_full_state_dict(self, full: dict[str, torch.Tensor]) -> None:
        """Load full canonical Megatron tensors (non-strict for a critic's missing head)."""
        if not all(is_adapter_name(name) for name in full):
            self.base_version += 1
        with megatron_compat(self.device):
            if self.lora is not None:  # HF weights hold the base: adapters stay as they are
                full = {**self._adapter_state(), **full}
            load_full_state_dict(self.model, full, strict=not self.value_head)
            if self.distributed is not None:
                self.distributed.reload_model_params()

    def _adapter_state(self) -> dict[str, torch.Tensor]:
        """The adapters as full canonical tensors (collective over TP)."""
        return {
            name: gather_like(name, param, param.detach())
            for name, param in self.named_parameters().items()
            if is_adapter_name(name)
        }

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every canonical parameter as a full CPU tensor, on every rank (tests, conversion;
        checkpoints never gather)."""
        return gather_full_state_dict(self.model)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's canonical weights as full CPU tensors, on every rank: the weights,
        or with LoRA the base with the adapters merged in."""
        if self.lora is None:
            return self.full_state_dict()
        return dict(MergedWeights(self.full_state_dict(), self.lora.scale))

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy as an HF state dict (what generation engines load)."""
        return get_family(self.spec.family).megatron_to_hf(self.policy_state_dict(), self.spec)

    # ---- forward passes ----------------------------------------------------------------
    def _outputs(self, output: torch.Tensor, micro: _Scored, with_entropy: bool) -> dict:
        """Per response token, ``[b, R]``, from the last stage's output."""
        held = micro.held()
        if self.value_head:  # output: [b, s, 1], a value at every position (a cheap head)
            values = at_least_float32(output.squeeze(-1)).gather(1, micro.positions)
            per_slot = {"values": values}
        else:  # output: [b, W, v] logits at the scoring slots (a CP shard: its own, [1, held])
            vocab = self.spec.vocab_size
            if held is None:
                output, tokens = micro.per_row(output), micro.tokens
            else:
                tokens = micro.tokens.reshape(1, -1)[held].unsqueeze(0)
            per_slot = {"logprobs": vocab_parallel_logprobs(output, tokens, vocab)}
            if with_entropy:
                per_slot["entropy"] = vocab_parallel_entropy(output, vocab)
        if held is not None:
            per_slot = {k: _combined_over_context_parallel(v, held) for k, v in per_slot.items()}
        per_window = {k: micro.per_row(v) for k, v in per_slot.items()}
        return {k: micro.batch.spread(v) for k, v in per_window.items()}

    def _micro_batches(self, batch: ResponseBatch, rows: list[Rows]) -> list[_Scored]:
        split = self._context_split()
        multiple = sequence_multiple(self.model) * (split.parts if split else 1)
        layout = (self.packs, self.share_prompts, multiple, split)

        def scored(index: Rows, length: int = 0) -> _Scored:
            micro = batch.rows(index).to(self.device.device())
            return _Scored.of(micro, self.value_head, *layout, length)

        micro_batches = [scored(index) for index in rows]
        if not (self.packs and self.parallel.ep > 1 and token_dispatcher() == "allgather"):
            return micro_batches
        lengths = self._longest_over_experts([m.computed_tokens for m in micro_batches])
        return [
            micro if micro.computed_tokens == length else scored(index, length)
            for micro, index, length in zip(micro_batches, rows, lengths, strict=True)
        ]

    def _longest_over_experts(self, lengths: list[int]) -> list[int]:
        """Megatron's allgather token dispatcher gathers equal shapes from every rank of
        its TP x EP group, which spans data-parallel ranks: micro-batch ``i`` of every
        rank runs at the longest packed row any rank has for it."""
        from megatron.core import parallel_state as ps

        longest = torch.tensor(lengths, device=self.device.device())
        group = ps.get_data_parallel_group(with_context_parallel=True)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
        return longest.tolist()

    def _micro_batch_rows(self, batch: ResponseBatch, plan: MicroBatching) -> list[Rows]:
        """The rows of ``batch`` each micro-batch runs: ``plan.size`` consecutive rows, or
        rows within ``plan.max_tokens`` tokens as the forward lays them out (a packed row:
        each shared prompt once; right-padded rows: every row at the batch's width)."""
        if plan.max_tokens is None:
            return rows_by_count(len(batch), plan.size)
        lone = [[row] for row in range(len(batch))]
        groups = prompt_groups(batch) if self.share_prompts else lone
        prompts, responses = batch.response_start.tolist(), batch.response_len.tolist()
        if not self.packs:  # right-padded rows: each runs at the batch's width
            prompts, responses = [batch.input_ids.shape[1]] * len(batch), [0] * len(batch)
        rows = rows_by_tokens(groups, prompts, responses, plan.max_tokens)
        return self._same_count_over_experts(rows)

    def _same_count_over_experts(self, rows: list[list[int]]) -> list[list[int]]:
        """Expert parallelism's all-to-all joins the data-parallel ranks at every forward:
        they run as many micro-batches as the rank that needs the most."""
        if self.parallel.ep == 1:
            return rows
        from megatron.core import parallel_state as ps

        most = torch.tensor([len(rows)], device=self.device.device())
        group = ps.get_data_parallel_group(with_context_parallel=True)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
        try:
            return split_to_count(rows, int(most))
        except ValueError as error:
            raise RuntimeError(
                f"max_tokens_per_micro_batch under expert parallelism: {error} (another "
                "data-parallel rank needs that many); raise the budget or the batch"
            ) from error

    def _context_split(self) -> ContextSplit | None:
        """How this rank's packed rows are split over its CP group (None: cp 1)."""
        from megatron.core import parallel_state as ps

        cp = self.parallel.cp
        if cp == 1:
            return None
        heads = self.spec.num_attention_heads if self.spec.uses_mla else self.spec.num_query_groups
        balanced = not ulysses_divides(heads // self.parallel.tp, cp)
        return ContextSplit(cp, ps.get_context_parallel_rank(), balanced)

    def _run(self, micro_batches: list[_Scored], head, train: bool) -> list[Any]:
        on_cpu = self.device.torch_device_type == "cpu"
        with megatron_compat(self.device):
            if self.parallel.pp > 1 and not on_cpu:
                return megatron_schedule(self.model, micro_batches, head, train)
            return run_micro_batches(self.model, micro_batches, head, self.spec.hidden_size, train)

    @torch.no_grad()
    def forward(
        self,
        batch: ResponseBatch,
        micro_batch_size: MicroBatching | int | None = None,
        with_entropy: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Log-probs (and entropy) or values of the response tokens, ``[B, R]`` on every
        rank in ``batch``'s row order, computed ``micro_batch_size`` rows at a time
        (``None``: all at once) or by a :class:`MicroBatching` plan (a token budget)."""
        self.model.eval()

        def head(output, micro):
            return None, {
                k: v.detach() for k, v in self._outputs(output, micro, with_entropy).items()
            }

        rows = self._micro_batch_rows(batch, MicroBatching.of(micro_batch_size))
        results = self._run(self._micro_batches(batch, rows), head, train=False)
        outputs = self._share_from_last_stage(results, batch, with_entropy)
        return in_row_order(outputs, rows, len(batch))

    def _share_from_last_stage(self, results, batch: ResponseBatch, with_entropy) -> dict:
        from megatron.core import parallel_state as ps

        keys = (
            ["values"] if self.value_head else ["logprobs"] + (["entropy"] if with_entropy else [])
        )
        dtype = torch.float64 if self.spec.torch_dtype == torch.float64 else torch.float32
        out = {}
        for key in keys:
            empty = torch.empty(len(batch), batch.width, dtype=dtype)  # filled by the broadcast
            tensor = torch.cat([r[key] for r in results]) if results else empty
            tensor = tensor.to(self.device.device(), dtype)
            if ps.get_pipeline_model_parallel_world_size() > 1:
                src = ps.get_pipeline_model_parallel_last_rank()
                dist.broadcast(tensor, src=src, group=ps.get_pipeline_model_parallel_group())
            out[key] = tensor.cpu()
        return out

    # ---- training ----------------------------------------------------------------------
    def global_counts(self, batch: ResponseBatch) -> GlobalCounts:
        """Response tokens and rows of this DP rank's ``batch`` summed over all DP ranks
        (collective; one all-reduce for both). CP ranks hold the same rows: not summed."""

        tokens, sequences = self.sum_over_data_parallel(
            [batch.response_mask.double().sum(), len(batch)]
        )
        return GlobalCounts(tokens=tokens, sequences=int(sequences))

    def sum_over_data_parallel(self, values: list[Any]) -> list[float]:
        """``values`` (numbers or 0-d tensors) summed over the DP ranks (one all-reduce)."""
        from megatron.core import parallel_state as ps

        sums = torch.tensor([float(v) for v in values], dtype=torch.double)
        sums = sums.to(self.device.device())
        dist.all_reduce(sums, group=ps.get_data_parallel_group())
        return sums.tolist()

    def max_over_data_parallel(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` maxed elementwise over the DP ranks (one all-reduce), on the CPU."""
        from megatron.core import parallel_state as ps

        maxed = values.to(self.device.device(), torch.double)
        dist.all_reduce(maxed, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
        return maxed.cpu()

    def _token_use(self, micro_batches: list[_Scored]) -> dict[str, float]:
        """Positions the forward computes (pads included) and the real tokens among them,
        over the whole global batch: ``train_tokens_per_real_token`` is their ratio."""
        computed, real = self.sum_over_data_parallel(
            [
                sum(m.computed_tokens for m in micro_batches),
                sum(m.real_tokens for m in micro_batches),
            ]
        )
        return {"computed_tokens": computed, "real_tokens": real}

    def train_step(
        self,
        batch: ResponseBatch,
        loss_fn: LossFn,
        micro_batch_size: MicroBatching | int | None = None,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        """One optimizer step over this DP rank's share of the global batch.

        Args:
            batch: this DP rank's share of the global batch.
            loss_fn: ``(outputs, micro_batch, counts) -> [b, R]`` per-token loss (e.g. the
                PPO clip loss), token-meaned here over ``counts.tokens``; or a scalar: the
                micro-batch's share of the global loss, already aggregated and normalised
                with ``counts`` by ``loss_fn``.
            micro_batch_size: rows per forward/backward (``None``: all at once), or a
                :class:`MicroBatching` plan: with a token budget, whole rows up to that
                many tokens each. The step is the same either way: every loss is
                normalised by the global counts, whatever rows a micro-batch holds.
            with_entropy: also compute ``outputs["entropy"]`` for ``loss_fn``.

        Returns:
            ``loss`` (global, normalised), ``grad_norm`` (before clipping), ``lr``;
            ``computed_tokens`` (positions the forward ran, pads included) and
            ``real_tokens`` (the tokens they hold: each shared prompt once), both summed
            over the global batch.
        """
        if self.optimizer is None:
            raise RuntimeError("this engine was built without OptimSpec; it cannot train")
        plan = MicroBatching.of(micro_batch_size)
        micro_batches = self._micro_batches(batch, self._micro_batch_rows(batch, plan))
        counts = self.global_counts(batch)
        norm = max(counts.tokens, 1.0)
        self.model.train()
        if self.distributed is not None:
            self.distributed.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=True)

        def head(output, micro):
            loss = loss_fn(self._outputs(output, micro, with_entropy), micro.batch, counts)
            if loss.dim() > 0:  # per-token [b, R]: masked and normalised here
                loss = (loss * micro.batch.response_mask).sum() / norm
            return loss, loss.detach()

        losses = self._run(micro_batches, head, train=True)
        grad_norm, lr = self._optimizer_step()
        self.step += 1
        loss = self._global_loss(losses)
        return {"loss": loss, "grad_norm": grad_norm, "lr": lr, **self._token_use(micro_batches)}

    def vla_policy(self) -> VLAPolicy:
        """The vision-language-action policy this engine holds (``vla`` at construction):
        generation and the update's scoring on this rank's shard of the model."""
        if self.vla is None:
            raise RuntimeError("this engine holds a text GPT; build it with vla=VLASpec(...)")
        return VLAPolicy(self.model, self.spec, self.vla)

    def train_vla_step(
        self,
        micro_batches: Sequence[Any],
        loss_fn: Callable[[VLAPolicy, Any], torch.Tensor],
        lr: float | None = None,
    ) -> dict[str, float]:
        """One optimizer step of the VLA policy over this DP rank's micro-batches.

        ``loss_fn(policy, micro_batch)`` scores its micro-batch (``VLAPolicy.score``) and
        returns its share of the global loss, already normalised over the whole global
        batch (every DP rank's micro-batches), so the step is the same however the batch
        is split. ``lr``: this step's learning rate instead of the schedule's (a phase
        with its own, such as behaviour cloning). Returns ``loss`` (global), ``grad_norm``
        (before clipping) and ``lr``.
        """
        policy = self.vla_policy()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for micro in micro_batches:
            loss = loss_fn(policy, micro)
            with megatron_compat(self.device):
                loss.backward()
            losses.append(loss.detach())
        grad_norm, lr = self._optimizer_step(lr)
        self.step += 1
        return {"loss": self._global_loss(losses), "grad_norm": grad_norm, "lr": lr}

    def _optimizer_step(self, lr: float | None = None) -> tuple[float, float]:
        """Reduce, clip and apply the grads at ``lr`` (None: the schedule's); the grad
        norm before clipping and the lr."""
        if self.distributed is not None:
            lr = self.optim.lr * lr_factor(self.step, self.optim) if lr is None else lr
            with megatron_compat(self.device):
                return self.distributed.step(lr), lr
        with megatron_compat(self.device):
            reduce_gradients(self.model)
            grad_norm = clip_gradients(self.model, self.optim.clip_grad)
        if lr is not None:  # the scheduler's next step sets its own lr again
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        return grad_norm, lr

    def release_gradients(self) -> None:
        """Drop the gradients of the last step (they are dead once the optimizer stepped);
        the next backward makes new ones. Frees a model's worth of memory for generation."""
        if self.distributed is not None:
            self.distributed.release_gradients()
        elif self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def optimizer_state_tensors(self) -> list[torch.Tensor]:
        """Every optimizer state tensor of this rank (what allgather-swap parks on the host).

        AdamW: its moments and steps. Distributed optimizer: this DP rank's moments, steps
        and fp32 main weights (for fp32 models those are views of the weights themselves).
        """
        if self.distributed is not None:
            return self.distributed.state_tensors()
        return optimizer_state_tensors(self.optimizer) if self.optimizer is not None else []

    def _global_loss(self, losses: list[torch.Tensor]) -> float:
        from megatron.core import parallel_state as ps

        total = sum(losses, torch.zeros(())).to(self.device.device()).double()
        if ps.get_tensor_model_parallel_rank() != 0 or ps.get_context_parallel_rank() != 0:
            total.zero_()  # every TP and CP rank holds the same loss
        dist.all_reduce(total)
        return float(total)

    # ---- checkpoints -------------------------------------------------------------------
    def save_checkpoint(
        self,
        root: str | Path,
        data_position: Any = None,
        extra: dict[str, Any] | None = None,
        background: bool = False,
    ) -> Path:
        """Write model, optimizer, RNG and ``data_position`` atomically under ``root``;
        returns the step folder. Collective. (Older steps stay: the caller decides what to
        keep over all of a run's roles, ``checkpoint.prune_run``.) With LoRA the model is
        the adapters: the frozen base is its origin's (:attr:`base_origin`), or written
        once into ``root/base`` where it has none a resume could load (a random init).

        Each rank writes its part of the canonical full tensors, in parallel and once over
        replicas (see ``checkpoint.py``), so any layout resumes it. ``extra``: more trees
        of plain data and tensors, by name, that rank 0 writes into the same step folder
        (the caller's own state; read back with ``checkpoint.load_tree(step_dir / name)``).
        ``background``: return once the tensors are copied to host memory; they are
        written and published while training goes on (:meth:`finish_checkpoint` waits).
        """
        self.finish_checkpoint()
        meta = {
            # The architecture rides along so a checkpoint alone can be exported to HF.
            "spec": dataclasses.asdict(self.spec),
            "value_head": self.value_head,
            "step": self.step,
            "layout": self.layout(),
            "optimizer": self.optimizer_kind(),
            "data_position": data_position,
            "lora": dataclasses.asdict(self.lora) if self.lora is not None else None,
            "base": self.base_origin if self.lora is not None else None,
        }
        with megatron_compat(self.device):
            if self.lora is not None:
                meta["base_weights"] = self._save_base(root, meta)
            tensors = self._checkpoint_tensors(saving=True)
        per_rank = {"rng": checkpoint.capture_rng()}
        self._pending_save = checkpoint.save(
            root, self.step, tensors, extra or {}, per_rank, meta, background
        )
        return self._pending_save.step_dir

    def finish_checkpoint(self) -> Path | None:
        """Wait for a background save to be published; its step folder (``None``: none).

        Raises:
            CheckpointError: writing it failed (``latest`` names the step before it).
        """
        pending, self._pending_save = self._pending_save, None
        return pending.wait() if pending is not None else None

    def load_checkpoint(self, path: str | Path) -> Any:
        """Resume from a checkpoint (a role's folder: its latest; or one step folder) saved
        at any layout, with either optimizer; returns the saved ``data_position``.

        Each rank reads only the boxes of its own shard. At another layout than the saved
        one the RNG streams are not restored (each rank keeps the ones seeded at start-up:
        ranks do not map one to one).

        Raises:
            CheckpointError: a missing or corrupt checkpoint, or one that cannot be
                resumed here (naming why).
        """
        self.finish_checkpoint()
        saved = checkpoint.open_checkpoint(path)
        if saved.format == checkpoint.LEGACY_FORMAT:
            return legacy_checkpoint.load(self, saved)
        self._check_adapters_match(saved)
        with megatron_compat(self.device):
            self._load_base(saved)
            self._fresh_optimizer_state()
            states = self._distributed_states()
            missing = checkpoint.load_tensors(saved.dir, self._checkpoint_tensors(False, states))
            weights = [name for name in missing if name.startswith(MODEL)]
            if weights and not self.value_head:  # a critic may start from a policy
                raise checkpoint.CheckpointError(
                    f"checkpoint {saved.dir} has no '{weights[0]}' ({len(weights)} weights "
                    "missing): it was written for another model"
                )
            for rows in vocab_padding(self.model, self.spec.vocab_size):
                rows.zero_()
            self._settle_optimizer(missing)
        if saved.meta["layout"] == self.layout():
            checkpoint.restore_rng(saved.load_rank("rng", dist.get_rank()))
        self.step = saved.meta["step"]
        if self.scheduler is not None:
            self._schedule_at(self.step)
        if self.distributed is not None:
            self._group_steps_at(self.step)
        self.base_version += 1  # the checkpoint's base (the same one, checked, with LoRA)
        return saved.meta["data_position"]

    def _check_adapters_match(self, saved: checkpoint.Checkpoint) -> None:
        """A LoRA checkpoint resumes a LoRA engine of the same adapters on the same base,
        a full-weight one a full-weight engine (else adapters would be lost or missing)."""
        mine = dataclasses.asdict(self.lora) if self.lora is not None else None
        theirs = saved.meta.get("lora")
        if theirs is not None:
            theirs = {**theirs, "targets": tuple(theirs["targets"])}
        if mine != theirs:
            raise checkpoint.CheckpointError(
                f"checkpoint {saved.dir} holds lora {theirs} but this run trains lora {mine}; "
                "set actor.lora as the run that wrote it did"
            )
        base = saved.meta.get("base")
        known = self.lora is not None and None not in (base, self.base_origin)
        if known and base != self.base_origin:
            raise checkpoint.CheckpointError(
                f"checkpoint {saved.dir} trained adapters on base {base}, but this run's "
                f"base is {self.base_origin}; resume with the model it started from"
            )

    def _checkpoint_tensors(self, saving: bool, states: list | None = None) -> dict[str, Pieces]:
        """This rank's boxes of the checkpoint's tensors: what it writes (``saving``) or
        views of everything it reads into."""
        vocab = self.spec.vocab_size
        tensors = weight_pieces(self.model, vocab, saving)
        if self.lora is not None:  # the frozen base is not the step's (``_save_base``)
            tensors = {key: pieces for key, pieces in tensors.items() if is_adapter_name(key)}
        if self.distributed is not None:
            states = self._distributed_states() if states is None else states
            tensors |= distributed_pieces(self.model, states, vocab, saving)
        elif self.optimizer is not None:
            tensors |= adam_pieces(self.model, self.optimizer, vocab, saving)
        return tensors

    def _base_pieces(self, saving: bool) -> dict[str, Pieces]:
        """This rank's boxes of the frozen base's weights (LoRA): what it writes or reads."""
        tensors = weight_pieces(self.model, self.spec.vocab_size, saving)
        return {key: pieces for key, pieces in tensors.items() if not is_adapter_name(key)}

    def _base_has_a_source(self) -> bool:
        """Whether the caller named where the base came from (:attr:`base_origin`) and a
        resume loads it from there (an HF folder, a GGUF package); a random init is drawn
        per layout, so a resume at another layout could not draw it again."""
        origin = self.base_origin or {}
        return bool(origin.get("hf_path") or origin.get("gguf_package"))

    def _save_base(self, root: str | Path, meta: dict[str, Any]) -> str | None:
        """The base a LoRA step names: ``None`` (its origin's) or the run's ``base/``
        folder, written by the first save (``checkpoint.save_base``)."""
        if self._base_has_a_source():
            return None
        record = {key: meta[key] for key in ("spec", "step", "layout", "base")}
        folder = Path(root).resolve() / checkpoint.BASE
        ours = folder == self._base_folder
        checkpoint.save_base(root, self._base_pieces(saving=True), record, ours)
        self._base_folder = folder
        return checkpoint.BASE

    def _load_base(self, saved: checkpoint.Checkpoint) -> None:
        """Read a LoRA step's frozen base from the folder it names (``Checkpoint.base_dir``);
        a base named by its origin is the one this engine already loaded from there."""
        base = saved.base_dir if self.lora is not None else None
        if base is None:
            return
        missing = checkpoint.load_tensors(base, self._base_pieces(saving=False))
        if missing:
            raise checkpoint.CheckpointError(
                f"checkpoint base {base} has no '{missing[0]}' ({len(missing)} weights "
                "missing): it was written for another model"
            )
        self._base_folder = base.resolve()

    def _distributed_states(self) -> list:
        """The distributed optimizer's per-weight state on this rank (none before its first
        step or :meth:`_fresh_optimizer_state`)."""
        if self.distributed is None or not self._distributed_state_exists():
            return []
        return distributed_states(self.model, self.optimizer)

    def _distributed_state_exists(self) -> bool:
        return all(opt.optimizer.state for opt in self.optimizer.chained_optimizers)

    def _fresh_optimizer_state(self) -> None:
        """The optimizer state a first step starts from (step 0, zero moments), allocated,
        for a checkpoint to be read into: what it does not hold stays fresh."""
        if self.distributed is not None:
            for opt in self.optimizer.chained_optimizers:
                if not opt.optimizer.state:
                    # Megatron's own way to allocate it: a step on zero grads (weights are
                    # loaded after it).
                    opt._init_optimizer_states_with_dummy_values()
            for _, _, state in distributed_states(self.model, self.optimizer):
                for key in ("exp_avg", "exp_avg_sq", "step"):
                    if key in state:  # fused Adams keep the step per group, not per weight
                        state[key].zero_()
        elif self.optimizer is not None:
            self.optimizer.state.clear()
            ensure_adam_state(self.optimizer)

    def _settle_optimizer(self, missing: list[str]) -> None:
        """After reading: fp32 main weights of a 16-bit model follow the loaded weights where
        the checkpoint held none (one of torch AdamW); fp32 models' are the weights."""
        main = [name for name in missing if name.startswith("optim/main/")]
        if self.distributed is not None and (main or self.spec.dtype == "float32"):
            self.distributed.reload_model_params()

    def _group_steps_at(self, step: int) -> None:
        """An inner optimizer that counts its steps per param group (TransformerEngine's and
        Apex's fused Adam; torch AdamW counts per weight, restored from the checkpoint's
        ``optim/step``) has taken one per engine step."""
        for opt in self.optimizer.chained_optimizers:
            for group in opt.optimizer.param_groups:
                if "step" in group:
                    group["step"] = step

    def _schedule_at(self, step: int) -> None:
        """The AdamW path's LR schedule as after ``step`` optimizer steps."""
        factor = lr_factor(step, self.optim)
        lrs = [base * factor for base in self.scheduler.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self.scheduler.load_state_dict(
            {**self.scheduler.state_dict(), "last_epoch": step, "_last_lr": lrs}
        )

    def layout(self) -> dict[str, int | None]:
        """World size and parallel sizes (what a checkpoint records of its layout)."""
        keys = ("tp", "pp", "cp", "ep", "etp", "first_stage_layers")
        return {"world": dist.get_world_size(), **{k: getattr(self.parallel, k) for k in keys}}

    def optimizer_kind(self) -> str | None:
        if self.optimizer is None:
            return None
        return "distributed" if self.distributed is not None else "adamw"


@dataclass(frozen=True)
class _Scored(MicroBatch):
    """One micro-batch as the pipeline runs it: the batch and its response window.

    Packed (``packed``), the model runs one row of documents and :meth:`per_row` maps its
    outputs back to the batch's rows; otherwise the batch's right-padded rows.
    """

    batch: ResponseBatch
    positions: torch.Tensor  # [b, W] (packed: [1, b * W]) the outputs that score the tokens
    tokens: torch.Tensor  # [b, W] those tokens
    real_tokens: int  # the tokens the forward's positions hold (a shared prompt once)
    computed_tokens: int  # the positions the forward computes over its CP group (pads too)

    @classmethod
    def of(
        cls,
        batch: ResponseBatch,
        value_head: bool,
        pack: bool,
        share_prompts: bool,
        multiple: int,
        split: ContextSplit | None = None,
        length: int = 0,
    ) -> _Scored:
        """``batch`` laid out for the model: packed to at least ``length`` positions (this
        CP rank's shard of the row under ``split``), or rows right-padded to ``multiple``."""
        positions, tokens = batch.response_window()
        if pack:
            packed = pack_micro_batch(batch, share_prompts, multiple, length)
            computed = packed.input_ids.numel()
            packed = split.shard(packed) if split is not None else packed
            ids, positions, real = packed.input_ids, packed.logit_positions, packed.real_tokens
        else:
            packed, ids = None, pad_to_multiple(batch.input_ids, multiple)
            real, computed = int((batch.response_start + batch.response_len).sum()), ids.numel()
        # A critic's value head is one hidden -> 1 product: it runs at every position.
        logit_positions = None if value_head else positions
        return cls(ids, logit_positions, packed, batch, positions, tokens, real, computed)

    def per_row(self, per_position: torch.Tensor) -> torch.Tensor:
        """Outputs at :attr:`positions` -> ``[b, W, ...]`` in the batch's row order."""
        return per_position if self.packed is None else self.packed.unpack(per_position)

    def held(self) -> torch.Tensor | None:
        """``[1, b * W]``: the slots this CP rank scores (None: not context parallel)."""
        return None if self.packed is None else self.packed.held


class _SumOverContextParallel(torch.autograd.Function):
    """All-reduce over the CP group forward, identity backward: every CP rank computes the
    same loss from the summed outputs, and each rank's backward reaches only the outputs it
    computed itself (the others are zeros there), so gradients summed over CP are whole."""

    @staticmethod
    def forward(ctx, per_slot: torch.Tensor) -> torch.Tensor:
        from megatron.core import parallel_state as ps

        summed = per_slot.clone()
        dist.all_reduce(summed, group=ps.get_context_parallel_group())
        return summed

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _combined_over_context_parallel(per_held: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """``[1, b * W]`` outputs of every slot from ``[1, held]``, those of the slots this CP
    rank ``held``: zeros in the others' slots, summed over the CP group (each slot is held
    by exactly one rank)."""
    slots = per_held.new_zeros(held.shape).masked_scatter(held, per_held)
    return _SumOverContextParallel.apply(slots)


def _refuse_for_vla(value_head: bool, lora: LoRASpec | None, optim: OptimSpec | None) -> None:
    """What a VLA engine is not built for: a separate critic (its value head shares the
    actor's trunk), LoRA, Megatron's distributed optimizer (untested with its heads)."""
    if value_head:
        raise ValueError("a vla engine carries its own value head; build it with value_head=False")
    if lora is not None and lora.rank > 0:
        raise ValueError("LoRA is not supported with the vla family; train its full weights")
    if optim is not None and optim.distributed_optimizer:
        raise ValueError("the vla family trains with AdamW; set distributed_optimizer=False")


def in_row_order(
    outputs: dict[str, torch.Tensor], rows: list[Rows], count: int
) -> dict[str, torch.Tensor]:
    """Outputs concatenated micro-batch after micro-batch -> the batch's row order."""
    order = torch.cat([torch.arange(count)[index] for index in rows]) if rows else None
    if order is None or torch.equal(order, torch.arange(count)):
        return outputs
    place = torch.empty_like(order)
    place[order] = torch.arange(count)
    return {key: value[place] for key, value in outputs.items()}
