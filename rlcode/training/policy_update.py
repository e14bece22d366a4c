"""The policy update of one RL step: ``num_iterations`` optimizer updates over the trained rows.

Shared by every mode that trains on sampled completions (GRPO today): rows are micro-batched, each
micro-batch's loss is its share of the step's loss (``LossTotals``), gradients are all-reduced once
per update under DDP, and one step is counted however many updates it makes.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

from rlcode.training.gradient_sync import no_gradient_sync
from rlcode.algorithms.importance_correction import corrected_advantages, truncated_importance_weights, weight_metrics
from rlcode.algorithms.losses import LossTotals, policy_loss
from rlcode.training.optimizer_steps import update
from rlcode.logprobs.sequence_logps import completion_logps

if TYPE_CHECKING:
    from rlcode.rollout.base import RolloutBatch


def update_policy(module, rollout: RolloutBatch, loss_mask, advantages, ref_logps, rows, totals: LossTotals
                  ) -> dict[str, float]:
    """``num_iterations`` optimizer updates over ``rows``, micro-batched; one counted step.

    ``module`` is the LightningModule (its policy, hparams, optimizer and trainer). The losses are normalised by the whole step's totals (every row, every rank: see
    ``rlcode.algorithms.losses``), so micro-batch size and rank count do not change the update.
    The first pass's log-probs, computed under the weights that sampled the rollouts, are the
    old log-probs of the later passes (no extra forward pass; its ratio is exactly 1).

    Under DDP, gradients are all-reduced once per optimizer update: every micro-batch but the
    last runs its backward in the strategy's ``block_backward_sync`` (DDP's ``no_sync``), which
    is also what lets ranks run different numbers of micro-batches. A rank with no row to train
    still joins the one sync with a zero-weighted backward of one completion; DDP averages
    gradients over ranks, so each rank's loss is scaled by the world size.
    """
    hp = module.hparams
    optimizer = module.optimizers()
    contributes = len(rows) > 0
    micro_batches = list(rows.split(hp.micro_batch_size)) if contributes else [torch.arange(1, device=module.device)]
    logps_dtype = torch.promote_types(next(module.policy.parameters()).dtype, torch.float32)  # completion_logps'
    old_logps = torch.zeros_like(loss_mask, dtype=logps_dtype) if hp.num_iterations > 1 else None
    # A sampler that is not the policy (vLLM): TRL's truncated importance weights of each token, from
    # the first pass's log-probs (the policy at sampling time) against the sampler's.
    cap = getattr(module.backend, "importance_sampling_cap", None)
    weights = torch.ones_like(loss_mask, dtype=torch.float32) \
        if rollout.sampling_logps is not None and cap is not None else None
    parts_sum: dict[str, Any] = {}
    for iteration in range(hp.num_iterations):
        for position, index in enumerate(micro_batches):
            logps = completion_logps(module.policy, rollout.prompt_ids[index], rollout.prompt_mask[index],
                                     rollout.completion_ids[index], rollout.completion_mask[index],
                                     hp.temperature, share_prefix=hp.share_prefix)
            if iteration == 0 and old_logps is not None:
                old_logps[index] = logps.detach()
            if iteration == 0 and weights is not None:
                weights[index] = truncated_importance_weights(logps, rollout.sampling_logps[index],
                                                              loss_mask[index], cap)
            row_advantages = advantages[index] if weights is None else \
                corrected_advantages(advantages[index], weights[index])  # [b] or [b, T]
            loss, parts = policy_loss(
                logps, row_advantages, loss_mask[index],
                None if iteration == 0 else old_logps[index],
                None if ref_logps is None else ref_logps[index],
                loss_type=hp.loss_type, epsilon_low=hp.epsilon_low, epsilon_high=hp.epsilon_high,
                beta=hp.beta, importance_sampling_level=hp.importance_sampling_level,
                max_completion_length=hp.max_new_tokens, totals=totals)
            last = position == len(micro_batches) - 1
            scale = module.trainer.world_size if contributes else 0.0  # 0: join the sync, move nothing
            with nullcontext() if last else no_gradient_sync(module.trainer.strategy):
                module.manual_backward(loss * scale)
            if contributes:
                _accumulate(parts_sum, {"loss": loss.detach(), **parts.as_dict()})
        update(optimizer, counted=iteration == hp.num_iterations - 1)
    module._weights_changed()
    if not contributes:
        return {}
    # Loss shares add up to the step's loss; the other parts are means over micro-batches.
    passes = hp.num_iterations
    parts = {key: float(value) / (passes if key in ("loss", "policy_loss") else passes * len(micro_batches))
             for key, value in parts_sum.items()}
    if weights is not None:
        parts.update(weight_metrics(weights[rows], loss_mask[rows], cap))
    return parts

def _accumulate(sums: dict[str, Any], parts: dict[str, Any]) -> None:
    """Add detached 0-d tensors on the device: no host sync per micro-batch."""
    for key, value in parts.items():
        sums[key] = sums[key] + value if key in sums else value
