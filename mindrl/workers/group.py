"""A group of identical Ray workers: one role's ranks, one per device.

Calls go to every worker (or a chosen subset) and are awaited with a deadline: a worker
that dies raises :class:`WorkerDiedError` naming the worker and the stage at once, and a
call that outlives its deadline raises :class:`StageTimeoutError`; nothing ever hangs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
from ray.actor import ActorClass, ActorHandle
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from backends.device import Device
from mindrl.metrics.memory import format_memory


class WorkerDiedError(RuntimeError):
    """A worker process died while a stage was waiting on it."""


class WorkerOutOfMemoryError(WorkerDiedError):
    """The node's memory monitor killed a worker; :meth:`line` adds its role's peak."""

    def __init__(self, name: str, stage: str, ray_text: str) -> None:
        super().__init__(out_of_memory_line(name, stage, ray_text))
        self.name, self.stage, self.ray_text = name, stage, ray_text

    @property
    def role(self) -> str:
        return self.name.split("[")[0]

    def line(self, role_peak: Mapping[str, float] | None) -> str:
        """The one line, with the role's largest measured peaks (MiB) when known."""
        return out_of_memory_line(self.name, self.stage, self.ray_text, role_peak)


class StageTimeoutError(RuntimeError):
    """A stage did not finish within its deadline."""


class StageFailedError(RuntimeError):
    """A worker raised while serving a stage; ``details`` keeps its whole traceback.
    ``user_error``: it raised a ``ValueError``, the type of this project's user mistakes
    (a bad config, file or checkpoint), which running it again would not get past."""

    def __init__(self, message: str, details: str, user_error: bool = False) -> None:
        super().__init__(message)
        self.details = details
        self.user_error = user_error


POLL_S = 1.0


class WorkerGroup:
    """``size`` Ray actors of ``worker_cls``, rank ``r`` started with ``actor_options[r]``.

    Model roles and rollout workers get their options from the run's one device placement
    group (mindrl/workers/placement.py: each rank's device bundle and its share of it).
    Without ``actor_options`` the group reserves its own placement group of one bundle per
    worker, packed onto nodes: ``device``'s (one whole device each) or, with ``device``
    ``None``, ``cpus_per_worker`` CPU slots each (reward scoring).

    Args:
        name: shown in errors, e.g. ``"actor"``.
        worker_cls: a ``@ray.remote`` class whose constructor takes ``(rank, size, *args)``.
        device: the device layer, for a group that places itself; ``None``: CPU-only.
        cpus_per_worker: Ray CPU slots per worker beside its device (CPU: the device slot).
        strategy: a group that places itself: ``"PACK"`` fills a node before the next,
            ``"SPREAD"`` puts each bundle on another node while it can.
        actor_options: per rank, the Ray actor options that place it.
    """

    def __init__(
        self,
        name: str,
        worker_cls: ActorClass,
        size: int,
        device: Device | None = None,
        args: Sequence[Any] = (),
        cpus_per_worker: float = 1.0,
        ready_timeout_s: float = 300.0,
        strategy: str = "PACK",
        actor_options: Sequence[dict] | None = None,
    ) -> None:
        self.name = name
        self.size = size
        self._pg = None
        if actor_options is None:
            actor_options = self._own_placement(device, cpus_per_worker, ready_timeout_s, strategy)
        self.workers: list[ActorHandle] = [
            worker_cls.options(name=None, **actor_options[i]).remote(i, size, *args)
            for i in range(size)
        ]

    def _own_placement(
        self, device: Device | None, cpus_per_worker: float, timeout_s: float, strategy: str
    ) -> list[dict]:
        """A placement group of one bundle per worker; each worker's options on it."""
        if device is None:
            bundle, options = {"CPU": cpus_per_worker}, {"num_cpus": cpus_per_worker}
        else:
            bundle = device.ray_bundle(1, cpus_per_worker)
            options = device.ray_actor_options(cpus_per_worker)
        self._pg = placement_group([dict(bundle) for _ in range(self.size)], strategy=strategy)
        wait_for_placement(
            self._pg,
            timeout_s,
            f"{self.name}: the cluster cannot place {self.size} workers of {bundle} within "
            f"{timeout_s:.0f} s; check `ray status` for free resources or lower "
            "resources.devices_per_node / resources.nodes",
        )
        return [on_bundle(self._pg, i, options) for i in range(self.size)]

    def call(
        self,
        method: str,
        *args: Any,
        stage: str,
        timeout_s: float,
        ranks: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Call ``method`` on the chosen workers and return their results in rank order."""
        ranks = list(range(self.size)) if ranks is None else list(ranks)
        refs = [getattr(self.workers[r], method).remote(*args, **kwargs) for r in ranks]
        return wait_all(refs, [f"{self.name}[{r}]" for r in ranks], stage, timeout_s)

    def call_each(
        self,
        method: str,
        args_per_rank: Sequence[tuple],
        *,
        stage: str,
        timeout_s: float,
        on_poll: Callable[[], None] | None = None,
        ranks: Sequence[int] | None = None,
    ) -> list[Any]:
        """Call ``method`` on rank ``r`` with ``args_per_rank[r]``; results in rank order.

        ``on_poll`` runs about once a second while waiting (e.g. to move a progress bar);
        ``ranks``: the workers the arguments are for, in their order (default every rank).
        """
        ranks = list(range(self.size)) if ranks is None else list(ranks)
        refs = self.submit_each(method, args_per_rank, ranks)
        names = [f"{self.name}[{r}]" for r in ranks]
        return wait_all(refs, names, stage, timeout_s, on_poll)

    def submit_each(
        self, method: str, args_per_rank: Sequence[tuple], ranks: Sequence[int] | None = None
    ) -> list[Any]:
        """Start ``method`` on rank ``r`` with ``args_per_rank[r]`` (``ranks``: on these
        workers, in order); their object refs, in that order, for the caller to
        ``ray.wait`` on (read each with :func:`checked_get`)."""
        ranks = list(range(self.size)) if ranks is None else list(ranks)
        return [
            getattr(self.workers[r], method).remote(*args)
            for r, args in zip(ranks, args_per_rank, strict=True)
        ]

    def names(self) -> list[str]:
        """Each rank's name in errors, e.g. ``actor[1]``."""
        return [f"{self.name}[{r}]" for r in range(self.size)]

    def shutdown(self) -> None:
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        if self._pg is not None:  # the run's device placement is removed by its owner
            remove_placement_group(self._pg)


def on_bundle(group: PlacementGroup, bundle: int, options: Mapping[str, Any]) -> dict:
    """Ray actor options that schedule an actor into ``bundle`` of placement ``group``,
    with ``options`` (its CPUs and device share) on top."""
    strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)
    return {"scheduling_strategy": strategy, **options}


