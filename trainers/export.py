"""``mindrl-export CHECKPOINT OUT_DIR [--role critic]``: a saved checkpoint as an HF folder.

A checkpoint holds the weights as canonical Megatron tensors, whatever TP / PP / EP / DP
layout saved them, and the architecture (``backends/megatron/checkpoint.py``), so any
checkpoint exports, in one process, without Ray or a process group. The export streams:
each HF tensor is made from the checkpoint's boxes of the Megatron tensor(s) it comes
from, written, and dropped before the next is read, into safetensors shards of at most
``--max-shard-size`` with ``model.safetensors.index.json``; memory holds one tensor (the
largest, the embedding, sets it). The policy becomes ``<Family>ForCausalLM``; the critic
(value head) ``<Family>ForTokenClassification`` with one label, its ``score`` the value
head. ``--tokenizer SPEC`` (a ``model.tokenizer`` value) adds that tokenizer's files.

Exit codes: 0 written, 2 a missing or corrupt checkpoint, a missing tokenizer or a bad
shard size (one line naming it).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from backends.megatron import GPTSpec, checkpoint
from backends.megatron.families import get_family
from backends.megatron.hf_io import DEFAULT_MAX_SHARD_BYTES, write_hf_folder
from backends.megatron.lora import MergedWeights
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
    # Shapes and dtypes first, from meta tensors (no bytes read): the shards are laid out
    # before the first tensor is written.
    entries = [
        (name, tuple(t.shape), t.dtype)
        for name, t in hf_tensors(saved.weights(meta=True), spec, value_head)
    ]
    weights = saved.weights()
    lora = saved.meta.get("lora")
    if lora is not None:  # the policy is the base with the adapters merged in
        weights = MergedWeights(weights, lora["alpha"] / lora["rank"])
    tensors = (t for _, t in hf_tensors(weights, spec, value_head))
    write_hf_folder(entries, tensors, hf_config(spec, value_head), out_dir, max_shard_bytes)
    return Path(out_dir)


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
        prog="mindrl-export", description="Write a mindrl checkpoint as an HF model folder."
    )
    parser.add_argument(
        "checkpoint",
        help="A run's checkpoints folder (its latest), a role's folder or one step folder.",
    )
    parser.add_argument("out_dir", help="HF folder to write.")
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
    args = parser.parse_args(argv)
    try:
        max_shard = parse_size(args.max_shard_size) if args.max_shard_size else None
        out = export_checkpoint(
            args.checkpoint, args.out_dir, args.role, max_shard or DEFAULT_MAX_SHARD_BYTES
        )
        if args.tokenizer:
            write_tokenizer(args.tokenizer, out)
    except ValueError as exc:  # a CheckpointError, a tokenizer that is not there, a size
        print(f"mindrl-export: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
