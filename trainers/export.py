"""``mindrl-export CHECKPOINT OUT_DIR [--role critic]``: a saved checkpoint as an HF folder.

A checkpoint holds the full weights under canonical Megatron names and the architecture
(``backends/megatron/checkpoint.py``), so any checkpoint exports, whatever TP / PP / EP /
DP layout saved it. The policy becomes ``<Family>ForCausalLM``; the critic (value head)
``<Family>ForTokenClassification`` with one label, its ``score`` the value head.
``--tokenizer SPEC`` (a ``model.tokenizer`` value) adds that tokenizer's files.

Exit codes: 0 written, 2 a missing or corrupt checkpoint or a missing tokenizer (one line
naming it).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from backends.megatron import GPTSpec, checkpoint
from backends.megatron.families import get_family
from backends.megatron.hf_io import save_hf_folder
from mindrl.data import load_tokenizer
from mindrl.data.tokenizer import BUILTIN_PREFIX
from mindrl.workers.model_setup import hf_config_for


def export_checkpoint(path: str | Path, out_dir: str | Path, role: str = "actor") -> Path:
    """Write the HF folder (``config.json`` + ``model.safetensors``) of a checkpoint.

    Args:
        path: a run's checkpoints folder (``role``'s latest), a role's folder (its latest)
            or one step folder.
        out_dir: the HF folder to write (created).

    Raises:
        CheckpointError: nothing to export there, or a corrupt checkpoint.
    """
    saved = checkpoint.open_checkpoint(path, role)
    spec = GPTSpec.from_dict(saved.meta["spec"])
    state, config = hf_model(saved.load("model"), spec, value_head=saved.meta["value_head"])
    save_hf_folder(state, config, out_dir)
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


def hf_model(
    full: dict[str, torch.Tensor], spec: GPTSpec, value_head: bool = False
) -> tuple[dict[str, torch.Tensor], dict]:
    """HF state dict and ``config.json`` of full canonical weights."""
    family = get_family(spec.family)
    config = hf_config_for(spec)
    if not value_head:
        return family.megatron_to_hf(full, spec), config
    # The critic: the backbone without an LM head, and the value head as a 1-label score.
    backbone = family.megatron_to_hf(full, dataclasses.replace(spec, tie_word_embeddings=True))
    head = full["output_layer.weight"]
    # transformers' score layer has a bias; the value head has none, so it is zero.
    state = {**backbone, "score.weight": head, "score.bias": head.new_zeros(head.shape[0])}
    architecture = config["architectures"][0].replace("ForCausalLM", "ForTokenClassification")
    config |= {
        "architectures": [architecture],
        "id2label": {"0": "value"},
        "label2id": {"value": 0},
        "tie_word_embeddings": False,
    }
    return state, config


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
        "--tokenizer",
        metavar="SPEC",
        help="Also write this tokenizer's files (the run's model.tokenizer: an HF folder or "
        "gguf:<package>).",
    )
    args = parser.parse_args(argv)
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir, args.role)
        if args.tokenizer:
            write_tokenizer(args.tokenizer, out)
    except ValueError as exc:  # a CheckpointError, or a tokenizer that is not there
        print(f"mindrl-export: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
