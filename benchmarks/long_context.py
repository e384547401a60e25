"""Activation memory per rank of one long sequence under context parallelism, measured.

A model of SmolLM2's width (576) and MLP (1536) with 4 layers, 8 query / 4 kv heads (so
Ulysses divides at cp 2 and 4) and an 8192-token vocabulary (SmolLM2's 49152 would make
the CPU steps six times longer; the logits divide by cp like the rest), float32, trains
one sequence -- every token after the first scored, log-probs and entropy as a PPO step
needs them -- at cp 1, 2 and 4. Every cell (a cp and a length) runs in a fresh set of
``cp`` rank processes (gloo on the CPU; the cores shared out between them):

* ``peak_bytes[length]``: the activation peak per rank (the largest over the ranks) of one
  training step, forward and backward, for a sequence of 2048, 4096 and 8192 tokens; a
  length whose peak passes ``--cap-mib`` (what one rank may take here) is left out.
* ``max_tokens``: the longest sequence whose step fits ``--budget-mib`` per rank: lengths
  halve or double from the measured ones until one fits and one does not, then bisect
  to ``--resolution`` tokens.
* ``step_s[length]``: the wall time of that training step (the slowest rank).

How the peak is measured: the step runs inside ``LiveBytes``
(``benchmarks/harness/live_bytes.py``, the tracker ``benchmarks/stage_memory.py`` uses),
which counts every tensor storage an op creates until it is freed -- what a device
allocator's ``max_memory_allocated`` sees on an accelerator -- and nothing that was live
before. The rank first runs one warm-up step on a short row outside the tracker, so the
weights, their gradients (kept allocated between steps, as Megatron's grad buffer keeps
them on an accelerator) and Adam's moments all exist before the measured step, and the
window closes when the optimizer step begins (its transients are the optimizer's). What
the window allocates above what was live is then the forward's saved activations, the
logits and their loss terms, the backward's transients and the collectives' buffers:
the activations. RSS would not do: the allocator keeps freed pages, so it never falls
back, and it counts the Python heap. A probe whose count passes the budget stops at that
op (its rank raises; the others are ended), so a length that does not fit costs no more
memory than the budget.

    python benchmarks/long_context.py [--json OUT] [--budget-mib 512] [--cp 1,2,4]

Prints each cell's peak as a ratio of cp 1's at the same length (the goals: cp 2 within
0.6x, cp 4 within 0.35x), the longest sequence per cp and the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.megatron import GPTSpec
from benchmarks.harness.live_bytes import LiveBytes
from benchmarks.harness.report import machine

MIB = 2**20
LENGTHS = (2048, 4096, 8192)
#: The warm-up row: short, but long enough to split over 2 * 4 chunks of a few tokens.
WARMUP_TOKENS = 64
#: Lengths the search tries are multiples of this (every cp's split divides it).
GRAIN = 64


def model_spec() -> GPTSpec:
    """SmolLM2-135M's width and MLP, 4 layers, 8 query / 4 kv heads, an 8192 vocabulary."""
    return GPTSpec(
        family="llama", num_layers=4, hidden_size=576, num_attention_heads=8,
        num_query_groups=4, head_dim=64, ffn_hidden_size=1536, vocab_size=8192,
        rope_theta=100000.0, tie_word_embeddings=True, max_position_embeddings=2**20,
    )  # fmt: skip


class OverBudget(Exception):
    """A rank's live bytes passed the budget (raised at the op that passed it)."""


