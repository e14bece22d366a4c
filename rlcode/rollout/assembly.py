"""Building a RolloutBatch from per-row token lists: the padding conventions in one place."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlcode.rollout.base import RolloutBatch


def batch_from_token_lists(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    ended: Sequence[bool],
    completion_texts: list[str],
    pad_token_id: int,
    device: torch.device | str = "cpu",
    sampling_logps: Sequence[Sequence[float]] | None = None,
) -> RolloutBatch:
    """Pad prompts on the left and completions on the right, and derive masks and flags.

    Args:
        prompt_ids: N prompt token lists (one per row, already repeated per generation).
        completion_ids: N completion token lists, every kept token (EOS / stop token included).
        ended: N flags, True when the row ended by EOS or a stop string (else it was truncated).
        completion_texts: N decoded completions.
        pad_token_id: the id written into padding.
        device: where the tensors go.
        sampling_logps: N lists of the sampler's log-prob per completion token, or None.
    """
    rows = len(prompt_ids)
    if not rows == len(completion_ids) == len(ended) == len(completion_texts):
        raise ValueError("prompt_ids, completion_ids, ended and completion_texts must have one entry per row.")
    prompt_width = max((len(ids) for ids in prompt_ids), default=1)  # no rows: [0, 1] tensors
    # At least one column, so an all-empty batch still has [N, 1] tensors with a zero mask.
    completion_width = max(1, max((len(ids) for ids in completion_ids), default=1))
    prompt_tensor = torch.full((rows, prompt_width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, prompt_width), dtype=torch.long)
    completion_tensor = torch.full((rows, completion_width), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((rows, completion_width), dtype=torch.long)
    for row, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids)):
        if prompt:
            prompt_tensor[row, prompt_width - len(prompt):] = torch.as_tensor(prompt)
            prompt_mask[row, prompt_width - len(prompt):] = 1
        if completion:
            completion_tensor[row, : len(completion)] = torch.as_tensor(completion)
            completion_mask[row, : len(completion)] = 1
    logps_tensor = None
    if sampling_logps is not None:
        if len(sampling_logps) != rows or any(len(a) != len(b) for a, b in zip(sampling_logps, completion_ids)):
            raise ValueError("sampling_logps must have one log-prob per completion token of every row.")
        logps_tensor = torch.zeros((rows, completion_width), dtype=torch.float32)
        for row, values in enumerate(sampling_logps):
            if values:
                logps_tensor[row, : len(values)] = torch.as_tensor(values, dtype=torch.float32)
        logps_tensor = logps_tensor.to(device)
    return RolloutBatch(
        prompt_ids=prompt_tensor.to(device),
        prompt_mask=prompt_mask.to(device),
        completion_ids=completion_tensor.to(device),
        completion_mask=completion_mask.to(device),
        completion_texts=list(completion_texts),
        truncated=torch.tensor([not flag for flag in ended], dtype=torch.bool, device=device),
        num_generated_tokens=int(completion_mask.sum()),
        sampling_logps=logps_tensor,
    )
