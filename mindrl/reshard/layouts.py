"""Training and generation layouts: rank coordinates, process-group rank lists, checks.

Training ranks are numbered exactly as Megatron-core's ``parallel_state`` numbers them
with its default order ``tp-cp-ep-dp-pp``: dense parameters use the generator
(tp, cp, dp, pp) and expert parameters the generator (etp, ep, edp, pp), so

    rank = tp + TP * (cp + CP * (dp + DP * pp))          (dense)
    rank = etp + ETP * (ep + EP * (edp + EDP * pp))     (experts)

Generation ranks follow vLLM with PP = 1: ``rank = tp + TP * dp``. With generation
EP > 1 the expert group is ``EP`` consecutive ranks (vLLM's EP spans TP x DP) and each
rank holds whole experts; with EP = 1 experts are tensor-split like dense weights.

Everything here is pure arithmetic: no process groups, no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass


class LayoutError(ValueError):
    """A training/generation layout pair the resharder cannot serve (raised before comms)."""


@dataclass(frozen=True)
class TrainLayout:
    """Megatron-core training layout. ``world = tp*cp*dp*pp``; experts ``etp*ep*edp*pp``."""

    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1

    def __post_init__(self) -> None:
        if self.world % (self.tp * self.cp * self.pp):
            raise LayoutError(
                f"training tp*cp*pp = {self.tp * self.cp * self.pp} does not divide world "
                f"{self.world}; pick sizes whose product divides the number of ranks"
            )
        if self.world % (self.etp * self.ep * self.pp):
            raise LayoutError(
                f"training etp*ep*pp = {self.etp * self.ep * self.pp} does not divide world "
                f"{self.world}; pick expert sizes whose product divides the number of ranks"
            )

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.cp * self.pp)

    @property
    def edp(self) -> int:
        return self.world // (self.etp * self.ep * self.pp)

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def pp_rank(self, rank: int) -> int:
        return rank // (self.tp * self.cp * self.dp)

    def etp_rank(self, rank: int) -> int:
        return rank % self.etp

    def ep_rank(self, rank: int) -> int:
        return (rank // self.etp) % self.ep

    def tp_groups(self) -> list[list[int]]:
        """Dense tensor-parallel groups (Megatron ``get_ranks('tp')``)."""
        return [list(range(start, start + self.tp)) for start in range(0, self.world, self.tp)]

    def expert_groups(self) -> list[list[int]]:
        """Expert tensor-and-expert-parallel groups (Megatron expert ``get_ranks('tp-ep')``)."""
        size = self.etp * self.ep
        return [list(range(start, start + size)) for start in range(0, self.world, size)]

    def pp_groups(self) -> list[list[int]]:
        """Pipeline groups (Megatron ``get_ranks('pp')``): same for dense and experts."""
        stride = self.world // self.pp
        return [list(range(first, self.world, stride)) for first in range(stride)]

    def stage_ranks(self, stage: int) -> list[int]:
        stride = self.world // self.pp
        return list(range(stage * stride, (stage + 1) * stride))


@dataclass(frozen=True)
class GenLayout:
    """vLLM generation layout: TP, EP, PP = 1, DP = world / TP.

    ``whole_vocab``: vocabulary-parallel parameters (embedding, output layer) are held
    whole by every generation rank instead of split over its TP group. vLLM needs that:
    it pads the vocabulary to a multiple of 64 and splits the padded rows, which differs
    from Megatron's split, so its loader takes the full tensor and cuts its own rows.
    The full tensor exists anyway inside the all-gather bucket, so this costs no traffic.
    """

    world: int
    tp: int = 1
    ep: int = 1
    whole_vocab: bool = False

    def __post_init__(self) -> None:
        if self.world % self.tp:
            raise LayoutError(f"generation tp {self.tp} does not divide world {self.world}")
        if self.world % self.ep:
            raise LayoutError(f"generation ep {self.ep} does not divide world {self.world}")
        if self.ep > 1 and self.ep % self.tp:
            raise LayoutError(
                f"generation ep {self.ep} must be a multiple of generation tp {self.tp} "
                "(vLLM's expert group spans whole TP groups)"
            )

    @property
    def dp(self) -> int:
        return self.world // self.tp

    @property
    def etp(self) -> int:
        """Tensor split inside one expert: whole experts once EP > 1 (vLLM)."""
        return self.tp if self.ep == 1 else 1

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def ep_rank(self, rank: int) -> int:
        return rank % self.ep

    def etp_rank(self, rank: int) -> int:
        return rank % self.etp


@dataclass(frozen=True)
class ModelShape:
    """What divisibility checks need to know about the model (heads, groups, experts)."""

    num_heads: int
    num_query_groups: int
    num_experts: int = 0

    @classmethod
    def from_config(cls, model: object) -> ModelShape:
        """From a :class:`mindrl.config.ModelConfig` (duck-typed to keep this module pure)."""
        return cls(model.num_attention_heads, model.num_kv_heads, model.num_experts)


def check_layout_pair(train: TrainLayout, gen: GenLayout, shape: ModelShape | None) -> None:
    """Refuse a layout pair that cannot be resharded; one-line :class:`LayoutError`."""
    if train.world != gen.world:
        raise LayoutError(
            f"training world {train.world} != generation world {gen.world}; both stages must "
            "run on the same ranks"
        )
    if shape is None:
        return
    for name, tp in (("training tp", train.tp), ("generation tp", gen.tp)):
        if shape.num_heads % tp or shape.num_query_groups % tp:
            raise LayoutError(
                f"{name} {tp} must divide num_heads {shape.num_heads} and num_query_groups "
                f"{shape.num_query_groups} (qkv is split by whole query groups)"
            )
    if shape.num_experts:
        for name, ep in (("training ep", train.ep), ("generation ep", gen.ep)):
            if shape.num_experts % ep:
                raise LayoutError(
                    f"{name} {ep} does not divide num_experts {shape.num_experts}; choose an "
                    "expert-parallel size that divides the expert count"
                )
    elif train.ep > 1 or gen.ep > 1:
        raise LayoutError("expert parallelism (ep > 1) needs a model with experts")


def check_partition(name: str, layout: object, train: TrainLayout, gen: GenLayout) -> None:
    """Refuse a parameter whose partition dim does not split over both layouts."""
    dim = layout.partition_dim
    if dim is None:
        return
    parts = (train.etp, gen.etp) if layout.is_expert else (train.tp, gen.tp)
    if layout.kind == "vocab" and gen.whole_vocab:
        parts = (train.tp,)
    length = layout.full_shape[dim]
    for tp in parts:
        if length % (tp * layout.fused_pieces):
            raise LayoutError(
                f"parameter '{name}': dim {dim} of length {length} does not split into "
                f"{layout.fused_pieces} piece(s) x {tp} ranks; pad it or pick another tp"
            )
