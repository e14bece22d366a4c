"""Step totals summed over the ranks of a distributed run, in one collective per step.

Every rank needs the same answers to:

- the loss normalisers (``LossTotals``): completions and active tokens of the whole step, over every
  rank, so a rank's gradient is its share of the loss of the combined batch;
- the reward std over all ranks, for ``scale_rewards="batch"`` (TRL gathers the rewards of every
  process before scaling);
Also the reward mean and the share of zero-std groups over all ranks, logged beside rank zero's own.
On one device the totals are this rank's, without a collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlcode.algorithms.losses import LossTotals

if TYPE_CHECKING:
    import lightning as L
    from torch import Tensor


@dataclass(frozen=True)
class AllRanksTotals:
    """Step totals over every rank (equal to this rank's on one device)."""

    world_size: int
    loss: LossTotals
    """Completions and loss tokens (after truncation masking) of the step: the loss normalisers."""
    mean_reward: float
    reward_std: float
    """Bessel std of every rank's rewards, NaN left out (NaN when fewer than two)."""
    frac_reward_zero_std: float

    def metrics(self) -> dict[str, float]:
        """Logged next to the per-rank reward metrics (rank zero's) when there are several ranks."""
        if self.world_size == 1:
            return {}
        return {"avg_batch_reward_all_ranks": self.mean_reward,
                "frac_reward_zero_std_all_ranks": self.frac_reward_zero_std}


def sum_over_ranks(trainer: L.Trainer, rewards: Tensor, loss_mask: Tensor, frac_zero_std: Tensor) -> AllRanksTotals:
    """rewards [N] (NaN: unscored), loss_mask [N, T], frac_zero_std 0-d -> totals over every rank."""
    import torch

    scored = rewards[~rewards.isnan()].double()  # float64: the sum of squares must not cancel
    device = rewards.device

    def scalar(value) -> Tensor:
        return torch.as_tensor(value, dtype=torch.float64, device=device).reshape(())

    local = torch.stack([scored.sum(), (scored * scored).sum(), scalar(scored.numel()), scalar(frac_zero_std),
                         scalar(loss_mask.sum()), scalar(loss_mask.size(0))])
    world_size = trainer.world_size
    summed = trainer.strategy.reduce(local.clone(), reduce_op="sum") if world_size > 1 else local
    reward_sum, reward_squares, count, frac_zero_std_sum, tokens, sequences = summed.tolist()  # one sync
    variance = (reward_squares - reward_sum**2 / count) / (count - 1) if count > 1 else math.nan
    return AllRanksTotals(
        world_size=world_size, loss=LossTotals(tokens=tokens, sequences=sequences),
        mean_reward=reward_sum / count if count else math.nan, reward_std=math.sqrt(max(variance, 0.0)),
        frac_reward_zero_std=frac_zero_std_sum / world_size,
    )
