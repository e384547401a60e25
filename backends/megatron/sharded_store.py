"""Sharded tensors on disk: ``torch.distributed.checkpoint`` plans, safetensors + JSON store.

A checkpoint's tensors are canonical full tensors (``model/<name>``, ``optim/...``) that no
rank holds whole. Each rank offers DCP the boxes it holds (:class:`Pieces`: offsets in the
full tensor + a tensor, usually a view of a live parameter); DCP's planner drops boxes
offered twice (each written by one rank, balanced by bytes), checks that the saved boxes
tile every tensor exactly, and on load intersects the boxes a rank wants with the saved
ones, so a rank reads only the byte ranges it needs, whatever layout wrote them.

The storage layer under DCP's planner is this module's, for two reasons:

* DCP's ``FileSystemReader`` unpickles its ``.metadata`` file with plain ``pickle``
  (``filesystem.py``: ``pickle.load``), so a tampered checkpoint could run code when it
  is opened. Here the global index is JSON and the tensors safetensors: loading parses,
  it never unpickles. (Megatron-core's ``dist_checkpointing`` stores that same pickled
  format, plus a ``common.pt``; its save also calls ``torch.cuda.synchronize``, and its
  distributed optimizer state asserts one shared Adam step, which torch AdamW does not
  keep: neither runs on the CPU here.)
* DCP's own safetensors writer (``HuggingFaceStorageWriter``) keeps one box per tensor
  name in a file, but a rank holds several boxes of one tensor: the fused SwiGLU
  ``[gate; up]`` pieces of its TP shard, the rows a distributed optimizer's DP range
  covers.

Layout of ``folder`` (a step folder's ``shards/``)::

    index.json                 tensor -> shape, dtype, boxes [{offsets, sizes, file, key}]
    rank_00003.safetensors     the boxes rank 3 wrote, keyed "<tensor>@<offsets>"

Files are written tensor by tensor from the tensors themselves (:func:`write_safetensors`):
a rank's extra memory while saving is one tensor's bytes at most, not its whole shard.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.distributed.checkpoint import StorageReader, StorageWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

INDEX = "index.json"

#: torch dtype <-> safetensors' dtype names (the file format's own table).
_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}


# ---- safetensors, written tensor by tensor --------------------------------------------------
def write_safetensors(
    path: Path,
    entries: list[tuple[str, tuple[int, ...], torch.dtype]],
    tensors: Iterable[torch.Tensor],
    metadata: dict[str, str] | None = None,
) -> int:
    """Write a safetensors file whose header lists ``entries`` (name, shape, dtype), then the
    bytes of ``tensors`` (one per entry, in order), each as it comes; returns the file size.

    ``safetensors.torch.save_file`` turns every tensor into a bytes object before it writes
    anything (the whole file in memory twice); this holds one tensor at a time, so a
    generator can produce them. Written to ``path.tmp`` and renamed: a crash leaves no
    half file under the final name.
    """
    header: dict[str, Any] = {"__metadata__": metadata or {}}
    offset = 0
    for name, shape, dtype in entries:
        size = math.prod(shape) * dtype.itemsize
        header[name] = {
            "dtype": _DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        written = 0
        for (name, shape, dtype), tensor in zip(entries, tensors, strict=True):
            if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
                raise ValueError(
                    f"{path}: '{name}' is {tuple(tensor.shape)} {tensor.dtype}, "
                    f"the header says {tuple(shape)} {dtype}"
                )
            written += _write_tensor(out, tensor)
    if written != offset:
        raise OSError(f"{path}: wrote {written} tensor bytes of {offset}")
    os.replace(tmp, path)
    return 8 + len(raw) + offset


def _write_tensor(out, tensor: torch.Tensor) -> int:
    """Write the tensor's bytes, without a copy where it is contiguous on the host.

    Through ctypes, not numpy: a storage once handed to numpy can no longer be resized,
    and allgather-swap frees the training tensors it writes from with ``resize_(0)``.
    """
    flat = tensor.detach().cpu().contiguous()
    nbytes = flat.numel() * flat.element_size()
    if nbytes == 0:
        return 0
    return out.write(memoryview((ctypes.c_char * nbytes).from_address(flat.data_ptr())))


def box(offsets, sizes) -> tuple[slice, ...]:
    """The index of the box at ``offsets`` of ``sizes`` (``tensor[box(...)]``)."""
    return tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))


# ---- the boxes a rank holds -----------------------------------------------------------------
class Pieces:
    """This rank's boxes of one full tensor of ``shape``: ``{offsets: tensor}``.

    Implements DCP's checkpointable protocol (``__create_write_items__``,
    ``__create_chunk_list__``, ``__get_tensor_shard__``), so DCP plans it like a DTensor;
    a box may be any strided view (a parameter's TP piece, a row range of a flat buffer).
    """

    def __init__(self, shape: Iterable[int], boxes: dict[tuple[int, ...], torch.Tensor]) -> None:
        self.shape = torch.Size(shape)
        self.boxes = boxes

    def size(self) -> torch.Size:  # DCP compares it with the saved size on load
        return self.shape

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size(offsets)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(torch.Size(offsets), box.shape),
                    properties=TensorProperties(dtype=box.dtype),
                    size=self.shape,
                ),
            )
            for offsets, box in self.boxes.items()
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [
            ChunkStorageMetadata(torch.Size(offsets), box.shape)
            for offsets, box in self.boxes.items()
        ]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        return self.boxes[tuple(index.offset)]

    def host_copy(self) -> Pieces:
        """The same boxes copied to host memory (what a background save writes from)."""
        return Pieces(
            self.shape, {o: b.detach().to("cpu", copy=True) for o, b in self.boxes.items()}
        )

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.boxes.values())


class SavePiecesPlanner(DefaultSavePlanner):
    """DCP's default planner (dedup, validation) over a flat dict of :class:`Pieces`."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def lookup_object(self, index: MetadataIndex) -> Any:
        return self.state_dict[index.fqn].__get_tensor_shard__(index)


class LoadPiecesPlanner(DefaultLoadPlanner):
    """DCP's default load planner over :class:`Pieces`; a tensor the checkpoint does not hold
    is skipped and named in :attr:`missing` (the caller decides if that is an error)."""

    def __init__(self) -> None:
        super().__init__(
            flatten_state_dict=False, flatten_sharded_tensors=False, allow_partial_load=True
        )
        self.missing: list[str] = []

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        metadata: Metadata | None = None,
        is_coordinator: bool = False,
    ) -> None:
        # The default first walks the dict to allocate meta-device tensors
        # (planner_helpers._init_state_dict), replacing every leaf that is not a tensor
        # with None; Pieces are never on the meta device, so nothing is to be done.
        self.original_state_dict = self.state_dict = state_dict
        self.metadata = metadata
        self.is_coordinator = is_coordinator

    def create_local_plan(self) -> LoadPlan:
        held = self.metadata.state_dict_metadata
        self.missing = sorted(fqn for fqn in self.state_dict if fqn not in held)
        return super().create_local_plan()

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.state_dict[index.fqn].__get_tensor_shard__(index)


