"""The GRPO-family loss against hand-computed values on tiny tensors (TRL parity: test_trl_parity.py).

Every tensor here is float64 (the losses keep their inputs' dtype), so each comparison with a
value worked out by hand is a float64 one."""

import math

import pytest
import torch

from rlcode.algorithms.losses import LossTotals, mask_truncated, per_token_logps, policy_loss

# Two completions, the second one token shorter; its padding holds -inf, which must not leak NaN.
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
ADVANTAGES = torch.tensor([1.0, -2.0], dtype=torch.float64)


@pytest.fixture(autouse=True)
def _float64_by_default():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _on_policy_logps():
    return torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -math.inf]], requires_grad=True)


# On policy the ratio is 1, so each active token's surrogate is -A: row 0 gives -1, -1, -1 and
# row 1 gives +2, +2 (its third token is padding). Masked sum = -3 + 4 = 1 over 5 tokens.
@pytest.mark.parametrize(
    ("loss_type", "extra", "expected_loss", "expected_grad"),
    [
        # mean over sequences of per-sequence means: (-3/3 + 4/2) / 2 = 0.5;
        # d/dlogp = -A / len / B: row 0 -> -1/6, row 1 -> +2/2/2 = 0.5.
        ("grpo", {}, 0.5, [[-1 / 6] * 3, [0.5, 0.5, 0.0]]),
        # masked sum / active tokens: 1 / 5; d/dlogp = -A / 5.
        ("bnpo", {}, 0.2, [[-0.2] * 3, [0.4, 0.4, 0.0]]),
        # masked sum / (B * max_completion_length) = 1 / (2 * 4); d/dlogp = -A / 8.
        ("dr_grpo", {"max_completion_length": 4}, 0.125, [[-0.125] * 3, [0.25, 0.25, 0.0]]),
        # masked sum / local active tokens = 1 / 5, as bnpo on one micro-batch.
        ("dapo", {}, 0.2, [[-0.2] * 3, [0.4, 0.4, 0.0]]),
        # masked sum / the step's token count = 1 / 10; d/dlogp = -A / 10.
        ("dapo", {"totals": LossTotals(tokens=10, sequences=4)}, 0.1, [[-0.1] * 3, [0.2, 0.2, 0.0]]),
        # per-sequence means summed over the step's 4 sequences: (-1 + 2) / 4.
        ("grpo", {"totals": LossTotals(tokens=10, sequences=4)}, 0.25, [[-1 / 12] * 3, [0.25, 0.25, 0.0]]),
    ],
)
def test_loss_types_on_policy(loss_type, extra, expected_loss, expected_grad):
    logps = _on_policy_logps()
    loss, parts = policy_loss(logps, ADVANTAGES, MASK, loss_type=loss_type, **extra)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss)
    assert parts.policy_loss.item() == pytest.approx(expected_loss)
    # Gradient flows only where mask = 1, and the -inf padding stays finite.
    torch.testing.assert_close(logps.grad, torch.tensor(expected_grad))
    assert parts.ratio_mean.item() == 1.0 and parts.clip_frac_region.item() == 0.0
    assert parts.kl is None


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("split", [[1, 1], [1, 2], [2, 1]])
def test_micro_batch_losses_add_up_to_the_whole_batch(loss_type, split):
    """With the step's totals, micro-batches of any size (a partial last one
    included) give the loss and gradient of the whole batch; before, each micro-batch was normalised
    by its own size and divided by the number of micro-batches."""
    torch.manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    advantages = torch.tensor([1.0, -2.0, 0.5])
    base = torch.randn(3, 3)
    old = base + 0.3 * torch.randn(3, 3)
    kwargs = {"loss_type": loss_type, "max_completion_length": 4, "epsilon_high": 0.28}

    whole_logps = base.clone().requires_grad_(True)
    whole, _ = policy_loss(whole_logps, advantages, mask, old, **kwargs)
    whole.backward()

    split_logps = base.clone().requires_grad_(True)
    totals, total_loss, start = LossTotals.of(mask), 0.0, 0
    for size in split + [3 - sum(split)] * (sum(split) < 3):
        rows = slice(start, start + size)
        loss, _ = policy_loss(split_logps[rows], advantages[rows], mask[rows], old[rows], totals=totals, **kwargs)
        loss.backward()
        total_loss, start = total_loss + loss.item(), start + size
    assert total_loss == pytest.approx(whole.item(), abs=1e-12)  # float64 sums of 9 terms below 10 in size
    torch.testing.assert_close(split_logps.grad, whole_logps.grad)


def _off_policy(ratios):
    """old_logps = 0, logps = log(ratio): the ratio is exactly `ratios`."""
    logps = torch.log(torch.tensor(ratios)).requires_grad_()
    return logps, torch.zeros_like(logps)


