"""Per-token log-probabilities of completions under a model, in micro-batches.

A completion's tokens are scored by running the model over prompt + completion and reading the
logits one position earlier: logits at position t predict token t + 1. Only the completion part is
kept (``logits_to_keep`` spares the prompt's share of the vocabulary projection).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcode.algorithms.losses import per_token_logps

if TYPE_CHECKING:
    from torch import Tensor, nn


def completion_logps(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                     completion_mask: Tensor, temperature: float) -> Tensor:
    """[B, P] left-padded prompts + [B, C] right-padded completions -> [B, C] float32 log-probs.

    Gradients flow when called with grad enabled; wrap in ``torch.no_grad()`` for old/ref log-probs.
    """
    import torch

    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, P + C]
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()  # [B, P + C]
    length = completion_ids.size(1)
    # +1: the last prompt position predicts the first completion token; the final position predicts
    # nothing we sampled, so it is dropped.
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=length + 1).logits
    logits = logits[:, :-1, :]  # [B, C, V]
    return per_token_logps(logits, completion_ids, temperature)  # [B, C]


def batched_completion_logps(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor,
                             completion_ids: Tensor, completion_mask: Tensor, temperature: float,
                             micro_batch_size: int) -> Tensor:
    """``completion_logps`` without grad, ``micro_batch_size`` rows at a time -> [B, C]."""
    import torch

    rows = []
    with torch.no_grad():
        for start in range(0, completion_ids.size(0), micro_batch_size):
            part = slice(start, start + micro_batch_size)
            rows.append(completion_logps(model, prompt_ids[part], prompt_mask[part], completion_ids[part],
                                         completion_mask[part], temperature))
    return torch.cat(rows)
