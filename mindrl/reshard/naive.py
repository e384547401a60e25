"""The naive resharder: gather into new buffers while the training weights stay resident.

This is the baseline of the paper's Figure 3. Generation shards are new device
buffers, except where the generation engine can use a training tensor as it is
(replicated parameters, and whole experts this rank already trains with ETP = 1);
everything else the training stage holds is redundant during generation.
"""

from __future__ import annotations

import time

import torch

from mindrl.reshard.resharder import BaseResharder


class NaiveResharder(BaseResharder):
    """Naive resharder; arguments as :class:`~mindrl.reshard.resharder.BaseResharder`."""

    seconds: dict[str, float]

    def reusable_names(self) -> set[str]:
        """Generation shards that can alias this rank's training tensor."""
        reusable = set()
        for name in self.generation_names():
            info, local = self.table[name], self.params.get(name)
            if local is None:
                continue
            whole_expert = info.layout.is_expert and self.train.etp == 1 and self.gen.etp == 1
            if info.layout.partition_dim is None or whole_expert:
                reusable.add(name)
        return reusable

    def reshard(self, out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Gather into new generation buffers; returns ``{name: generation shard}``."""
        self.timeline.clear()
        self.timeline.record("start")
        reusable = self.reusable_names()
        if out is None:
            out = self.allocate_generation_buffers(exclude=reusable)
            self.timeline.record("generation buffers")
        out.update({name: self.params[name] for name in reusable})
        start = time.perf_counter()
        self._gather_and_copy(out, skip=reusable)
        self.seconds = {"gather": time.perf_counter() - start}
        self.timeline.record("generation")
        return out
