"""Choosing the next token from logits: temperature, top-k, top-p, and a fast Gumbel-max draw.

`torch.multinomial` spends most of a small model's decoding step in `aten::exponential_` (70% of
`generate()` for a tiny model with a 49k vocabulary). Gumbel-max gives the same distribution:
argmax(logits / T + G) with G = -log(-log(U)), U ~ Uniform(0, 1), and `torch.rand` is ~4x cheaper.
"""

from __future__ import annotations

import torch


# Nucleus candidates tried before a full sort: a trained model's top-p set is usually far smaller.
_NUCLEUS_PROBE = 256


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Restrict logits to the top-k tokens, then to the smallest set holding `top_p` of the mass.

    logits: [B, V], already divided by the temperature.
    Returns (filtered [B, K], token_ids [B, K] or None). With token_ids None, K = V and the column
    index is the token id. Removed entries are -inf.
    """
    vocabulary = logits.shape[-1]
    if top_k <= 0 and top_p < 1.0 and _NUCLEUS_PROBE < vocabulary:
        # Sorting 49k logits per row costs ~10x the sampling itself; when the best
        # _NUCLEUS_PROBE tokens of every row already hold top_p of the mass, the nucleus lies
        # inside them and the result is exactly the same.
        probe_logits, probe_ids = torch.topk(logits, _NUCLEUS_PROBE, dim=-1)
        probe_probabilities = torch.exp(probe_logits - torch.logsumexp(logits, dim=-1, keepdim=True))
        if bool((probe_probabilities.sum(-1) >= top_p).all()):
            return _nucleus(probe_logits, top_p, probe_probabilities), probe_ids
    if 0 < top_k < vocabulary:
        top_logits, top_ids = torch.topk(logits, top_k, dim=-1)  # sorted descending
        return (_nucleus(top_logits, top_p) if top_p < 1.0 else top_logits), top_ids
    if top_p < 1.0:
        sorted_logits, sort_order = torch.sort(logits, dim=-1, descending=True)
        kept = _nucleus(sorted_logits, top_p)
        return torch.full_like(logits, float("-inf")).scatter(-1, sort_order, kept), None
    return logits, None


def _nucleus(
    sorted_logits: torch.Tensor, top_p: float, probabilities: torch.Tensor | None = None
) -> torch.Tensor:
    """Mask [B, K] logits sorted descending outside the top-p nucleus.

    probabilities: [B, K] under the distribution the nucleus is taken from; by default the softmax
    over the K candidates (the whole vocabulary, or the top-k set as in transformers' warpers).
    """
    if probabilities is None:
        probabilities = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probabilities, dim=-1) - probabilities
    # Keep a token while the better ones hold less than top_p: the best token always stays.
    return sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))


def gumbel_max_sample(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one index per row from softmax(logits) [B, K] -> [B]."""
    uniform = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    # clamp keeps log finite for U == 0, which torch.rand can return
    gumbel = -torch.log(-torch.log(uniform.clamp_min_(torch.finfo(logits.dtype).tiny)))
    return torch.argmax(logits + gumbel, dim=-1)


def next_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Pick the next token id for each row of logits [B, V] -> [B]; temperature 0 is greedy."""
    if temperature == 0:
        return torch.argmax(logits, dim=-1)
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    filtered, token_ids = filter_logits(logits, top_k, top_p)
    choice = gumbel_max_sample(filtered, generator)
    if token_ids is None:
        return choice
    return token_ids.gather(-1, choice.unsqueeze(-1)).squeeze(-1)
