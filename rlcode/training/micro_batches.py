"""The training rows of a step, cut into micro-batches by a row count and, optionally, a token budget.

A packed micro-batch (``rlcode.logprobs.packed_pass``) runs each distinct prompt once plus every
row's completion, so its memory and time follow those tokens, not its rows: a group of 8 rows of
one 200-token prompt and 64-token completions runs 712 tokens where 8 distinct prompts run 2,112.
With ``max_tokens`` set, rows are taken in order (a group's rows are adjacent) while the micro-batch
stays within both bounds; a row over the budget alone runs alone. The count is an upper bound of
what the pass runs: prompts sharing only a prefix (a template, an episode's history) share more.
"""

from __future__ import annotations

import torch
from torch import Tensor


def micro_batches(rows: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, completion_mask: Tensor, *,
                  max_rows: int, max_tokens: int | None = None) -> list[Tensor]:
    """[R] row indices -> consecutive index tensors of at most ``max_rows`` rows and, with ``max_tokens``,
    at most that many tokens (distinct prompts once + completions) unless one row alone has more."""
    if max_tokens is None:
        return list(rows.split(max_rows))
    index = rows.tolist()
    prompts = [tuple(ids) for ids in (prompt_ids[rows] * prompt_mask[rows]).tolist()]  # one host copy each
    completion_tokens = completion_mask[rows].sum(-1).tolist()
    prompt_tokens = prompt_mask[rows].sum(-1).tolist()
    parts: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    tokens = 0
    for position, row in enumerate(index):
        prompt = prompts[position]
        cost = completion_tokens[position] + (0 if prompt in seen else prompt_tokens[position])
        if parts and len(parts[-1]) < max_rows and tokens + cost <= max_tokens:
            parts[-1].append(row)
            tokens += cost
        else:
            parts.append([row])
            seen.clear()
            tokens = completion_tokens[position] + prompt_tokens[position]
        seen.add(prompt)
    return [torch.tensor(part, dtype=rows.dtype, device=rows.device) for part in parts]
