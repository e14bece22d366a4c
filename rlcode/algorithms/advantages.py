"""Group-relative advantages (GRPO and its variants).

Each prompt is sampled ``group_size`` times; a completion's advantage is its reward minus the mean
reward of its group, optionally divided by a standard deviation:

- ``"group"`` (GRPO, TRL's default): the group's standard deviation, with Bessel's correction.
- ``"batch"`` (PPO-Lite): one standard deviation over the whole batch, which keeps the relative size
  of signals from easy and hard prompts. Under DDP the batch is every rank's (as TRL gathers it):
  the trainer passes the std of all ranks' rewards as ``batch_std``.
- ``"none"`` (Dr. GRPO): no scaling; dividing by a group's std up-weights prompts whose rewards
  barely differ (a question-difficulty bias).

The arithmetic matches TRL 1.16 ``GRPOTrainer`` (single reward function, ``sum_then_normalize``):
NaN rewards (unscorable completions) are left out of means and deviations and get advantage 0, a
group of one has std 0, and ``eps`` (TRL: 1e-4) keeps all-equal groups from dividing by zero. Such
groups get advantage 0 and so no gradient; ``zero_std_group_mask`` lets the trainer drop them
before the backward pass instead of paying for it (DAPO's dynamic sampling).

Rewards are laid out group by group: ``rewards[g * group_size:(g + 1) * group_size]`` is one group.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch import Tensor

RewardScaling = Literal["group", "batch", "none"]
REWARD_SCALINGS: tuple[str, ...] = ("group", "batch", "none")


@dataclass(frozen=True)
class AdvantageStats:
    """Detached 0-d tensors for logging (tensors, so logging a step costs no device sync)."""

    reward_mean: Tensor
    """Mean reward over the batch, ignoring NaN."""
    reward_std: Tensor
    """Standard deviation (Bessel) of the rewards over the batch, ignoring NaN."""
    frac_reward_zero_std: Tensor
    """Fraction of groups whose rewards are all equal: they give no learning signal."""

    def as_dict(self, prefix: str = "") -> dict[str, Tensor]:
        return {prefix + f.name: getattr(self, f.name) for f in fields(self)}


def _nanstd(values: Tensor, dim: int | None = None) -> Tensor:
    """Standard deviation with Bessel's correction, ignoring NaN (TRL's ``nanstd``).

    NaN when fewer than two values are present, as an unbiased estimate is undefined there.
    """
    import torch

    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(values)).sum(dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    std = torch.sqrt(variance * correction)
    return std.squeeze(dim) if dim is not None else std.reshape(())


def _check(rewards: Tensor, group_size: int) -> None:
    if rewards.dim() != 1:
        raise ValueError(
            f"rewards must be 1-D [num_prompts * group_size], got shape {tuple(rewards.shape)}; flatten it."
        )
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of {group_size}; "
            "pass group_size = the number of completions sampled per prompt."
        )


def _group_std(grouped: Tensor) -> Tensor:
    """[P, G] -> [P]: each group's std, 0 for groups of one (TRL does the same)."""
    import torch

    if grouped.size(1) == 1:
        return torch.zeros(grouped.size(0), dtype=grouped.dtype, device=grouped.device)
    return _nanstd(grouped, dim=1)


def zero_std_group_mask(rewards: Tensor, group_size: int) -> Tensor:
    """Per completion, True when every reward in its group is the same (so its advantage is 0).

    rewards: [P * G] -> bool [P * G]. The trainer can drop these rows before the loss.
    """
    import torch

    _check(rewards, group_size)
    group_std = _group_std(rewards.view(-1, group_size))  # [P]
    # isclose, not == 0: float sums of equal rewards can leave a std of 1e-9 (TRL uses isclose too).
    is_zero = torch.isclose(group_std, torch.zeros_like(group_std))
    return is_zero.repeat_interleave(group_size)


def group_advantages(
    rewards: Tensor,
    group_size: int,
    scale_rewards: RewardScaling = "group",
    eps: float = 1e-4,
    batch_std: Tensor | float | None = None,
) -> tuple[Tensor, AdvantageStats]:
    """Group-relative advantages and reward statistics.

    Args:
        rewards: [P * G] one reward per completion, grouped by prompt (NaN = unscorable).
        group_size: G, completions per prompt.
        scale_rewards: ``"group"`` (GRPO), ``"batch"`` or ``"none"`` (Dr. GRPO); see the module doc.
        eps: added to the std before dividing (TRL: 1e-4).
        batch_std: ``"batch"`` only: the std over the whole distributed batch (None: these rewards').

    Returns:
        advantages [P * G] (float, detached from ``rewards``' graph) and ``AdvantageStats``.
    """
    import torch

    _check(rewards, group_size)
    if scale_rewards not in REWARD_SCALINGS:
        raise ValueError(f"scale_rewards={scale_rewards!r} is not one of {REWARD_SCALINGS}.")
    rewards = rewards.detach().to(torch.promote_types(rewards.dtype, torch.float32))  # float64 stays float64
    grouped = rewards.view(-1, group_size)  # [P, G]
    group_mean = torch.nanmean(grouped, dim=1).repeat_interleave(group_size)  # [P * G]
    advantages = rewards - group_mean
    if scale_rewards == "group":
        std = _group_std(grouped).repeat_interleave(group_size)  # [P * G]
        advantages = advantages / (std + eps)
    elif scale_rewards == "batch":
        if batch_std is not None:
            std = torch.as_tensor(batch_std, dtype=rewards.dtype, device=rewards.device)
        else:
            std = _nanstd(rewards) if rewards.numel() > 1 else torch.zeros((), device=rewards.device)
        advantages = advantages / (std + eps)
    # An unscorable completion (NaN reward) must not move the policy; a group without signal gets
    # exactly 0 (float noise in its mean would otherwise leave ~1e-5 / eps), so it can be skipped.
    flat = zero_std_group_mask(rewards, group_size)
    advantages = torch.nan_to_num(advantages, nan=0.0).masked_fill(flat, 0.0)

    stats = AdvantageStats(
        reward_mean=torch.nanmean(rewards),
        reward_std=_nanstd(rewards),
        frac_reward_zero_std=flat.float().mean(),
    )
    return advantages, stats