def test_token_clipping_with_old_logps():
    # Both rows have ratios 1.25, 1.1, 0.5; row 0 has A = +1, row 1 has A = -1; eps 0.2 / 0.2.
    logps, old_logps = _off_policy([[1.25, 1.1, 0.5], [1.25, 1.1, 0.5]])
    loss, parts = policy_loss(logps, torch.tensor([1.0, -1.0]), torch.ones(2, 3), old_logps, loss_type="bnpo")
    loss.backward()
    # A > 0: -min(r, clip(r, .8, 1.2)) = -[1.2 (clipped), 1.1, 0.5 (min picks r)] -> sum -2.8.
    # A < 0: -min(-r, -clip(r)) = max(r, clip(r)) = [1.25, 1.1, 0.8 (clipped)] -> sum 3.15.
    assert loss.item() == pytest.approx((-2.8 + 3.15) / 6)
    # d/dlogp of -A * r is -A * r where r is used, 0 where the clipped constant is used; / 6 tokens.
    expected_grad = torch.tensor([[0.0, -1.1, -0.5], [1.25, 1.1, 0.0]]) / 6
    torch.testing.assert_close(logps.grad, expected_grad)
    assert parts.clip_frac_high.item() == pytest.approx(1 / 6)  # 1.25 > 1.2 with A > 0
    assert parts.clip_frac_low.item() == pytest.approx(1 / 6)  # 0.5 < 0.8 with A < 0
    assert parts.clip_frac_region.item() == pytest.approx(2 / 6)
    assert parts.ratio_mean.item() == pytest.approx((1.25 + 1.1 + 0.5) / 3)


def test_clip_higher_lets_a_positive_token_grow_further():
    logps, old_logps = _off_policy([[1.25, 1.1, 0.5]])
    loss, parts = policy_loss(logps, torch.tensor([1.0]), torch.ones(1, 3), old_logps, epsilon_high=0.28)
    loss.backward()
    # 1.25 < 1.28: unclipped now; -(1.25 + 1.1 + 0.5) / 3.
    assert loss.item() == pytest.approx(-2.85 / 3)
    torch.testing.assert_close(logps.grad, -torch.tensor([[1.25, 1.1, 0.5]]) / 3)
    assert parts.clip_frac_region.item() == 0.0


