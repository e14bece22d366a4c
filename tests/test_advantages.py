"""Group-relative advantages against hand-computed values (TRL parity: tests/test_trl_parity.py).

Rewards are float64 here (advantages keep the rewards' dtype), so each comparison with a value
worked out by hand is a float64 one."""

import math

import pytest
import torch

from rlcode.algorithms.advantages import group_advantages, zero_std_group_mask

EPS = 1e-4


def test_group_scaling_uses_bessel_std_per_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    advantages, stats = group_advantages(rewards, group_size=4)
    # Group 1: mean 0.5, deviations +-0.5, Bessel variance (4 * 0.25) / 3 = 1/3, std = 0.57735.
    std = math.sqrt(1 / 3)
    expected_first = torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64) / (std + EPS)
    torch.testing.assert_close(advantages[:4], expected_first)
    # Group 2: all equal -> deviation 0, no signal.
    assert torch.equal(advantages[4:], torch.zeros(4))
    # Batch: mean 1.25; squared deviations .0625 + 1.5625 + 1.5625 + .0625 + 4 * .5625 = 5.5; / 7.
    assert stats.reward_mean.item() == pytest.approx(1.25)
    assert stats.reward_std.item() == pytest.approx(math.sqrt(5.5 / 7))
    assert stats.frac_reward_zero_std.item() == pytest.approx(0.5)


def test_batch_scaling_divides_by_one_batch_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    advantages, _ = group_advantages(rewards, group_size=4, scale_rewards="batch")
    # Still centred on each group's mean; scaled by the batch std sqrt(5.5 / 7) = 0.886405.
    centred = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(advantages, centred / (math.sqrt(5.5 / 7) + EPS))


def test_no_scaling_is_dr_grpo_centring_only():
    rewards = torch.tensor([3.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    advantages, _ = group_advantages(rewards, group_size=2, scale_rewards="none")
    torch.testing.assert_close(advantages, torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=torch.float64))


def test_nan_rewards_are_left_out_and_get_zero_advantage():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 1.0], dtype=torch.float64)
    advantages, stats = group_advantages(rewards, group_size=4)
    # Over [1, 0, 1]: mean 2/3, squared deviations 1/9 + 4/9 + 1/9 = 2/3, Bessel / 2 -> variance 1/3.
    scale = math.sqrt(1 / 3) + EPS
    torch.testing.assert_close(advantages, torch.tensor([1 / 3, 0.0, -2 / 3, 1 / 3], dtype=torch.float64) / scale)
    assert stats.reward_mean.item() == pytest.approx(2 / 3)


def test_group_of_one_has_zero_advantage():
    advantages, stats = group_advantages(torch.tensor([0.3, 5.0], dtype=torch.float64), group_size=1)
    assert torch.equal(advantages, torch.zeros(2))
    assert stats.frac_reward_zero_std.item() == 1.0


def test_advantages_are_detached_float():
    rewards = torch.tensor([1, 0, 1, 1], dtype=torch.int64)
    advantages, _ = group_advantages(rewards, group_size=2)
    assert advantages.dtype == torch.float32 and not advantages.requires_grad
    rewards = torch.tensor([1.0, 0.0], requires_grad=True)
    assert not group_advantages(rewards, group_size=2)[0].requires_grad


def test_zero_std_group_mask_flags_every_completion_of_a_flat_group():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5], dtype=torch.float64)
    mask = zero_std_group_mask(rewards, group_size=3)
    assert mask.tolist() == [True, True, True, False, False, False, True, True, True]


def test_stats_as_dict_prefixes_names():
    _, stats = group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), group_size=2)
    assert set(stats.as_dict("train/")) == {"train/reward_mean", "train/reward_std", "train/frac_reward_zero_std"}


@pytest.mark.parametrize(
    ("rewards", "group_size", "scale", "message"),
    [
        (torch.zeros(5), 2, "group", "do not split into groups of 2"),
        (torch.zeros(4), 0, "group", "groups of 0"),
        (torch.zeros(2, 2), 2, "group", "must be 1-D"),
        (torch.zeros(4), 2, "std", "not one of"),
    ],
)
def test_bad_input_names_the_cause(rewards, group_size, scale, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(rewards, group_size, scale_rewards=scale)
