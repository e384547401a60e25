"""Megatron-core without TransformerEngine, and on the CPU.

Three separate things, all entered through :func:`megatron_compat` (every engine call):

**An import without compiled helpers, on the CPU** (:func:`import_megatron_eager`):
Megatron wraps its fused helpers in ``torch.compile`` as its modules are imported
(``megatron.core.jit.jit_fuser``), and the first wrap imports inductor, 1.5-2 s of CPU in
every process before any model exists. On the CPU those helpers run eagerly anyway (the
redirection's ``force_eager`` stance, below), so there they are left unwrapped.

**TE-absent fixes, on every device** (:func:`fix_te_absent_names`). Megatron-core 0.16.1
has two bugs when TransformerEngine is not installed, on a GPU as much as on the CPU:

* the MoE router's ``te_general_gemm`` is only bound when TE imports, then read anyway
  (``NameError`` in every router forward); it is defined as ``None``, the value Megatron
  tests for;
* multi-latent attention's ``HAVE_TE`` is ``True``: its TE extension module imports
  without TE and binds ``TELinear`` to a ``MagicMock`` instance, so MLA's constructor
  calls ``isinstance`` on it (``TypeError``); it is set ``False``.

They are permanent and idempotent (they only give Megatron the values it meant to have)
and change nothing when TE is installed.

**The CPU redirection** (:func:`megatron_on_cpu`, a scoped, reversible patch). Megatron-core
0.16 allocates buffers with ``device=torch.cuda.current_device()`` and keeps its
tensor-parallel RNG streams in CUDA generators. On a CPU-only torch both fail, so
inside it:

* ``torch.cuda.current_device()`` returns ``"cpu"`` (a valid ``device=`` argument);
* the RNG tracker forks and restores the CPU generator instead of a CUDA one
  (``torch.cuda.get_rng_state`` / ``set_rng_state`` / ``manual_seed`` and Megatron's
  private state helpers are redirected to their CPU twins);
* the default causal mask of the local softmax is built on the CPU (Megatron builds it
  with ``device="cuda"`` when no mask is passed);
* Megatron's "CPU RNG state changed within GPU RNG context" warning is muted, since on
  CPU the forked stream *is* the CPU generator;
* ``Tensor.cuda()`` returns the tensor itself: tied embeddings with pipeline parallelism
  move the shared weight with ``weight.data.cuda()`` before their all-reduce;
* for the distributed optimizer (``DistributedDataParallel`` + ``get_megatron_optimizer``):
  the optimizer modules see a ``torch`` whose tensor factories turn ``device="cuda"``
  into the CPU, and ``Tensor.type()`` names CPU tensors ``torch.cuda.*`` (see
  :class:`_TorchOnCpu` and :func:`_type_as_cuda` for the Megatron lines);
* functions Megatron wrapped in ``torch.compile`` (its ``jit_fuser``: the router's
  ``_apply_expert_bias`` runs in every MoE forward) run eagerly. Compiling would ask
  dynamo, and inductor's device-property cache asks every *available* device interface
  for its current device: in a CPU rank of a CUDA-built torch (the CPU reference beside
  GPU ranks) that is ``torch.cuda.current_device()``, answered ``"cpu"`` here, and
  inductor indexed its CUDA property list with it (``TypeError: list indices must be
  integers or slices, not str``, seen on an H200).

Everything is restored on exit, also after an exception. It is applied only by
:func:`megatron_compat` on the CPU device, and refuses to start in a process whose
device is an accelerator or that has initialised one (:func:`_refuse_accelerator_process`):
patched ``torch.cuda`` functions there would misplace real device work.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Iterator
from typing import Any

import torch


def import_megatron_eager() -> None:
    """Import ``megatron.core`` with ``torch.compile`` the identity meanwhile, so that
    Megatron's ``jit_fuser`` is the identity in every module imported then or later
    (module docstring). Megatron's own ``disable_jit_fuser()`` comes too late: importing
    ``megatron.core`` already imports and wraps the fused helpers. For CPU processes
    only (:func:`megatron_compat`); a no-op once ``megatron.core`` is imported.
    """
    if "megatron.core" in sys.modules:
        return
    real_compile = torch.compile
    torch.compile = _compile_nothing
    try:
        import megatron.core  # noqa: F401
    finally:
        torch.compile = real_compile


def _compile_nothing(model: Any = None, **options: Any) -> Any:
    """``torch.compile`` that compiles nothing: ``model`` itself, or (called with options
    only, as a decorator factory) a decorator that returns its function."""
    return model if model is not None else (lambda fn: fn)


class _Patches:
    """Attribute replacements that can be undone in reverse order."""

    _ABSENT = object()

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        # Only the owner's own attribute is saved: an inherited one (``Tensor.type`` lives
        # on the C base class) is deleted again on undo rather than copied onto the owner.
        self._saved.append((owner, name, vars(owner).get(name, self._ABSENT)))
        setattr(owner, name, value)

    def undo(self) -> None:
        while self._saved:
            owner, name, value = self._saved.pop()
            if value is self._ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


class _MuteForkWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


def _cpu_get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_set_rng_state(state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    torch.set_rng_state(state)


def _cpu_manual_seed(seed: int) -> None:
    torch.random.default_generator.manual_seed(seed)


def _tensor_stays_on_cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self


def _cpu_causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


def _factory_on_cpu(factory: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    if str(kwargs.get("device", "")).startswith("cuda"):
        kwargs["device"] = "cpu"
    return factory(*args, **kwargs)


class _TorchOnCpu:
    """``torch`` as the Megatron optimizer modules see it on the CPU.

    They make scalars with a literal ``device="cuda"``, which a CPU-only torch refuses:
    megatron/core/optimizer/optimizer.py:473/481/485 (found_inf, overflow buffer and
    scale-one of every mixed-precision and distributed optimizer) and :907;
    clip_grads.py:90/103/115/174/207 (grad-norm, clip and zero-count buffers);
    utils.py:1207 (the result of ``local_multi_tensor_l2_norm``, the grad-norm kernel
    used without Apex/TE). Every other attribute is the real ``torch``.
    """

    _FACTORIES = frozenset({"tensor", "zeros", "ones", "empty", "full"})

    def __getattr__(self, name: str) -> Any:
        value = getattr(torch, name)
        if name in self._FACTORIES:
            return functools.partial(_factory_on_cpu, value)
        return value


_TORCH_ON_CPU = _TorchOnCpu()


def _type_as_cuda(original: Any) -> Any:
    """``Tensor.type()`` that reports CPU tensors under their ``torch.cuda.*`` names.

    The distributed optimizer sorts parameters into fp16/bf16 and fp32 groups by
    ``param.type()`` string and rejects anything else (megatron/core/optimizer/
    distrib_optimizer.py:361/420/582; also optimizer.py:671/690, clip_grads.py:167).
    Only the no-argument form (the type name) changes; conversions are untouched.
    """

    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        name = original(self, *args, **kwargs)
        if args or kwargs or self.device.type != "cpu":
            return name
        return name.replace("torch.", "torch.cuda.", 1)

    return type_


def fix_te_absent_names() -> None:
    """Give Megatron the names it reads without TransformerEngine (module docstring).

    Idempotent; a no-op where TE is installed (the names are then TE's own).
    """
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if not isinstance(multi_latent_attention.TELinear, type):
        multi_latent_attention.HAVE_TE = False


class AcceleratorProcessError(RuntimeError):
    """The CPU redirection was asked for in a process that computes on an accelerator."""


def _refuse_accelerator_process() -> None:
    """Raise unless this process computes on the CPU and has no accelerator runtime up.

    The redirection patches ``torch.cuda`` for the whole process: in a process whose
    device is a GPU / NPU, or that already created a CUDA / NPU context, Megatron (and
    torch's compiler) would be handed ``"cpu"`` for the current device.
    """
    from backends.device import get_device

    device = get_device()
    if device.torch_device_type != "cpu":
        raise AcceleratorProcessError(
            f"the Megatron CPU redirection was requested in a process whose device is "
            f"'{device.name}'; call megatron_compat with this process's device "
            f"(backends.device.get_device()), or choose --device cpu for the whole process"
        )
    runtimes = {"cuda": torch.cuda, "npu": getattr(torch, "npu", None)}
    for name, runtime in runtimes.items():
        if runtime is not None and runtime.is_initialized():
            raise AcceleratorProcessError(
                f"the Megatron CPU redirection was requested in a process that has initialised "
                f"{name}; run CPU ranks in processes of their own (spawned with device 'cpu')"
            )


@contextlib.contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """Run Megatron-core model code on the CPU for the duration of the block."""
    from megatron.core import utils as mp_utils
    from megatron.core.fusions import fused_softmax
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as mp_optimizer
    from megatron.core.tensor_parallel import random as mp_random

    _refuse_accelerator_process()
    patches = _Patches()
    mute = _MuteForkWarning()
    logger = logging.getLogger(mp_random.__name__)
    try:
        patches.set(torch.cuda, "current_device", lambda: "cpu")
        patches.set(torch.cuda, "get_rng_state", _cpu_get_rng_state)
        patches.set(torch.cuda, "set_rng_state", _cpu_set_rng_state)
        patches.set(torch.cuda, "manual_seed", _cpu_manual_seed)
        patches.set(mp_random, "_get_cuda_rng_state", _cpu_get_rng_state)
        patches.set(mp_random, "_set_cuda_rng_state", _cpu_set_rng_state)
        patches.set(fused_softmax, "get_default_causal_mask", _cpu_causal_mask)
        patches.set(torch.Tensor, "cuda", _tensor_stays_on_cpu)
        patches.set(mp_optimizer, "torch", _TORCH_ON_CPU)
        patches.set(clip_grads, "torch", _TORCH_ON_CPU)
        patches.set(mp_utils, "torch", _TORCH_ON_CPU)
        patches.set(torch.Tensor, "type", _type_as_cuda(torch.Tensor.type))
        logger.addFilter(mute)
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        logger.removeFilter(mute)
        patches.undo()


@contextlib.contextmanager
def megatron_compat(device: Any) -> Iterator[None]:
    """Make Megatron-core usable on ``device``: the TE-absent fixes on every device, the
    CPU redirection (:func:`megatron_on_cpu`) on the CPU only, after importing Megatron
    without its compiled helpers there (:func:`import_megatron_eager`)."""
    if device.torch_device_type == "cpu":
        import_megatron_eager()
    fix_te_absent_names()
    if device.torch_device_type != "cpu":
        yield
        return
    with megatron_on_cpu():
        yield
