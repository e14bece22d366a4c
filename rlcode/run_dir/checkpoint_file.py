"""A checkpoint on disk: one ``.ckpt`` file (DDP, one device), or a folder of shards (FSDP: torch
distributed checkpoint, every rank's slice, with Lightning's ``meta.pt`` beside them holding
everything but weights and optimizer states). Both are read here, so the rest of rlcode takes a
checkpoint path without asking which it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

METADATA_FILENAME = "meta.pt"  # Lightning's name for the non-tensor part of a sharded checkpoint


def is_sharded_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / METADATA_FILENAME).is_file()


def checkpoint_metadata(path: str | Path) -> dict[str, Any]:
    """The checkpoint's step, hyperparameters, loops and callbacks' states, without its tensors' data
    (a file is memory-mapped; a sharded folder's ``meta.pt`` holds no weights)."""
    path = Path(path)
    if is_sharded_checkpoint(path):
        return torch.load(path / METADATA_FILENAME, map_location="cpu", weights_only=False)
    return torch.load(path, map_location="cpu", mmap=True, weights_only=False)


def load_whole_checkpoint(path: str | Path) -> dict[str, Any]:
    """The whole checkpoint in one process, as a single-device run writes it: a sharded folder's
    shards joined into full tensors (it must fit in CPU memory)."""
    path = Path(path)
    if is_sharded_checkpoint(path):
        from lightning.fabric.utilities.load import _load_distributed_checkpoint

        return _load_distributed_checkpoint(path)
    # Not weights_only: the hyperparameters hold rlcode's settings objects (LoraSettings, ...).
    return torch.load(path, map_location="cpu", weights_only=False)


# joined file -> the sharded folder it was joined from: what a report names, and where its run is
_JOINED_FROM: dict[Path, Path] = {}


def joined_checkpoint_file(path: str | Path, folder: str | Path) -> Path:
    """A sharded checkpoint written again as one file in ``folder`` (what a run without FSDP reads)."""
    joined = Path(folder) / f"{Path(path).name}.joined"
    torch.save(load_whole_checkpoint(path), joined)
    _JOINED_FROM[joined.resolve()] = Path(path)
    return joined


def original_checkpoint(path: str | Path) -> Path:
    """The checkpoint the user named: the sharded folder a temporary joined file came from, else ``path``."""
    return _JOINED_FROM.get(Path(path).resolve(), Path(path))


def checkpoint_run_directory(path: str | Path) -> Path | None:
    """The run a checkpoint belongs to (``<run>/checkpoints/<name>``), or None for one outside a run."""
    path = original_checkpoint(path)
    return path.parent.parent if path.parent.name == "checkpoints" else None
