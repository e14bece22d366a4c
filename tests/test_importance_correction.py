"""TRL's truncated importance-sampling correction, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlcode.algorithms.importance_correction import (
    corrected_advantages,
    log_ratios,
    truncated_importance_weights,
    weight_metrics,
)
from rlcode.algorithms.losses import policy_loss

NAN = float("nan")


def test_weights_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.1, -3.0],
                            [-0.5, -4.0, -1.0, -7.0]])
    sampler = torch.tensor([[-1.5, -0.5, -2.1, NAN],
                            [-0.5, -1.0, -0.2, -1.0]])
    mask = torch.tensor([[1, 1, 1, 1],
                         [1, 1, 1, 0]])
    weights = truncated_importance_weights(trainer, sampler, mask, cap=3.0)
    expected = torch.tensor([
        [math.exp(0.5),  # trainer found the token likelier than the sampler: weight up
         math.exp(-1.5),  # less likely: weight down
         3.0,  # exp(2.0) = 7.39, truncated at the cap
         1.0],  # the sampler gave no log-prob (NaN): no correction
        [1.0,  # same log-prob: 1
         math.exp(-3.0),
         math.exp(-0.8),
         1.0],  # padding
    ])
    # float32: the inputs carry their rounding (u |x| <= 7 u, u = 2^-24), the difference adds u |d|
    # (|d| <= 3), exp turns its argument's absolute error e into a relative one and adds u: at most
    # (7 + 7 + 3 + 1) u = 18 u relative to the exact weights worked out above.
    torch.testing.assert_close(weights.double(), expected.double(), rtol=18 * 2.0**-24, atol=0)
    assert weights.dtype == torch.float32 and not weights.requires_grad


def test_weights_carry_no_gradient_and_padding_infinities_do_no_harm():
    trainer = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    sampler = torch.tensor([[-1.0, float("-inf")]])
    weights = truncated_importance_weights(trainer, sampler, torch.tensor([[1, 0]]))
    assert weights.tolist() == [[1.0, 1.0]] and not weights.requires_grad


def test_corrected_advantages_and_metrics_by_hand():
    weights = torch.tensor([[0.5, 3.0, 1.0], [2.0, 1.0, 1.0]])
    advantages = torch.tensor([1.0, -2.0])
    assert corrected_advantages(advantages, weights).tolist() == [[0.5, 3.0, 1.0], [-4.0, -2.0, -2.0]]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    metrics = weight_metrics(weights, mask, cap=3.0)
    assert metrics == pytest.approx({"importance_weight_mean": (0.5 + 3.0 + 2.0) / 3, "importance_weight_min": 0.5,
                                     "importance_weight_max": 3.0, "importance_weight_capped_frac": 1 / 3})


def test_mismatch_metrics_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, 0.0]])
    sampler = torch.tensor([[-1.5, -0.5, NAN], [-0.5, -4.0, float("-inf")]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    ratios = log_ratios(trainer, sampler, mask)
    assert ratios.tolist() == [[0.5, -1.5, 0.0], [0.0, 3.0, 0.0]]  # NaN: no correction; padding: 0
    weights = truncated_importance_weights(trainer, sampler, mask, cap=3.0)
    metrics = weight_metrics(weights, mask, cap=3.0, ratios=ratios)
    assert metrics["importance_log_ratio_abs_mean"] == pytest.approx((0.5 + 1.5 + 0.0 + 0.0 + 3.0) / 5)
    assert metrics["importance_log_ratio_abs_max"] == 3.0 and metrics["importance_weight_capped_frac"] == pytest.approx(0.2)
    assert "importance_log_ratio_abs_mean" not in weight_metrics(weights, mask, cap=3.0)  # without ratios


def test_folding_the_weights_into_the_advantages_weights_the_surrogate_and_not_the_kl():
    """policy_loss with advantages A * w equals TRL's per_token_loss = w * surrogate + beta * kl
    (in float64, which every step keeps: a float64 comparison)."""
    generator = torch.Generator().manual_seed(0)
    f64 = dict(generator=generator, dtype=torch.float64)
    logps = (torch.randn(3, 5, **f64) - 1).requires_grad_(True)
    old = logps.detach() + 0.3 * torch.randn(3, 5, **f64)
    ref = logps.detach() + 0.2 * torch.randn(3, 5, **f64)
    sampler = old + 0.5 * torch.randn(3, 5, **f64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    advantages = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    beta, low, high = 0.04, 0.2, 0.28

    corrected = corrected_advantages(advantages, truncated_importance_weights(old, sampler, mask))
    loss, _ = policy_loss(logps, corrected, mask, old, ref, loss_type="dapo", beta=beta,
                          epsilon_low=low, epsilon_high=high)

    # TRL 1.16 GRPOTrainer._compute_loss, written out
    weights = torch.exp(old - sampler).clamp(max=3.0)
    ratio = torch.exp(logps - old)
    surrogate = -torch.min(ratio * advantages[:, None], ratio.clamp(1 - low, 1 + high) * advantages[:, None])
    kl = (torch.exp(ref - logps) - (ref - logps) - 1) * ratio
    per_token = surrogate * weights + beta * kl
    expected = (per_token * mask).sum() / mask.sum()
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, expected)
    gradient, expected_gradient = torch.autograd.grad(loss, logps)[0], torch.autograd.grad(expected, logps)[0]
    torch.testing.assert_close(gradient, expected_gradient)
    # the correction is not a no-op here: weights exp(0.5 randn) are far from 1, not by rounding
    assert float((weights[mask.bool()] - 1).abs().max()) > 0.1


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        truncated_importance_weights(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cap=0.5)