def wait_for_placement(group: PlacementGroup, timeout_s: float, refusal: str) -> None:
    """Wait until the cluster grants placement ``group``; if it does not within
    ``timeout_s``, remove the group (its reservation would block other jobs) and raise
    :class:`StageTimeoutError` with ``refusal``."""
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise StageTimeoutError(refusal)


def wait_all(
    refs: list[Any],
    names: list[str],
    stage: str,
    timeout_s: float,
    on_poll: Callable[[], None] | None = None,
) -> list[Any]:
    """Results of ``refs``; the first death or the deadline raises at once."""
    deadline = time.monotonic() + timeout_s
    pending = dict(zip(refs, names, strict=True))
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            waiting = ", ".join(pending.values())
            raise StageTimeoutError(
                f"stage '{stage}' timed out after {timeout_s:.0f} s waiting on {waiting}"
            )
        done, _ = ray.wait(list(pending), num_returns=1, timeout=min(POLL_S, remaining))
        if on_poll is not None:
            on_poll()
        for ref in done:
            checked_get(ref, pending.pop(ref), stage)
    return ray.get(refs)


def checked_get(ref: Any, name: str, stage: str) -> Any:
    """The result of a finished call of worker ``name``; its death or failure raises the
    error that names the worker and the stage."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as exc:
        raise WorkerDiedError(
            f"worker {name} died during stage '{stage}': {first_line(exc)}"
        ) from None
    except ray.exceptions.RayTaskError as exc:
        user_error = isinstance(getattr(exc, "cause", None), ValueError)
        raise StageFailedError(
            f"worker {name} failed during stage '{stage}': {last_line(exc)}", str(exc), user_error
        ) from None
    except ray.exceptions.OutOfMemoryError as exc:
        raise WorkerOutOfMemoryError(name, stage, str(exc)) from None
    except ray.exceptions.RayError as exc:  # e.g. a node lost
        raise WorkerDiedError(
            f"worker {name} was lost during stage '{stage}': {first_line(exc)}"
        ) from None


def out_of_memory_line(
    name: str, stage: str, ray_text: str, role_peak: Mapping[str, float] | None = None
) -> str:
    """One line for a worker the node's memory monitor killed: who, when, how full the
    node was, its role's measured peak (``role_peak``: MiB by memory key, the largest
    seen so far; else where the peaks are) and what lowers it (not Ray's paragraph)."""
    used = re.search(r"([\d.]+GB used / [\d.]+GB limit)", ray_text)
    node = f" (node memory {used.group(1)})" if used else ""
    role = name.split("[")[0]
    knobs = "rollout.kv_cache_mib or, on a CPU, rollout.swap=false"
    if role != "reward":
        knobs = f"{role}.micro_batch_size, {knobs}"
    if role_peak:
        peak = f"peak measured so far: {format_memory({role: role_peak})}"
    else:
        peak = "each role's peak is in metrics.jsonl under 'memory'"
    return (
        f"worker {name} was killed for memory during stage '{stage}'{node}; {peak}; "
        f"lower it with {knobs} (docs/memory.md)"
    )


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def last_line(exc: BaseException) -> str:
    """The exception line at the bottom of a remote traceback (what went wrong)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__