def test_sequence_level_ratio_is_exp_of_mean_log_ratio():
    # Active log ratios 0.1 and 0.3 (the padding's 5.0 is ignored): sequence ratio exp(0.2) = 1.2214.
    old_logps = torch.zeros(1, 3)
    logps = torch.tensor([[0.1, 0.3, 5.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, parts = policy_loss(logps, torch.tensor([1.0]), mask, old_logps, importance_sampling_level="sequence")
    loss.backward()
    # 1.2214 > 1.2 with A > 0: every token takes the clipped 1.2, no gradient, one clipped sequence.
    assert loss.item() == pytest.approx(-1.2)
    assert torch.equal(logps.grad, torch.zeros(1, 3))
    assert parts.clip_frac_high.item() == 1.0 and parts.ratio_mean.item() == pytest.approx(math.exp(0.2))

    logps.grad = None
    loss, _ = policy_loss(logps, torch.tensor([1.0]), mask, old_logps, importance_sampling_level="sequence",
                          epsilon_high=0.28)
    loss.backward()
    # Unclipped: loss = -exp(mean log ratio); each active token's share of the mean is 1/2.
    assert loss.item() == pytest.approx(-math.exp(0.2))
    torch.testing.assert_close(logps.grad, torch.tensor([[-math.exp(0.2) / 2, -math.exp(0.2) / 2, 0.0]]))


def test_sequence_level_differs_from_token_level():
    logps, old_logps = _off_policy([[1.3, 0.9]])
    token, _ = policy_loss(logps, torch.tensor([1.0]), torch.ones(1, 2), old_logps, loss_type="bnpo")
    sequence, _ = policy_loss(logps, torch.tensor([1.0]), torch.ones(1, 2), old_logps, loss_type="bnpo",
                              importance_sampling_level="sequence")
    # Token: -(1.2 + 0.9) / 2; sequence: -sqrt(1.3 * 0.9) = -1.0817 (inside the clip range).
    assert token.item() == pytest.approx(-1.05)
    assert sequence.item() == pytest.approx(-math.sqrt(1.3 * 0.9))


def test_mask_truncated_drops_whole_completions():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    masked = mask_truncated(mask, torch.tensor([True, False]))
    assert masked.tolist() == [[0, 0, 0], [1, 1, 0]] and masked.dtype == mask.dtype
    logps = _on_policy_logps()
    loss, _ = policy_loss(logps, ADVANTAGES, masked, loss_type="bnpo")
    loss.backward()
    # Only row 1 remains: surrogate +2, +2 over 2 tokens -> 2; row 0 gets no gradient at all.
    assert loss.item() == pytest.approx(2.0)
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="one flag per completion"):
        mask_truncated(mask, torch.tensor([True]))


def test_kl_term_is_k3_weighted_by_the_ratio():
    # ref - logp = d = +ln 2 and -ln 2; A = 0 so only the KL term remains.
    logps = torch.zeros(1, 2, requires_grad=True)
    ref_logps = torch.tensor([[math.log(2), -math.log(2)]])
    loss, parts = policy_loss(logps, torch.zeros(1), torch.ones(1, 2), ref_logps=ref_logps, beta=0.1,
                              loss_type="bnpo")
    loss.backward()
    # k3 = e^d - d - 1: (2 - ln 2 - 1) + (0.5 + ln 2 - 1) = 0.5 in total, mean 0.25.
    assert parts.kl.item() == pytest.approx(0.25)
    assert loss.item() == pytest.approx(0.1 * 0.25)
    # With the ratio factor, d/dlogp [k3 * ratio] at ratio 1 = (1 - e^d) + k3 = -d:
    # the unbiased reverse-KL gradient. Times beta / 2 tokens.
    torch.testing.assert_close(logps.grad, torch.tensor([[-math.log(2), math.log(2)]]) * 0.1 / 2)
    assert parts.policy_loss.item() == 0.0  # the surrogate alone

    # Off policy, the KL value is weighted by the ratio exp(0.1) too.
    loss, parts = policy_loss(logps, torch.zeros(1), torch.ones(1, 2), logps.detach() - 0.1, ref_logps,
                              beta=0.1, loss_type="bnpo")
    assert parts.kl.item() == pytest.approx(0.25 * math.exp(0.1))
    assert loss.item() == pytest.approx(0.1 * 0.25 * math.exp(0.1))


def test_kl_is_logged_without_entering_the_loss_when_beta_is_zero():
    logps = torch.zeros(1, 2, requires_grad=True)
    ref_logps = torch.tensor([[math.log(2), -math.log(2)]])
    loss, parts = policy_loss(logps, torch.zeros(1), torch.ones(1, 2), ref_logps=ref_logps)
    assert loss.item() == 0.0 and parts.kl.item() == pytest.approx(0.25)
    assert set(parts.as_dict()) == {"policy_loss", "ratio_mean", "clip_frac_low", "clip_frac_high",
                                    "clip_frac_region", "kl"}


def test_parts_are_detached_scalars():
    _, parts = policy_loss(_on_policy_logps(), ADVANTAGES, MASK)
    for value in parts.as_dict().values():
        assert value.dim() == 0 and not value.requires_grad


def test_per_token_logps_matches_naive_log_softmax():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=generator, dtype=torch.float64)
    ids = torch.randint(0, 11, (3, 5), generator=generator)
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(per_token_logps(logits, ids, temperature=0.7), expected)  # float64 in and out
    # bf16 logits are scored in float32, so only the bf16 rounding of the inputs is lost: each logit
    # moves by at most u |x| (bf16: 8 significant bits, u = 2^-8), so z_i and logsumexp(z) each move
    # by at most u max|x| / T; the float32 arithmetic adds a few 2^-24 of |z_i| + |lse|, far below.
    bf16 = per_token_logps(logits.bfloat16(), ids, temperature=0.7)
    assert bf16.dtype == torch.float32
    z = logits / 0.7
    z_size, lse_size = float(z.abs().max()), float(torch.logsumexp(z, -1).abs().max())
    bound = 2 * 2.0**-8 * z_size + 8 * 2.0**-24 * (z_size + lse_size)
    torch.testing.assert_close(bf16.double(), expected, atol=bound, rtol=0.0)


def test_per_token_logps_gradient_reaches_logits():
    logits = torch.randn(2, 3, 4, requires_grad=True)
    ids = torch.tensor([[0, 1, 2], [3, 2, 1]])
    per_token_logps(logits, ids).sum().backward()
    # d log softmax(x)_i / dx = onehot(i) - softmax(x): each row's gradient sums to zero.
    torch.testing.assert_close(logits.grad.sum(-1), torch.zeros(2, 3))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_type": "ppo"}, "not one of"),
        ({"importance_sampling_level": "batch"}, "not one of"),
        ({"beta": 0.04}, "needs ref_logps"),
        ({"loss_type": "dr_grpo"}, "max_completion_length"),
    ],
)
def test_bad_config_names_the_cause(kwargs, message):
    with pytest.raises(ValueError, match=message):
        policy_loss(torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), **kwargs)


def test_bad_shapes_name_the_cause():
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="old_logps"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2), torch.ones(3, 3))
    with pytest.raises(ValueError, match="temperature"):
        per_token_logps(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="disagree"):
        per_token_logps(torch.zeros(1, 3, 3), torch.zeros(1, 2, dtype=torch.long))