# ---- storage: one safetensors file per rank, a JSON index -----------------------------------
def _key(index: MetadataIndex) -> str:
    return f"{index.fqn}@{','.join(map(str, index.offset))}"


class PiecesWriter(StorageWriter):
    """Each rank writes the boxes DCP's global plan gave it into ``rank_<r>.safetensors``;
    the coordinator then writes ``index.json`` from every rank's results."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [
            dataclasses.replace(plan, storage_data=f"rank_{rank:05d}.safetensors")
            for rank, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        items = [item for item in plan.items if item.type == WriteItemType.SHARD]
        if len(items) != len(plan.items):  # nothing here offers DCP non-tensor objects
            raise TypeError("a sharded checkpoint holds tensors only")
        results = []
        if items:
            entries = [
                (_key(i.index), tuple(i.tensor_data.chunk.sizes), i.tensor_data.properties.dtype)
                for i in items
            ]
            tensors = (planner.resolve_data(item) for item in items)
            write_safetensors(self.folder / plan.storage_data, entries, tensors)
            results = [
                WriteResult(
                    index=item.index,
                    size_in_bytes=item.tensor_storage_size(),
                    storage_data={
                        "file": plan.storage_data,
                        "key": _key(item.index),
                        "sizes": list(item.tensor_data.chunk.sizes),
                    },
                )
                for item in items
            ]
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        index: dict[str, Any] = {
            fqn: {"shape": list(md.size), "dtype": _DTYPES[md.properties.dtype], "boxes": []}
            for fqn, md in metadata.state_dict_metadata.items()
        }
        for rank_results in results:
            for result in rank_results:
                box = {"offsets": list(result.index.offset), **result.storage_data}
                index[result.index.fqn]["boxes"].append(box)
        tmp = self.folder / (INDEX + ".tmp")
        tmp.write_text(json.dumps(index, separators=(",", ":")))
        os.replace(tmp, self.folder / INDEX)

    def storage_meta(self) -> None:
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True


def read_index(folder: str | Path) -> dict[str, Any]:
    """``index.json`` of a sharded folder (JSON only)."""
    return json.loads((Path(folder) / INDEX).read_text())


class PiecesReader(StorageReader):
    """Reads a :class:`PiecesWriter` folder: metadata from ``index.json``, tensors by
    safetensors slices (only the bytes of each requested box)."""

    def __init__(self, folder: str | Path, index: dict[str, Any] | None = None) -> None:
        self.folder = Path(folder)
        self.index = index
        self.where: dict[MetadataIndex, tuple[str, str, list[int]]] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        index = self.index if self.index is not None else read_index(self.folder)
        tensors: dict[str, Any] = {}
        where: dict[MetadataIndex, tuple[str, str, list[int]]] = {}
        for fqn, entry in index.items():
            chunks = []
            for box in entry["boxes"]:
                offsets = torch.Size(box["offsets"])
                chunks.append(ChunkStorageMetadata(offsets, torch.Size(box["sizes"])))
                where[MetadataIndex(fqn, offsets)] = (box["file"], box["key"], box["sizes"])
            tensors[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_TORCH_DTYPES[entry["dtype"]]),
                size=torch.Size(entry["shape"]),
                chunks=chunks,
            )
        return Metadata(state_dict_metadata=tensors, storage_data=where)

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.where = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_file: dict[str, list] = {}
        for item in plan.items:
            by_file.setdefault(self.where[item.storage_index][0], []).append(item)
        for file, items in by_file.items():
            with safe_open(str(self.folder / file), framework="pt") as handle:
                for item in items:
                    _, key, sizes = self.where[item.storage_index]
                    data = _read_box(handle, key, sizes, item.storage_offsets, item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    target.copy_(data)
                    planner.commit_tensor(item, target)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True


def _read_box(handle, key: str, sizes, offsets, lengths) -> torch.Tensor:
    """The part of stored box ``key`` at ``offsets`` / ``lengths`` (only those bytes)."""
    if list(lengths) == list(sizes):  # the whole box (also 0-d tensors)
        return handle.get_tensor(key)
    return handle.get_slice(key)[box(offsets, lengths)]


# ---- whole tensors, one at a time (export, tests) -------------------------------------------
class FullTensors(Mapping):
    """The full tensors under ``prefix`` in a sharded folder, read on access, one at a time.

    A read mapping for code written against a dict of full tensors (the HF conversion):
    ``tensors[name]`` assembles that one tensor from its boxes. ``meta=True`` gives meta
    tensors instead (shapes and dtypes, no bytes read).
    """

    def __init__(self, folder: str | Path, prefix: str, meta: bool = False) -> None:
        self.folder = Path(folder)
        self.prefix = prefix
        self.meta = meta
        self.entries = {
            fqn.removeprefix(prefix): entry
            for fqn, entry in read_index(folder).items()
            if fqn.startswith(prefix)
        }

    def __getitem__(self, name: str) -> torch.Tensor:
        entry = self.entries[name]
        dtype = _TORCH_DTYPES[entry["dtype"]]
        if self.meta:
            return torch.empty(entry["shape"], dtype=dtype, device="meta")
        full = torch.empty(entry["shape"], dtype=dtype)
        for stored in entry["boxes"]:
            with safe_open(str(self.folder / stored["file"]), framework="pt") as handle:
                full[box(stored["offsets"], stored["sizes"])] = handle.get_tensor(stored["key"])
        return full

    def __contains__(self, name: object) -> bool:  # Mapping's default would read it
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


class FileTensors(Mapping):
    """The tensors of one safetensors file, read on access (``meta=True``: meta tensors)."""

    def __init__(self, file: str | Path, meta: bool = False) -> None:
        self.file = str(file)
        self.meta = meta
        with safe_open(self.file, framework="pt") as handle:
            self.names = list(handle.keys())

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise KeyError(name)
        with safe_open(self.file, framework="pt") as handle:
            if not self.meta:
                return handle.get_tensor(name)
            stored = handle.get_slice(name)
            dtype = _TORCH_DTYPES[stored.get_dtype()]
            return torch.empty(stored.get_shape(), dtype=dtype, device="meta")

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
