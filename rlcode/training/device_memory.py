"""Per-step peak accelerator memory, and device-synchronised stage times.

CUDA runs kernels asynchronously: a host clock read around a stage measures when its kernels were
queued, not when they finished, so a later stage that waits on them (a ``.item()``, a host copy)
is charged their time. ``synchronized`` waits for the device at a stage's edges when CUDA is in use
(nothing on a CPU). The peak memory of a step is CUDA's own allocator statistics, reset at the
step's start: ``allocated`` is what tensors held, ``reserved`` what the caching allocator took from
the device (what another process could not use).
"""

from __future__ import annotations

import torch

GIB = 1024.0**3


def synchronized() -> None:
    """Wait for the queued CUDA work, if this process has used CUDA."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak for ``device`` (a CUDA device; nothing for others)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> dict[str, float]:
    """{"gpu_peak_allocated_gib", "gpu_peak_reserved_gib"} since the last reset; {} off CUDA."""
    if device.type != "cuda":
        return {}
    return {"gpu_peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
            "gpu_peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB}
