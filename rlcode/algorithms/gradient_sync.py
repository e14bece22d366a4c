"""Gradients under each Lightning strategy: when they cross ranks, and how their norm is clipped."""

from __future__ import annotations

from contextlib import nullcontext


def no_gradient_sync(strategy):
    """Accumulate gradients locally (DDP's ``no_sync``); strategies without a sync: nothing to block."""
    from lightning.pytorch.strategies import ParallelStrategy

    return strategy.block_backward_sync() if isinstance(strategy, ParallelStrategy) else nullcontext()


def clip_grad_norm(strategy, parameters, max_norm: float) -> float:
    """Clip to ``max_norm`` and return the norm before clipping.

    FSDP shards gradients, so only its own ``clip_grad_norm_`` sees the global norm.
    """
    import torch
    from lightning.pytorch.strategies import FSDPStrategy

    if isinstance(strategy, FSDPStrategy):
        return float(strategy.model.clip_grad_norm_(max_norm))
    return float(torch.nn.utils.clip_grad_norm_([p for p in parameters if p.grad is not None], max_norm))
