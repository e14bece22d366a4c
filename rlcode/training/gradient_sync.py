"""Gradients across ranks: when they cross (DDP), and how their norm is clipped (DDP and FSDP)."""

from __future__ import annotations

from contextlib import nullcontext


def no_gradient_sync(strategy):
    """Accumulate gradients locally (DDP's ``no_sync``); strategies without a sync: nothing to block.
    Under FSDP every pass reduce-scatters its gradients (``rlcode.training.policy_update``): nothing is
    blocked there."""
    from lightning.pytorch.strategies import DDPStrategy

    return strategy.block_backward_sync() if isinstance(strategy, DDPStrategy) else nullcontext()


def clip_grad_norm(parameters, max_norm: float) -> float:
    """Clip to ``max_norm`` and return the norm before clipping.

    Under DDP every rank holds the whole all-reduced gradient, so the local norm is the global one.
    Under FSDP the gradients are shards (DTensors): torch computes the norm over every rank's shard
    (a collective) and returns it as a DTensor, made whole here.
    """
    import torch

    norm = torch.nn.utils.clip_grad_norm_([p for p in parameters if p.grad is not None], max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
