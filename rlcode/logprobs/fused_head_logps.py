"""Log-probs of sampled tokens through the LM head, a chunk of tokens at a time: no [N, V] logits kept.

    z      = softcap(hidden @ W^T + b) / T          (softcap(x) = cap * tanh(x / cap), Gemma 2; else x)
    logp_i = z_i - logsumexp(z)                     (in float32; float64 for a float64 model)

Forward keeps only the [N] log-probs and log-normalisers. Backward recomputes each chunk's logits and
turns them into their gradient in place:

    d logp_i / d z      = onehot(i) - softmax(z)
    d z / d (h W^T + b) = (1 - tanh^2(x / cap)) / T       (1 / T without soft-capping)

so the memory beyond the model is a few [chunk, V] buffers instead of [B, T, V] logits in the model's
dtype plus their float32 copies, all kept for backward. The idea of TRL's ``ChunkedLogProbFunction``
and Liger's fused linear cross entropy; here chunks run over tokens only (each chunk sees the whole
vocabulary), which keeps it short and pure torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Logit entries per chunk: 64 MB in float32 whatever the vocabulary (110 tokens of Qwen's 152k,
# 341 of SmolLM2's 49k, everything at once for a 512-token toy vocabulary).
CHUNK_ELEMENTS = 1 << 24


def default_chunk_size(vocab_size: int) -> int:
    """Tokens per chunk for a vocabulary of ``vocab_size``: about ``CHUNK_ELEMENTS`` logits."""
    return max(1, CHUNK_ELEMENTS // vocab_size)


def fused_head_logps(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor,
                     temperature: float, softcap: float | None = None, chunk_size: int | None = None) -> torch.Tensor:
    """hidden [N, H], head weight [V, H], bias [V] or None, sampled ids [N] -> [N] float32 log-probs
    (float64 when the projection runs in float64, so a float64 model is exact end to end).

    Under autocast the projection runs in the autocast dtype, as the model's own ``lm_head`` would.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}; use 1.0 for greedy-decoded data.")
    if hidden.dim() != 2 or ids.shape != hidden.shape[:1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and ids {tuple(ids.shape)}: expected [N, H] and [N].")
    chunk = chunk_size or default_chunk_size(weight.size(0))
    if chunk < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk}.")
    device_type = hidden.device.type
    autocast = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if autocast else hidden.dtype
    with torch.autocast(device_type, enabled=False):  # the casts below are explicit, in forward and backward
        return _FusedHeadLogps.apply(hidden, weight, bias, ids, temperature, softcap, chunk, dtype)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precision and float32, float64 for float64: never below float32."""
    return torch.promote_types(dtype, torch.float32)


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
                   softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk: hidden [n, H] -> (z [n, V] float32 or float64, tanh(x / cap) [n, V] or None)."""
    logits = F.linear(hidden, weight, bias)  # [n, V]; a fresh tensor, so in place is safe below
    logits = logits.to(_accumulation_dtype(logits.dtype))
    squashed = None
    if softcap is not None:
        squashed = torch.tanh(logits / softcap)
        logits = squashed * softcap
    return logits.div_(temperature), squashed


class _FusedHeadLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, temperature, softcap, chunk, dtype):
        head_weight = weight.to(dtype)  # cast once, not per chunk (a no-op without autocast)
        head_bias = None if bias is None else bias.to(dtype)
        picked = hidden.new_empty(ids.shape, dtype=_accumulation_dtype(dtype))  # [N]
        log_norm = torch.empty_like(picked)  # [N] logsumexp(z), reused by backward
        for start in range(0, ids.size(0), chunk):
            part = slice(start, start + chunk)
            z, _ = _scaled_logits(hidden[part].to(dtype), head_weight, head_bias, temperature, softcap)
            picked[part] = z.gather(-1, ids[part].unsqueeze(-1)).squeeze(-1)
            log_norm[part] = torch.logsumexp(z, dim=-1)
        ctx.save_for_backward(hidden, weight, bias, ids, log_norm)
        ctx.temperature, ctx.softcap, ctx.chunk, ctx.dtype = temperature, softcap, chunk, dtype
        return picked - log_norm

    @staticmethod
    def backward(ctx, grad_logps):
        hidden, weight, bias, ids, log_norm = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        dtype = ctx.dtype
        accumulate = _accumulation_dtype(dtype)
        grad_logps = grad_logps.to(accumulate)  # [N]
        head_weight = weight.to(dtype)
        head_bias = None if bias is None else bias.to(dtype)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None  # [N, H]
        # float32 sums over chunks: rounding each chunk's share to bf16 first would bias the update
        grad_weight = torch.zeros(weight.shape, dtype=accumulate, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(weight.size(0), dtype=accumulate, device=weight.device) if need_bias else None
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, ids.size(0), ctx.chunk):
                part = slice(start, start + ctx.chunk)
                chunk_hidden = hidden[part].to(dtype)  # [n, H]
                z, squashed = _scaled_logits(chunk_hidden, head_weight, head_bias, ctx.temperature, ctx.softcap)
                upstream = grad_logps[part].unsqueeze(-1)  # [n, 1]
                # z becomes -softmax(z) * g, then + g at the sampled token: d loss / d z, in place
                grad_z = z.sub_(log_norm[part].unsqueeze(-1)).exp_().mul_(-upstream)
                grad_z.scatter_add_(-1, ids[part].unsqueeze(-1), upstream)
                grad_x = grad_z.div_(ctx.temperature)  # [n, V] d loss / d (h W^T + b)
                if squashed is not None:
                    grad_x.mul_(1 - squashed.square_())
                if need_hidden:
                    grad_hidden[part] = (grad_x.to(dtype) @ head_weight).to(hidden.dtype)
                if need_weight:
                    grad_weight.addmm_(grad_x.t(), chunk_hidden.to(accumulate))
                if need_bias:
                    grad_bias.add_(grad_x.sum(0))
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None
