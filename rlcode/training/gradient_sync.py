"""Gradients under DDP: when they cross ranks, and how their norm is clipped."""

from __future__ import annotations

from contextlib import nullcontext


def no_gradient_sync(strategy):
    """Accumulate gradients locally (DDP's ``no_sync``); strategies without a sync: nothing to block."""
    from lightning.pytorch.strategies import ParallelStrategy

    return strategy.block_backward_sync() if isinstance(strategy, ParallelStrategy) else nullcontext()


def clip_grad_norm(parameters, max_norm: float) -> float:
    """Clip to ``max_norm`` and return the norm before clipping.

    Under DDP every rank holds the whole all-reduced gradient, so the local norm is the global one
    (FSDP, which shards gradients, is refused by ``Learner.setup``).
    """
    import torch

    return float(torch.nn.utils.clip_grad_norm_([p for p in parameters if p.grad is not None], max_norm))
