"""The policy update of one RL step: ``num_iterations`` optimizer updates over the trained rows.

Shared by every mode: rows are micro-batched, each micro-batch's loss is its share of the step's
loss (``LossTotals``), gradients are all-reduced once per update under DDP, and one step is counted
however many updates it makes. Everything it uses is passed in: the loss settings
(``UpdateSettings``) and the trainer's hooks (``TrainerHooks``: backward, no-sync, optimizer step).

Under FSDP (a sharded policy) every rank must run the same collectives in the same order: each
pass gathers every layer for its forward and its backward and reduce-scatters its gradients. Every
pass is one decoder call through every layer (packed or plain), so the ranks agree on the number of
passes before the update (one all-reduce) and a rank with fewer micro-batches runs zero-weighted
one-token passes up to it. Each layer is then gathered only while it runs and the gradients are
sharded after every micro-batch: no rank holds the whole model or a whole gradient.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable

import torch

from rlcode.algorithms.importance_correction import (corrected_advantages, log_ratios, truncated_importance_weights,
                                                     weight_metrics)
from rlcode.algorithms.losses import ImportanceSamplingLevel, LossTotals, LossType, policy_loss
from rlcode.logprobs.sequence_logps import completion_logps
from rlcode.models.sharding import is_sharded
from rlcode.stopping import Stopped
from rlcode.training.micro_batches import micro_batches as split_rows

if TYPE_CHECKING:
    from rlcode.rollout.base import RolloutBatch


@dataclass(frozen=True)
class UpdateSettings:
    """The loss and its micro-batching: the Learner's settings of the same names (``from_learner``),
    which carry their defaults, ranges and help."""

    loss_type: LossType
    beta: float
    epsilon_low: float
    epsilon_high: float
    importance_sampling_level: ImportanceSamplingLevel
    num_iterations: int
    micro_batch_size: int
    share_prefix: bool
    temperature: float
    max_new_tokens: int
    importance_sampling_cap: float | None = None
    """A sampler that is not the policy (vLLM, the int8 copy): TRL's cap of the truncated importance weights."""
    micro_batch_tokens: int | None = None
    """A micro-batch's token budget beside its ``micro_batch_size`` rows (``rlcode.training.micro_batches``)."""

    @classmethod
    def from_learner(cls, settings, importance_sampling_cap: float | None) -> UpdateSettings:
        """The fields from the Learner's settings (``hparams``) by name; the cap is the sampler's."""
        names = [field.name for field in fields(cls) if field.name != "importance_sampling_cap"]
        return cls(**{name: settings[name] for name in names}, importance_sampling_cap=importance_sampling_cap)


@dataclass(frozen=True)
class TrainerHooks:
    """What the update does through the trainer."""

    backward: Callable[[torch.Tensor], None]
    """Backward of a loss (``manual_backward``: precision plugin, DDP)."""
    no_sync: Callable[[], AbstractContextManager]
    """Accumulate gradients without the DDP all-reduce (``gradient_sync.no_gradient_sync``)."""
    step: Callable[[bool], None]
    """One optimizer update, then zero the gradients; True: count it as the step (``optimizer_steps.update``)."""
    world_size: int
    stop_agreed: Callable[[], bool] = lambda: False
    """Whether the ranks agreed to stop (``StopToken.agreed`` at ``StopPoint.BEFORE_MICRO_BATCH``): a
    collective, so it is asked at the same points on every rank."""
    count_range: Callable[[int], tuple[int, int]] = lambda count: (count, count)
    """The smallest and largest of a count over the ranks (one collective): of the micro-batch count,
    how many of them each rank may ask ``stop_agreed`` before (every rank asks it equally often), and
    under FSDP how many passes every rank runs."""


