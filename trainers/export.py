"""``mindrl-export CHECKPOINT OUT_DIR [--role critic] [--adapter]``: a saved checkpoint as
an HF folder, or a LoRA checkpoint's adapters as a PEFT adapter folder.

A checkpoint holds the weights as canonical Megatron tensors, whatever TP / PP / EP / DP
layout saved them, and the architecture (``backends/megatron/checkpoint.py``), so any
checkpoint exports, in one process, without Ray or a process group. The export streams:
each HF tensor is made from the checkpoint's boxes of the Megatron tensor(s) it comes
from, written, and dropped before the next is read, into safetensors shards of at most
``--max-shard-size`` with ``model.safetensors.index.json``; memory holds one tensor (the
largest, the embedding, sets it). The policy becomes ``<Family>ForCausalLM``; the critic
(value head) ``<Family>ForTokenClassification`` with one label, its ``score`` the value
head. ``--tokenizer SPEC`` (a ``model.tokenizer`` value) adds that tokenizer's files.

A LoRA checkpoint holds the adapters and names its frozen base: the run's ``base/``
folder (a random init) or the HF folder / GGUF package the run loaded, which the export
reads (whole, into memory) to merge the adapters in. ``--adapter`` writes the adapters
instead, as PEFT saves them (``adapter_config.json`` + ``adapter_model.safetensors``),
naming their base: its HF folder, or where it has none (random init, GGUF) the base
written as one (``--base-out``, default ``hf_base`` beside ``OUT_DIR``).

Exit codes: 0 written, 2 a missing or corrupt checkpoint, a missing tokenizer or a bad
shard size (one line naming it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections import ChainMap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from backends.megatron import GPTSpec, checkpoint
from backends.megatron.families import get_family
from backends.megatron.hf_io import (
    DEFAULT_MAX_SHARD_BYTES,
    hf_state_and_config,
    load_gguf_model,
    load_hf_folder,
    write_hf_folder,
)
from backends.megatron.layouts import VOCAB_PARAMS
from backends.megatron.lora import MergedWeights, is_adapter_name
from mindrl.data import load_tokenizer
from mindrl.data.tokenizer import BUILTIN_PREFIX
from mindrl.workers.model_setup import hf_config_for


def export_checkpoint(
    path: str | Path,
    out_dir: str | Path,
    role: str = "actor",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """Write the HF folder (``config.json``, safetensors shards and their index) of a
    checkpoint, one tensor at a time.

    Args:
        path: a run's checkpoints folder (``role``'s latest), a role's folder (its latest)
            or one step folder.
        out_dir: the HF folder to write (created).
        max_shard_bytes: the largest shard file (a larger tensor gets one of its own).

    Raises:
        CheckpointError: nothing to export there, or a corrupt checkpoint.
    """
    saved = checkpoint.open_checkpoint(path, role)
    spec = GPTSpec.from_dict(saved.meta["spec"])
    value_head = saved.meta["value_head"]
    shapes, weights = saved.weights(meta=True), saved.weights()
    lora = saved.meta.get("lora")
    if lora is not None:  # the policy is the base with the adapters merged in
        base_shapes, base = base_weights(saved, spec)
        shapes = ChainMap(shapes, base_shapes)
        shapes = {name: t for name, t in shapes.items() if not is_adapter_name(name)}
        weights = MergedWeights(ChainMap(weights, base), lora["alpha"] / lora["rank"])
    return write_weights(shapes, weights, spec, out_dir, value_head, max_shard_bytes)


def write_weights(
    shapes: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    spec: GPTSpec,
    out_dir: str | Path,
    value_head: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """Full canonical ``weights`` as an HF folder, one tensor at a time; ``shapes``: the
    same names as tensors whose shape and dtype are read without their bytes."""
    # Shapes and dtypes first: the shards are laid out before the first tensor is written.
    entries = [(name, tuple(t.shape), t.dtype) for name, t in hf_tensors(shapes, spec, value_head)]
    tensors = (t for _, t in hf_tensors(weights, spec, value_head))
    write_hf_folder(entries, tensors, hf_config(spec, value_head), out_dir, max_shard_bytes)
    return Path(out_dir)


def base_weights(
    saved: checkpoint.Checkpoint, spec: GPTSpec
) -> tuple[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]]:
    """A LoRA step's frozen base as full canonical weights, as (meta tensors, tensors):
    read on access from the run's ``base/``, or loaded whole from the HF folder / GGUF
    package it names as its origin.

    Raises:
        CheckpointError: that base cannot be read.
    """
    stored = saved.base_weights()
    if stored is not None:
        return saved.base_weights(meta=True), stored
    origin = saved.meta.get("base") or {}
    try:
        if origin.get("hf_path"):
            hf, _ = load_hf_folder(origin["hf_path"])
        elif origin.get("gguf_package"):
            hf, _ = hf_state_and_config(load_gguf_model(origin["gguf_package"]))
        else:
            raise FileNotFoundError("it names neither an HF folder nor a GGUF package")
    except (OSError, ValueError) as exc:
        raise checkpoint.CheckpointError(
            f"checkpoint {saved.dir} holds adapters trained on base {origin}, which cannot "
            f"be read ({exc}); the export needs that base"
        ) from None
    full = get_family(spec.family).hf_to_megatron(hf, spec)
    # As a checkpoint stores them: the model's dtype, the vocabulary rows unpadded.
    base = {
        name: (w[: spec.vocab_size] if name in VOCAB_PARAMS else w).to(spec.torch_dtype)
        for name, w in full.items()
    }
    return base, base


#: PEFT's file names in an adapter folder.
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
BASE_OUT = "hf_base"  # the base as an HF folder, beside the adapter folder, by default


def export_adapter(
    path: str | Path,
    out_dir: str | Path,
    base_out: str | Path | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    role: str = "actor",
) -> Path:
    """Write a LoRA checkpoint's adapters as a PEFT adapter folder: ``adapter_config.json``
    and ``adapter_model.safetensors`` (``base_model.model.<HF module>.lora_A.weight`` /
    ``lora_B``), loadable with ``peft.PeftModel.from_pretrained`` onto the base it names.
    PEFT scales by ``lora_alpha / r`` as the engine does, so base + adapters there is the
    merged export. The base named is the HF folder the run loaded; where there is none (a
    random init, a GGUF package) the base is written as one into ``base_out`` (default:
    ``hf_base`` beside ``out_dir``).

    Raises:
        CheckpointError: a missing or corrupt checkpoint, one of full weights, or a base
            that cannot be read.
    """
    saved = checkpoint.open_checkpoint(path, role)
    lora = saved.meta.get("lora")
    if lora is None:
        raise checkpoint.CheckpointError(
            f"checkpoint {saved.dir} holds full weights, no LoRA adapters: export it "
            "without --adapter"
        )
    spec = GPTSpec.from_dict(saved.meta["spec"])
    out_dir = Path(out_dir)
    base = _base_folder(saved, spec, out_dir, base_out, max_shard_bytes)
    stored = saved.weights()
    adapters = {name: stored[name] for name in stored if is_adapter_name(name)}
    tensors = {}
    for module, (a, b) in get_family(spec.family).lora_to_hf(adapters, spec).items():
        # Fused linears share one A: each key gets its own copy (safetensors stores no alias).
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.clone().contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.clone().contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    modules = sorted({name.split(".")[-3] for name in tensors})
    config = adapter_config(lora, modules, base)
    (out_dir / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def adapter_config(lora: dict[str, Any], modules: list[str], base: str) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` of adapters ``lora`` (a checkpoint's ``meta["lora"]``)
    on the HF linears named ``modules`` (leaf names) of the model at ``base``."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora["rank"],
        "lora_alpha": lora["alpha"],
        "lora_dropout": lora["dropout"],
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }


def _base_folder(
    saved: checkpoint.Checkpoint,
    spec: GPTSpec,
    out_dir: Path,
    base_out: str | Path | None,
    max_shard_bytes: int,
) -> str:
    """The HF folder of a LoRA step's base: the one the run loaded, or the base written
    as one (a random init, a GGUF package)."""
    hf_path = (saved.meta.get("base") or {}).get("hf_path")
    if hf_path:
        return str(Path(hf_path).resolve())
    folder = Path(base_out) if base_out is not None else out_dir.parent / BASE_OUT
    shapes, base = base_weights(saved, spec)
    write_weights(shapes, base, spec, folder, max_shard_bytes=max_shard_bytes)
    return str(folder.resolve())


def write_tokenizer(spec: str, out_dir: str | Path) -> bool:
    """The files of tokenizer ``spec`` (a ``model.tokenizer`` value) into ``out_dir`` when
    it came from an HF folder or a GGUF file (converted to ``tokenizer.json``), loadable
    from ``out_dir`` (by its own class where transformers 5 would swap it by the model
    type: qwen2); the built-in one is made in code and writes nothing (False).

    Raises:
        ValueError: a tokenizer folder or GGUF package that is not there.
    """
    if spec.startswith(BUILTIN_PREFIX):
        return False
    load_tokenizer(spec).save_pretrained(out_dir)
    return True


def hf_tensors(
    full: Mapping[str, torch.Tensor], spec: GPTSpec, value_head: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """The HF tensors of full canonical weights, in order, each made when its turn comes
    (``full`` may read them on access)."""
    family = get_family(spec.family)
    if not value_head:
        yield from family.iter_hf(full, spec)
        return
    # The critic: the backbone without an LM head, and the value head as a 1-label score.
    yield from family.iter_hf(full, dataclasses.replace(spec, tie_word_embeddings=True))
    head = full["output_layer.weight"]
    yield "score.weight", head
    # transformers' score layer has a bias; the value head has none, so it is zero.
    yield "score.bias", head.new_zeros(head.shape[0])


def hf_config(spec: GPTSpec, value_head: bool = False) -> dict:
    """``config.json`` of the policy (``<Family>ForCausalLM``) or the critic."""
    config = hf_config_for(spec)
    if not value_head:
        return config
    architecture = config["architectures"][0].replace("ForCausalLM", "ForTokenClassification")
    return config | {
        "architectures": [architecture],
        "id2label": {"0": "value"},
        "label2id": {"value": 0},
        "tie_word_embeddings": False,
    }


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """``"5GB"``, ``"500MiB"``, ``"1000000"`` -> bytes (transformers' spelling of sizes).

    Raises:
        ValueError: not a size.
    """
    match = _SIZE.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"--max-shard-size {text!r} is not a size such as 5GB or 500MiB")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "b").lower()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mindrl-export",
        description="Write a mindrl checkpoint as an HF model folder, or a LoRA checkpoint's "
        "adapters as a PEFT adapter folder.",
    )
    parser.add_argument(
        "checkpoint",
        help="A run's checkpoints folder (its latest), a role's folder or one step folder.",
    )
    parser.add_argument("out_dir", help="HF folder (or with --adapter, PEFT folder) to write.")
    parser.add_argument("--role", default="actor", choices=["actor", "critic"])
    parser.add_argument(
        "--max-shard-size",
        help="Largest safetensors shard, e.g. 500MiB (default 5GB, as transformers).",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="SPEC",
        help="Also write this tokenizer's files (the run's model.tokenizer: an HF folder or "
        "gguf:<package>).",
    )
    parser.add_argument(
        "--adapter",
        action="store_true",
        help="LoRA checkpoints: write the adapters as a PEFT adapter folder (adapter_config."
        "json + adapter_model.safetensors) instead of the merged model.",
    )
    parser.add_argument(
        "--base-out",
        metavar="DIR",
        help=f"With --adapter, where a base that has no HF folder of its own (random init, "
        f"GGUF) is written as one, which the adapter names (default: {BASE_OUT} beside "
        "OUT_DIR).",
    )
    args = parser.parse_args(argv)
    try:
        max_shard = parse_size(args.max_shard_size) if args.max_shard_size else None
        max_shard = max_shard or DEFAULT_MAX_SHARD_BYTES
        if args.adapter:
            out = export_adapter(args.checkpoint, args.out_dir, args.base_out, max_shard, args.role)
        else:
            out = export_checkpoint(args.checkpoint, args.out_dir, args.role, max_shard)
        if args.tokenizer:
            write_tokenizer(args.tokenizer, out)
    except ValueError as exc:  # a CheckpointError, a tokenizer that is not there, a size
        print(f"mindrl-export: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
