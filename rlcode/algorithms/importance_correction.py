"""Correcting the policy loss for sampling with a different engine: TRL's truncated importance sampling.

vLLM samples with its own kernels, usually in bf16, so the distribution the completions were drawn
from (the sampler's, log-probs ``sampler_logps``) is not exactly the trainer's policy at that moment
(``trainer_logps``: the policy's log-probs of the same tokens before the update). The clipped
surrogate assumes samples from the trainer's policy; TRL weights each token's surrogate by the
importance ratio between the two, truncated from above so that a token the sampler found much less
likely than the trainer cannot dominate the step (TRL 1.16 ``vllm_importance_sampling_mode=
"token_truncate"``, ``vllm_importance_sampling_clip_max=3.0``):

    w_t = min(exp(trainer_logp_t - sampler_logp_t), cap)          (no gradient flows through w)
    per_token_loss_t = w_t * surrogate_t + beta * kl_t            (the KL term is not weighted)

Tokens whose sampler log-prob is NaN (vLLM gave none) get w = 1, no correction, as in TRL.

``corrected_advantages`` applies the weight through the advantages, so the loss function needs no
change: for w >= 0, -min(r * A * w, clip(r) * A * w) = w * -min(r * A, clip(r) * A), i.e. the clipped
surrogate with advantage A * w is exactly w times the surrogate with A, and the KL term does not
involve A.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

DEFAULT_CAP = 3.0


def truncated_importance_weights(trainer_logps: Tensor, sampler_logps: Tensor, mask: Tensor,
                                 cap: float = DEFAULT_CAP) -> Tensor:
    """Per-token weights min(exp(trainer - sampler), cap).

    trainer_logps: [B, T] the policy's log-probs of the sampled tokens at sampling time (no grad).
    sampler_logps: [B, T] the sampler's log-probs of the same tokens (NaN: unknown).
    mask: [B, T] 1 on completion tokens; padding gets weight 1 (it is masked out of the loss anyway).
    Returns [B, T] float32 (float64 for float64 log-probs), detached.
    """
    import torch

    if not trainer_logps.shape == sampler_logps.shape == mask.shape:
        raise ValueError(f"trainer_logps {tuple(trainer_logps.shape)}, sampler_logps {tuple(sampler_logps.shape)} "
                         f"and mask {tuple(mask.shape)} must all be [B, T].")
    if cap < 1:
        raise ValueError(f"cap={cap} is below 1, which would down-weight every token: use e.g. TRL's 3.0.")
    return torch.exp(log_ratios(trainer_logps, sampler_logps, mask)).clamp(max=cap)  # [B, T]


def log_ratios(trainer_logps: Tensor, sampler_logps: Tensor, mask: Tensor) -> Tensor:
    """trainer - sampler per token [B, T], detached; 0 on padding and where the sampler gave none (NaN)."""
    import torch

    dtype = torch.promote_types(trainer_logps.dtype, torch.float32)
    difference = trainer_logps.detach().to(dtype) - sampler_logps.to(trainer_logps.device, dtype)  # [B, T]
    # where(), not *mask: padding may hold -inf or NaN; nan_to_num: NaN -> 0 (ratio 1), -inf -> very negative
    return torch.nan_to_num(torch.where(mask.bool(), difference, 0.0), nan=0.0)


def corrected_advantages(advantages: Tensor, weights: Tensor) -> Tensor:
    """advantages [B] (one per completion) x weights [B, T] -> per-token advantages [B, T]."""
    if advantages.dim() != 1 or weights.dim() != 2 or weights.size(0) != advantages.size(0):
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [B] and weights {tuple(weights.shape)} [B, T].")
    return advantages.unsqueeze(1) * weights.to(advantages.dtype)


def weight_metrics(weights: Tensor, mask: Tensor, cap: float = DEFAULT_CAP,
                   ratios: Tensor | None = None) -> dict[str, float]:
    """Mean, min and max weight over completion tokens, and the fraction truncated at the cap; with
    ``ratios`` (``log_ratios``), the mean and max |log ratio| per token: how far the sampler is."""
    active = weights[mask.bool()]
    if active.numel() == 0:
        return {}
    mismatch = {} if ratios is None else {
        "importance_log_ratio_abs_mean": float(ratios[mask.bool()].abs().mean()),
        "importance_log_ratio_abs_max": float(ratios[mask.bool()].abs().max()),
    }
    return {**mismatch,
        "importance_weight_mean": float(active.mean()),
        "importance_weight_min": float(active.min()),
        "importance_weight_max": float(active.max()),
        "importance_weight_capped_frac": float((active >= cap).float().mean()),
    }
