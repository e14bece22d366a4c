"""Step totals summed over the ranks of a distributed run: one collective per step before the update
(``sum_over_ranks``), and one small one for the counts people read once the step is recorded
(``counts_over_ranks``).

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

import torch

if TYPE_CHECKING:
    from torch import Tensor


class Ranks:
    """The ranks of a run as the step's collectives see them: sums and gathers over the default
    process group (what Lightning's DDP strategy reduces over), nothing on one rank.

    ``device``: where the collectives' tensors live (the policy's: NCCL needs CUDA tensors).
    """

    def __init__(self, world_size: int = 1, rank: int = 0, device=None) -> None:
        self.world_size, self.rank, self.device = world_size, rank, device

    def sum(self, tensor: Tensor) -> Tensor:
        if self.world_size == 1:
            return tensor
        summed = tensor.clone()
        torch.distributed.all_reduce(summed)
        return summed

    def gather(self, tensor: Tensor) -> Tensor:
        """[*shape] on every rank -> [world_size, *shape] (the shapes must agree)."""
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    def any(self, decision: bool) -> bool:
        """True when ``decision`` holds on some rank."""
        if self.world_size == 1:
            return decision
        return bool(self.sum(torch.tensor(int(decision), device=self.device)) > 0)

    def count_range(self, count: int) -> tuple[int, int]:
        """The smallest and the largest of ``count`` over the ranks (one all-reduce)."""
        if self.world_size == 1:
            return count, count
        negated_least_and_most = torch.tensor([-count, count], device=self.device)
        torch.distributed.all_reduce(negated_least_and_most, op=torch.distributed.ReduceOp.MAX)
        return -int(negated_least_and_most[0]), int(negated_least_and_most[1])

    def std(self, values: Tensor) -> float:
        """Bessel std of every rank's ``values`` (NaN left out), from float64 sums (NaN when < 2)."""
        scored = values[~values.isnan()].double()
        count, total, squares = self.sum(torch.stack([
            torch.tensor(float(scored.numel()), dtype=torch.float64, device=values.device),
            scored.sum(), (scored * scored).sum()])).tolist()
        return _bessel_std(total, squares, count)


def _bessel_std(total: float, squares: float, count: float) -> float:
    variance = (squares - total**2 / count) / (count - 1) if count > 1 else math.nan
    return math.sqrt(max(variance, 0.0)) if variance == variance else math.nan


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


def counts_over_ranks(ranks: Ranks, trials: int, successes: list[tuple[str, int, int]]
                      ) -> tuple[int, list[tuple[str, int, int]]]:
    """A step's trials and success counts (``step_scalars.counted``) summed over every rank, for the
    step line, the progress bar and the summary (one all-reduce; as given on one rank). Every rank
    counts the same things (same mode, same rewards), so the lists line up."""
    if ranks.world_size == 1:
        return trials, successes
    local = torch.tensor([trials, *(n for _, count, total in successes for n in (count, total))],
                         dtype=torch.float64, device=ranks.device)
    summed = [int(v) for v in ranks.sum(local).tolist()]
    return summed[0], [(key, summed[1 + 2 * i], summed[2 + 2 * i]) for i, (key, _, _) in enumerate(successes)]


def sum_over_ranks(ranks: Ranks, rewards: Tensor, loss_mask: Tensor, frac_zero_std: Tensor) -> AllRanksTotals:
    """rewards [N] (NaN: unscored), loss_mask [N, T], frac_zero_std 0-d -> totals over every rank."""
    scored = rewards[~rewards.isnan()].double()  # float64: the sum of squares must not cancel
    device = rewards.device

    def scalar(value) -> Tensor:
        return torch.as_tensor(value, dtype=torch.float64, device=device).reshape(())

    local = torch.stack([scored.sum(), (scored * scored).sum(), scalar(scored.numel()), scalar(frac_zero_std),
                         scalar(loss_mask.sum()), scalar(loss_mask.size(0))])
    world_size = ranks.world_size
    reward_sum, reward_squares, count, frac_zero_std_sum, tokens, sequences = ranks.sum(local).tolist()  # one sync
    return AllRanksTotals(
        world_size=world_size, loss=LossTotals(tokens=tokens, sequences=sequences),
        mean_reward=reward_sum / count if count else math.nan,
        reward_std=_bessel_std(reward_sum, reward_squares, count),
        frac_reward_zero_std=frac_zero_std_sum / world_size,
    )
