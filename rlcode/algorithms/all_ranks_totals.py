"""Step totals summed over the ranks of a distributed run, in one collective per step.

Every rank needs the same answer to "is there anything to learn from in this step?" (a rank that
skips its backward while another syncs gradients hangs DDP) and the same ``dapo`` normaliser (tokens
of the whole step, over every rank, as TRL's ``num_items_in_batch``); the reward mean over all ranks
is logged beside rank zero's own. On one device the totals are this rank's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import lightning as L
    from torch import Tensor


@dataclass(frozen=True)
class AllRanksTotals:
    """Step totals over every rank (equal to this rank's on one device)."""

    world_size: int
    tokens: float
    """Loss tokens of the kept completions: dapo's normaliser, and whether anything is to learn."""
    mean_reward: float
    frac_reward_zero_std: float

    def metrics(self) -> dict[str, float]:
        """Logged next to the per-rank reward metrics (rank zero's) when there are several ranks."""
        if self.world_size == 1:
            return {}
        return {"avg_batch_reward_all_ranks": self.mean_reward,
                "frac_reward_zero_std_all_ranks": self.frac_reward_zero_std}


def sum_over_ranks(trainer: L.Trainer, rewards: Tensor, kept_tokens: Tensor, frac_zero_std: float) -> AllRanksTotals:
    """rewards [N] (NaN: unscored), kept_tokens 0-d -> totals of every rank (a no-op on one device)."""
    import torch

    local = torch.stack([rewards.nan_to_num(0.0).sum(), (~rewards.isnan()).sum().float(),
                         torch.as_tensor(frac_zero_std, dtype=torch.float32, device=rewards.device),
                         kept_tokens.float().to(rewards.device)])
    world_size = trainer.world_size
    summed = trainer.strategy.reduce(local.clone(), reduce_op="sum") if world_size > 1 else local
    reward_sum, reward_count, frac_zero_std_sum, tokens = summed.tolist()
    return AllRanksTotals(world_size=world_size, tokens=tokens,
                          mean_reward=reward_sum / reward_count if reward_count else float("nan"),
                          frac_reward_zero_std=frac_zero_std_sum / world_size)