def update_policy(policy, hooks: TrainerHooks, settings: UpdateSettings, rollout: RolloutBatch, loss_mask,
                  advantages, ref_logps, rows, totals: LossTotals) -> dict[str, float]:
    """``num_iterations`` optimizer updates of ``policy`` over ``rows``, micro-batched; one counted step.
    ``rlcode.stopping.Stopped`` when the ranks agree to stop before the first optimizer step: nothing
    has changed but the gradients (which the caller clears), so the step can be given up and redone.

    The losses are normalised by the whole step's totals (every row, every rank: see
    ``rlcode.algorithms.losses``), so micro-batch size and rank count do not change the update.
    The first pass's log-probs, computed under the weights that sampled the rollouts, are the
    old log-probs of the later passes (no extra forward pass; its ratio is exactly 1).

    Under DDP, gradients are all-reduced once per optimizer update: every micro-batch but the
    last runs its backward in the strategy's ``block_backward_sync`` (DDP's ``no_sync``), which
    is also what lets ranks run different numbers of micro-batches. A rank with no row to train
    still joins the one sync with a zero-weighted backward of one completion (a one-token dummy when
    its rollout has no row at all: every game ended before the policy's first turn); DDP averages
    gradients over ranks, so each rank's loss is scaled by the world size.
    """
    hp = settings
    contributes = len(rows) > 0
    if rollout.completion_ids.size(0) == 0:  # nothing to run even a zero-weighted pass on
        rollout, loss_mask, advantages, ref_logps = _dummy_row(rollout, loss_mask)
    micro_batches = split_rows(rows, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_mask,
                               max_rows=hp.micro_batch_size, max_tokens=hp.micro_batch_tokens) \
        if contributes else [torch.arange(1, device=loss_mask.device)]
    logps_dtype = torch.promote_types(next(policy.parameters()).dtype, torch.float32)  # completion_logps'
    old_logps = torch.zeros_like(loss_mask, dtype=logps_dtype) if hp.num_iterations > 1 else None
    # A sampler that is not the policy (vLLM): TRL's truncated importance weights of each token, from
    # the first pass's log-probs (the policy at sampling time) against the sampler's.
    cap = hp.importance_sampling_cap
    weights = torch.ones_like(loss_mask, dtype=torch.float32) \
        if rollout.sampling_logps is not None and cap is not None else None
    ratios = torch.zeros_like(weights) if weights is not None else None  # log ratios, for the metrics
    parts_sum: dict[str, Any] = {}
    # Stop points: before each micro-batch of the first pass, while no optimizer step has changed the weights.
    stop_points, most = hooks.count_range(len(micro_batches))
    padding = most - len(micro_batches) if is_sharded(policy) else 0  # FSDP: equal passes on every rank
    for iteration in range(hp.num_iterations):
        for position, index in enumerate(micro_batches):
            if iteration == 0 and position < stop_points and hooks.stop_agreed():
                raise Stopped("before the update's first optimizer step")
            logps = completion_logps(policy, rollout.prompt_ids[index], rollout.prompt_mask[index],
                                     rollout.completion_ids[index], rollout.completion_mask[index],
                                     hp.temperature, share_prefix=hp.share_prefix)
            if iteration == 0 and old_logps is not None:
                old_logps[index] = logps.detach()
            if iteration == 0 and weights is not None:
                ratios[index] = log_ratios(logps, rollout.sampling_logps[index], loss_mask[index])
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
            scale = hooks.world_size if contributes else 0.0  # 0: join the sync, move nothing
            with nullcontext() if last else hooks.no_sync():
                hooks.backward(loss * scale)
            if contributes:
                _accumulate(parts_sum, {"loss": loss.detach(), **parts.as_dict()})
        for _ in range(padding):
            _zero_weighted_pass(policy, hooks, hp, rollout)
        hooks.step(iteration == hp.num_iterations - 1)
    if not contributes:
        return {}
    # Loss shares add up to the step's loss; the other parts are means over micro-batches.
    passes = hp.num_iterations
    parts = {key: float(value) / (passes if key in ("loss", "policy_loss") else passes * len(micro_batches))
             for key, value in parts_sum.items()}
    if weights is not None:
        parts.update(weight_metrics(weights[rows], loss_mask[rows], cap, ratios[rows]))
    return parts


def _zero_weighted_pass(policy, hooks: TrainerHooks, hp: UpdateSettings, rollout) -> None:
    """One pass of one one-token row, weighted 0: a sharded rank's share of the collectives of a pass it
    has no micro-batch for (every layer gathered, its zero gradient reduce-scattered)."""
    dummy, _, _, _ = _dummy_row(rollout, rollout.completion_mask)
    logps = completion_logps(policy, dummy.prompt_ids, dummy.prompt_mask, dummy.completion_ids,
                             dummy.completion_mask, hp.temperature, share_prefix=False)
    hooks.backward(logps.sum() * 0.0)


def _accumulate(sums: dict[str, Any], parts: dict[str, Any]) -> None:
    """Add detached 0-d tensors on the device: no host sync per micro-batch."""
    for key, value in parts.items():
        sums[key] = sums[key] + value if key in sums else value


def _dummy_row(rollout: RolloutBatch, loss_mask):
    """One one-token row (token 0, in the rollout's dtypes and device) for a rank that must join the
    gradient sync with nothing of its own: its loss is multiplied by 0."""
    import dataclasses

    device = loss_mask.device
    ids = torch.zeros(1, 1, dtype=rollout.completion_ids.dtype, device=device)
    mask = torch.ones(1, 1, dtype=rollout.completion_mask.dtype, device=device)
    dummy = dataclasses.replace(rollout, prompt_ids=ids, prompt_mask=mask.clone(), completion_ids=ids.clone(),
                                completion_mask=mask.clone(), sampling_logps=None,
                                truncated=torch.zeros(1, dtype=torch.bool, device=device))
    return dummy, torch.ones(1, 1, dtype=loss_mask.dtype, device=device), torch.zeros(1, device=device), None