class BudgetedLiveBytes(LiveBytes):
    """LiveBytes that stops the step at the first op whose outputs pass ``budget``."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget

    def _change(self, delta: int) -> None:
        super()._change(delta)
        if delta > 0 and self.current > self.budget:
            raise OverBudget(f"{self.current / MIB:.0f} MiB live, budget {self.budget / MIB:.0f}")


def one_step(rank: int, world: int, length: int, budget: int) -> dict:
    """Inside each rank: build at cp=world, warm up, then one measured step of ``length``:
    the peak of its forward and backward (up to the optimizer step) and its wall time."""
    import torch

    from backends.megatron import MegatronEngine, OptimSpec, ParallelSpec, ResponseBatch
    from backends.megatron.builder import destroy_parallel

    spec = model_spec()
    engine = MegatronEngine(spec, ParallelSpec(cp=world), OptimSpec(lr=1e-5))
    # Gradients stay allocated between steps, as Megatron's grad buffer keeps them on an
    # accelerator: the backward adds into them instead of counting a new model's worth.
    engine.optimizer.zero_grad = lambda set_to_none=True: torch.optim.Optimizer.zero_grad(
        engine.optimizer, set_to_none=False
    )

    def batch_of(tokens: int) -> ResponseBatch:
        gen = torch.Generator().manual_seed(tokens)  # every rank: the same row
        ids = torch.randint(0, spec.vocab_size, (1, tokens), generator=gen)
        advantages = torch.randn(1, tokens - 1, generator=gen)
        return ResponseBatch.continuation(ids, start=1, fields={"advantages": advantages})

    def loss_fn(out, micro, counts):
        return -out["logprobs"] * micro.fields["advantages"] - 1e-3 * out["entropy"]

    engine.train_step(batch_of(WARMUP_TOKENS), loss_fn, with_entropy=True)
    batch = batch_of(length)
    live = BudgetedLiveBytes(budget)
    optimizer_step = engine._optimizer_step

    def after_the_backward():  # the optimizer's transients are no activations
        live.window("forward+backward")
        return optimizer_step()

    engine._optimizer_step = after_the_backward
    start = time.perf_counter()
    with live:
        engine.train_step(batch, loss_fn, with_entropy=True)
    step_s = time.perf_counter() - start
    destroy_parallel()
    return {"peak_bytes": live.windows[0].peak, "step_s": step_s}


def run_cell(cp: int, length: int, budget: int) -> dict | None:
    """One length at one cp in fresh processes: the largest rank peak and the slowest
    rank's step time; None when a rank passed ``budget``."""
    from benchmarks.harness.spawn import run_ranks

    threads = max(1, (os.cpu_count() or 1) // cp)  # the cores shared out, none idle
    print(f"  cp {cp}, {length} tokens", end=": ", file=sys.stderr, flush=True)
    try:
        ranks = run_ranks(one_step, cp, length, budget, threads=threads, timeout_s=1800)
    except RuntimeError as error:
        if OverBudget.__name__ in str(error):
            print("over", file=sys.stderr, flush=True)
            return None
        raise
    cell = {
        "peak_bytes": max(r["peak_bytes"] for r in ranks),
        "step_s": round(max(r["step_s"] for r in ranks), 2),
    }
    print(f"{cell['peak_bytes'] / MIB:.0f} MiB, {cell['step_s']} s", file=sys.stderr, flush=True)
    return cell


def longest_fitting(
    cp: int, budget: int, fits: int | None, fails: int | None, resolution: int
) -> int:
    """The longest multiple of :data:`GRAIN` one step at ``cp`` fits in ``budget``, from a
    length known to fit and one known not to (None: halve or double until there is one),
    bisected until the two are ``resolution`` tokens apart."""
    while fits is None or fails is None:
        probe = 2 * fits if fails is None else fails // 2
        if run_cell(cp, probe, budget) is None:
            fails = probe
        else:
            fits = probe
    while fails - fits > resolution:
        probe = (fits + fails) // 2 // GRAIN * GRAIN
        if run_cell(cp, probe, budget) is None:
            fails = probe
        else:
            fits = probe
    return fits


def measure_cp(cp: int, cap: int, budget: int, resolution: int) -> dict:
    """Every length's peak and step time at ``cp`` (those within ``cap``), and the longest
    sequence within ``budget``."""
    peak_bytes, step_s = {}, {}
    for length in LENGTHS:
        cell = run_cell(cp, length, cap)
        if cell is not None:  # a length that does not fit is left out
            peak_bytes[str(length)], step_s[str(length)] = cell["peak_bytes"], cell["step_s"]
    fit = [n for n in LENGTHS if str(n) in peak_bytes and peak_bytes[str(n)] <= budget]
    fails = [n for n in LENGTHS if n > max(fit, default=0)]  # over the budget or the cap
    fits = max(fit, default=None)
    max_tokens = longest_fitting(cp, budget, fits, min(fails, default=None), resolution)
    return {"peak_bytes": peak_bytes, "max_tokens": max_tokens, "step_s": step_s}


def report(results: dict[str, dict], budget: int) -> list[str]:
    """The table: each cp's peak per length as a ratio of cp 1's, its longest sequence."""
    base = results.get("1")
    lines = [f"{'cp':>3} {'length':>7} {'peak MiB':>9} {'x cp1':>6} {'step s':>7}"]
    for cp, cell in results.items():
        for length, peak in cell["peak_bytes"].items():
            ratio = ""
            if base and length in base["peak_bytes"]:
                ratio = f"{peak / base['peak_bytes'][length]:.2f}"
            step = cell["step_s"][length]
            lines.append(f"{cp:>3} {length:>7} {peak / MIB:>9.0f} {ratio:>6} {step:>7.2f}")
    lines.append(f"longest sequence in {budget // MIB} MiB per rank:")
    for cp, cell in results.items():
        grows = f" ({cell['max_tokens'] / base['max_tokens']:.2f}x cp 1)" if base else ""
        lines.append(f"  cp {cp}: {cell['max_tokens']} tokens{grows}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT")
    parser.add_argument("--cp", default="1,2,4", help="comma list of context-parallel sizes")
    parser.add_argument(
        "--budget-mib", type=int, default=512, help="one rank's activation budget (max_tokens)"
    )
    parser.add_argument(
        "--cap-mib",
        type=int,
        default=6144,
        help="what one rank may take here: a length whose peak passes it is left out",
    )
    parser.add_argument(
        "--resolution", type=int, default=256, help="tokens the max_tokens search stops at"
    )
    opts = parser.parse_args()
    print(machine("torch threads per rank: cores / cp"), flush=True)
    started = time.perf_counter()
    results = {}
    for cp in (int(c) for c in opts.cp.split(",")):
        cell = measure_cp(cp, opts.cap_mib * MIB, opts.budget_mib * MIB, opts.resolution)
        results[str(cp)] = cell
        print(f"cp {cp}: {cell}", flush=True)
    print("\n".join(report(results, opts.budget_mib * MIB)))
    print(f"{time.perf_counter() - started:.0f} s in all")
    if opts.json:
        Path(opts.json).write_text(json.dumps({"cp": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
