"""The GRPO-family policy loss, as small pure functions of per-token log-probabilities.

One clipped surrogate, four ways to average it over tokens, optional k3 KL to a reference model:

    ratio_t   = exp(logp_t - old_logp_t)                       (token level), or
    ratio     = exp(mean_t(logp_t - old_logp_t))               (sequence level, GSPO), broadcast over t
    surrogate = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    kl_t      = (exp(ref_t - logp_t) - (ref_t - logp_t) - 1) * ratio_t      (k3, importance-weighted)
    per_token = surrogate + beta * kl_t

    grpo    : sum over sequences of (masked sum over tokens / that sequence's length) / S
    bnpo    : masked sum / N
    dr_grpo : masked sum / (S * max_completion_length)
    dapo    : masked sum / N

S and N are the completions and active tokens of the *whole optimizer step* (every micro-batch, every
rank: ``LossTotals``), not of the micro-batch being computed. So the micro-batch losses of a step add
up to the loss of the whole batch computed at once: the gradient does not depend on the micro-batch
size, a partial last micro-batch weighs no more than a full one, and under DDP a rank with fewer
completions weighs less. With step totals ``bnpo`` and ``dapo`` are the same loss; TRL 1.16 differs
only in normalising ``bnpo`` (and ``grpo``, ``dr_grpo``) per micro-batch and dividing by the
accumulation steps, which weighs micro-batches of unequal size unequally. Called without
``totals`` the micro-batch is the whole step, which is TRL's arithmetic for one micro-batch
(tests/test_trl_parity.py checks loss and gradients to 1e-5, mapping TRL's accumulation onto totals).

Simplifications against TRL, on purpose: no entropy bonus, top-entropy token mask, two-sided
``delta`` clip or off-policy sequence masking; advantages are one scalar per sequence (a [B, T]
tensor is accepted for per-token ones).

Defaults, and why:

- ``loss_type="dapo"``: normalising by the number of tokens in the whole batch gives every token the
  same weight, so there is no length bias (``grpo``'s per-sequence mean lets a long wrong answer
  cost less per token than a short one) and, unlike ``dr_grpo``, the loss scale does not depend on
  the ``max_completion_length`` knob. It is also TRL's default, so comparisons with TRL are
  like-for-like.
- ``beta=0.0``: the rewards here are verified by running tests, not predicted by a learned reward
  model, so there is little to exploit by drifting away from the start; a KL term needs a second
  copy of the weights and an extra forward pass per step (about 25% of a step on CPU for the 135M
  model). DAPO, Dr. GRPO and TRL drop it; set e.g. 0.04 (the GRPO paper) to keep it. The k3 term
  is multiplied by the importance ratio, as TRL does by default (``use_bias_correction_kl``): that
  makes its gradient the unbiased reverse-KL gradient (DeepSeek-V3.2).
- ``epsilon_low = epsilon_high = 0.2``: PPO's symmetric clip. DAPO's clip-higher (``epsilon_high``
  0.28) keeps low-probability tokens able to grow; opt in. With one optimisation pass per batch and
  no ``old_logps`` the ratio is exactly 1 and clipping never acts: the epsilons matter only when
  ``num_iterations > 1`` (or when generation ran in a different engine).
- ``importance_sampling_level="token"``: the GRPO paper's per-token ratio. GSPO's ``"sequence"``
  ratio suits sequence-level rewards and is more stable on MoE models; opt in.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch import Tensor

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
LOSS_TYPES: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo")
ImportanceSamplingLevel = Literal["token", "sequence"]
IMPORTANCE_SAMPLING_LEVELS: tuple[str, ...] = ("token", "sequence")


@dataclass(frozen=True)
class LossTotals:
    """Counts over everything whose gradients sum into one optimizer step (all micro-batches, all ranks).

    ``tokens`` is the active-token count (``completion_mask`` after any masking), ``sequences`` the
    number of completions, padding-only ones included (TRL's ``grpo`` mean counts them too).
    """

    tokens: float
    sequences: float

    @staticmethod
    def of(completion_mask: Tensor) -> "LossTotals":
        """The totals of one [B, T] mask taken as the whole step."""
        return LossTotals(tokens=float(completion_mask.sum()), sequences=float(completion_mask.size(0)))


@dataclass(frozen=True)
class LossParts:
    """Detached 0-d tensors for logging. Token means count each active token once; at sequence
    level the ratio and clip fractions count each sequence once (as TRL logs them)."""

    policy_loss: Tensor
    """The clipped surrogate alone, this micro-batch's share of it (normalised like the loss)."""
    ratio_mean: Tensor
    """Mean importance ratio pi / pi_old (1.0 on policy)."""
    clip_frac_low: Tensor
    """Fraction clipped from below: ratio < 1 - epsilon_low where the advantage is negative."""
    clip_frac_high: Tensor
    """Fraction clipped from above: ratio > 1 + epsilon_high where the advantage is positive."""
    clip_frac_region: Tensor
    """Fraction where either clip is active (the gradient is zero there)."""
    kl: Tensor | None
    """Mean importance-weighted k3 KL to the reference model; None without ``ref_logps``."""

    def as_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """Non-None parts, keyed ``prefix + name``, ready for ``LightningModule.log_dict``."""
        parts = {prefix + f.name: getattr(self, f.name) for f in fields(self)}
        return {key: value for key, value in parts.items() if value is not None}


def per_token_logps(logits: Tensor, ids: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature)[ids], one row at a time.

    logits: [B, T, V] (position t predicts ids[:, t]: shift before calling), ids: [B, T] -> [B, T]
    float32 (float64 for float64 logits). Dividing by the sampling temperature scores tokens under
    the distribution they were drawn from, as TRL does.

    Memory: looping over rows bounds the float32 temporaries at [T, V] only without grad. With grad,
    ``logsumexp`` saves each row's scaled float32 copy for backward, so B x [T, V] float32 stays
    alive until backward, beside the caller's [B, T, V] logits during the forward. The training
    path avoids both (``rlcode.logprobs.fused_head_logps`` never builds the logits); this
    function is the fallback for heads that cannot be fused.
    """
    import torch

    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}; use 1.0 for greedy-decoded data.")
    if logits.shape[:-1] != ids.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and ids {tuple(ids.shape)} disagree: expected logits [B, T, V] "
            "and ids [B, T] (drop the last position's logits and the first token to align them)."
        )
    rows = []
    for row_logits, row_ids in zip(logits, ids):
        scaled = row_logits.to(torch.promote_types(row_logits.dtype, torch.float32)) / temperature  # [T, V]
        picked = scaled.gather(-1, row_ids.unsqueeze(-1)).squeeze(-1)  # [T]
        rows.append(picked - torch.logsumexp(scaled, dim=-1))  # log_softmax(x)_i = x_i - logsumexp(x)
    return torch.stack(rows)


def mask_truncated(completion_mask: Tensor, truncated: Tensor) -> Tensor:
    """Zero the mask of completions that hit the token limit (DAPO's overlong filtering).

    completion_mask: [B, T], truncated: bool [B] -> [B, T]. A cut-off answer is not wrong, only
    unfinished: without this it is penalised like a wrong one.
    """
    if truncated.shape != completion_mask.shape[:1]:
        raise ValueError(
            f"truncated has shape {tuple(truncated.shape)}, expected [{completion_mask.shape[0]}] "
            "(one flag per completion)."
        )
    return completion_mask * (~truncated.bool()).unsqueeze(1).to(completion_mask.dtype)


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """values [B, T] or [B, 1] (one value per sequence) -> 0-d mean over active tokens / sequences."""
    if values.size(1) == 1 and mask.size(1) != 1:
        return values.mean()
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def _aggregate(per_token: Tensor, mask: Tensor, loss_type: str, max_completion_length: int | None,
               totals: LossTotals) -> Tensor:
    """per_token [B, T], mask [B, T] -> 0-d share of the step's loss, normalised as ``loss_type`` says."""
    masked_sum = per_token * mask  # [B, T]
    if loss_type == "grpo":
        return (masked_sum.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / max(totals.sequences, 1.0)
    if loss_type == "dr_grpo":
        return masked_sum.sum() / (max(totals.sequences, 1.0) * max_completion_length)
    return masked_sum.sum() / max(totals.tokens, 1.0)  # bnpo, dapo


def _check_inputs(
    logps: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    old_logps: Tensor | None,
    ref_logps: Tensor | None,
    loss_type: str,
    level: str,
    beta: float,
    max_completion_length: int | None,
) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r} is not one of {LOSS_TYPES}.")
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"importance_sampling_level={level!r} is not one of {IMPORTANCE_SAMPLING_LEVELS}.")
    if logps.dim() != 2 or completion_mask.shape != logps.shape:
        raise ValueError(
            f"logps {tuple(logps.shape)} and completion_mask {tuple(completion_mask.shape)} must both be [B, T]."
        )
    for name, other in (("old_logps", old_logps), ("ref_logps", ref_logps)):
        if other is not None and other.shape != logps.shape:
            raise ValueError(f"{name} has shape {tuple(other.shape)}, expected logps' {tuple(logps.shape)}.")
    if advantages.shape not in (logps.shape[:1], logps.shape):
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}, expected [B]={tuple(logps.shape[:1])}.")
    if beta != 0.0 and ref_logps is None:
        raise ValueError(f"beta={beta} needs ref_logps (the reference model's log-probs); pass them or set beta=0.")
    if loss_type == "dr_grpo" and (max_completion_length is None or max_completion_length < 1):
        raise ValueError("loss_type='dr_grpo' divides by max_completion_length: pass the generation token limit.")


