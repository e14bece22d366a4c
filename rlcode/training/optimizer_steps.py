"""Optimizer steps under manual optimization, counted the way a user reads a run: one per batch.

Lightning's ``global_step`` counts ``LightningOptimizer.step()`` calls, and max_steps, checkpoints,
evals and the sampling seed all follow it. An RL step is one batch of rollouts, however many
optimizer updates it makes (``num_iterations``) and whether it makes any at all (a dry run, or no
group with signal). So:

- ``update(optimizer, counted=False)`` applies an update through the strategy (precision plugin
  with its GradScaler, ``on_before_optimizer_step`` for clipping) without counting it;
- ``count_step_without_update(optimizer)`` counts a step without touching the optimizer: under
  ``16-mixed`` the GradScaler refuses ``step()`` when no gradient was produced, and AdamW with
  weight decay would still move the weights.
"""

from __future__ import annotations


def update(optimizer, *, counted: bool) -> None:
    """One optimizer update (then zero the gradients); ``counted`` advances ``global_step``."""
    if counted:
        optimizer.step()
    else:
        optimizer._strategy.optimizer_step(optimizer.optimizer, closure=lambda: None)
    optimizer.zero_grad(set_to_none=True)


def count_step_without_update(optimizer) -> None:
    """Advance ``global_step`` by one; weights, moments and the loss scaler stay as they are."""
    optimizer.zero_grad(set_to_none=True)
    # The loop's progress hooks that LightningOptimizer.step() calls around the real step.
    optimizer._on_before_step()
    optimizer._on_after_step()
