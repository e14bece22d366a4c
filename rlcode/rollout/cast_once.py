"""Generation under mixed precision casts each weight once per call, not once per token.

Lightning's AMP plugin enters ``torch.autocast(..., cache_enabled=False)`` around the training step,
and rollouts run inside it with fp32 master weights: every decode step would cast every weight to
the compute dtype again (a 1.5B model: ~3 GB of bf16 copies written per token, 128 times a
rollout). Inside ``weights_cast_once`` autocast keeps its cast of each weight for the whole call
(autocast's weight cache, which holds casts of leaf tensors that require grad), and the copies are
dropped when the call ends, so none is alive during the update that follows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def weights_cast_once(device_type: str) -> Iterator[None]:
    """Autocast's weight cache on for the block when autocast is on; cleared after it."""
    if not torch.is_autocast_enabled(device_type):
        yield
        return
    with torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type), cache_enabled=True):
        try:
            yield
        finally:
            torch.clear_autocast_cache()