def policy_loss(
    logps: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    old_logps: Tensor | None = None,
    ref_logps: Tensor | None = None,
    *,
    loss_type: LossType = "dapo",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    importance_sampling_level: ImportanceSamplingLevel = "token",
    max_completion_length: int | None = None,
    totals: LossTotals | None = None,
) -> tuple[Tensor, LossParts]:
    """The clipped GRPO-family surrogate (plus ``beta`` * k3 KL) for one micro-batch.

    Args:
        logps: [B, T] current policy's log-probs of the completion tokens (with grad).
        advantages: [B] one per completion (or [B, T] per token).
        completion_mask: [B, T] 1 for tokens that count (see ``mask_truncated``), 0 for padding.
        old_logps: [B, T] log-probs at generation time, needed when a batch is reused
            (num_iterations > 1). None: the ratio is exactly 1 (its gradient is still d logps).
        ref_logps: [B, T] reference model's log-probs; required when ``beta != 0``.
        loss_type: ``grpo`` | ``bnpo`` | ``dr_grpo`` | ``dapo`` (see the module doc).
        epsilon_low, epsilon_high: clip range [1 - epsilon_low, 1 + epsilon_high].
        beta: weight of the k3 KL term.
        importance_sampling_level: ``token`` or ``sequence`` (GSPO).
        max_completion_length: generation token limit; ``dr_grpo``'s normaliser.
        totals: token and completion counts of the whole optimizer step (all micro-batches, all
            ranks); None: this micro-batch is the whole step.

    Returns:
        loss (0-d, differentiable: this micro-batch's share of the step's loss) and ``LossParts``
        (detached, for logging).
    """
    import torch

    _check_inputs(logps, advantages, completion_mask, old_logps, ref_logps, loss_type,
                  importance_sampling_level, beta, max_completion_length)
    mask = completion_mask.to(logps.dtype)  # [B, T]
    totals = totals or LossTotals.of(completion_mask)
    active = mask.bool()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # [B, 1]
    advantages = advantages.to(logps.dtype)
    old_logps = logps.detach() if old_logps is None else old_logps

    # where(), not *mask: padding may hold -inf log-probs, and inf * 0 is NaN in the gradient.
    log_ratio = torch.where(active, logps - old_logps, 0.0)  # [B, T]
    if importance_sampling_level == "token":
        log_weight = log_ratio  # [B, T]
    else:
        log_weight = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # [B, 1]
    ratio = torch.exp(log_weight)  # [B, T] or [B, 1]
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    surrogate = -torch.min(ratio * advantages, clipped_ratio * advantages)  # [B, T] or [B, 1]
    surrogate = surrogate.expand_as(logps)  # [B, T]

    per_token = surrogate
    kl = None
    if ref_logps is not None:
        ref_minus_logps = torch.where(active, ref_logps - logps, 0.0)  # [B, T]
        per_token_kl = (torch.exp(ref_minus_logps) - ref_minus_logps - 1) * ratio  # [B, T]
        kl = _masked_mean(per_token_kl.detach(), mask)
        if beta != 0.0:
            per_token = surrogate + beta * per_token_kl

    loss = _aggregate(per_token, mask, loss_type, max_completion_length, totals)

    with torch.no_grad():
        is_low = (ratio < 1 - epsilon_low) & (advantages < 0)
        is_high = (ratio > 1 + epsilon_high) & (advantages > 0)
        parts = LossParts(
            policy_loss=_aggregate(surrogate.detach(), mask, loss_type, max_completion_length, totals),
            ratio_mean=_masked_mean(ratio.detach(), mask),
            clip_frac_low=_masked_mean(is_low.to(mask.dtype), mask),
            clip_frac_high=_masked_mean(is_high.to(mask.dtype), mask),
            clip_frac_region=_masked_mean((is_low | is_high).to(mask.dtype), mask),
            kl=kl,
        )
    return loss, parts
