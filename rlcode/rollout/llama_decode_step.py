"""The int8 sampler's decode step for llama-family models, as plain tensor operations.

The int8 copy (``quantized_sampler``) shrank a CPU decode step's linears to a quarter of their fp32
time, which left the rest of the step (transformers' modules, RMSNorm, RoPE, the attention's small
products: thousands of operator calls a step, each paying torch's dispatch) as a large share of it. This step runs the same
arithmetic as the model's forward, layer by layer, with fewer calls: torch's fused ``rms_norm`` for
the norms' six operations, RoPE's rotate-half as one ``roll`` with the sine's first half negated
(``x2 * -s`` is ``-x2 * s`` exactly), no decorators, hooks, output objects or mask building, and the
step's mask grouped once for all layers; the attention is the fused kernel's where it is built
(``attention_kernel``), as in the forward. The logits are the forward's bit for bit (tested: an int8
model's dynamic activation scales turn any rounding difference into a different quantized input, so
"close" would hide a wrong operation).

It covers what it computes exactly: llama and qwen2 (q/k/v biases are the linears' own) decoding over
the shared-prompt cache, SiLU MLPs, no sliding window; any other model or cache decodes through the
model's forward. Rotary tables come from the model's own ``rotary_emb`` (its scaling variant included).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlcode.rollout.shared_prompt_cache import (SharedPromptLayer, fused_decode_attention, group_mask,
                                                grouped_decode_attention, shares_prompt_cache)

LLAMA_FAMILY = ("llama", "qwen2")


def runs_llama_decode_step(model, cache) -> bool:
    """Whether ``llama_decode_step`` computes ``model``'s decode step over ``cache`` exactly."""
    config = getattr(model, "config", None)
    layers = getattr(cache, "layers", None)
    if config is None or config.model_type not in LLAMA_FAMILY or not shares_prompt_cache(model):
        return False
    full_attention = all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ())
    return (getattr(config, "hidden_act", None) == "silu" and full_attention and bool(layers)
            and all(type(layer) is SharedPromptLayer for layer in layers))


def llama_decode_step(model, tokens: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
                      cache) -> torch.Tensor:
    """One token per row: tokens [B], attention_mask [B, P + S + 1], positions [B, 1] -> logits [B, V]."""
    body = model.model
    x = body.embed_tokens(tokens.unsqueeze(-1))  # [B, 1, H]
    cos, sin = body.rotary_emb(x, position_ids=positions)  # [B, 1, D] each
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, 1, D]: broadcast over heads
    half = cos.shape[-1] // 2
    signed_sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)

    first = cache.layers[0]
    attention = body.layers[0].self_attn
    per_kv = model.config.num_attention_heads // model.config.num_key_value_heads
    row_mask = None if bool(attention_mask.all()) else attention_mask.bool()  # None: no padding
    grouped_mask = None  # the torch attention's layout of row_mask, built once if the kernel does not apply
    rows, head_dim = tokens.shape[0], attention.head_dim
    for layer, layer_cache in zip(body.layers, cache.layers):
        attention, mlp = layer.self_attn, layer.mlp
        h = _rms_norm(x, layer.input_layernorm)
        q = _rope(attention.q_proj(h).view(rows, 1, -1, head_dim).transpose(1, 2), cos, signed_sin)  # [B, Hq, 1, D]
        k = _rope(attention.k_proj(h).view(rows, 1, -1, head_dim).transpose(1, 2), cos, signed_sin)  # [B, Hkv, 1, D]
        v = attention.v_proj(h).view(rows, 1, -1, head_dim).transpose(1, 2)
        keys, values = layer_cache.update(k, v)  # [B, Hkv, S, D]: this row's generated tokens, the new one last
        o = fused_decode_attention(q, layer_cache, keys, values, row_mask, attention.scaling)  # [B, 1, Hq, D]
        if o is None:
            if row_mask is not None and grouped_mask is None:
                grouped_mask = group_mask(row_mask[:, None, None, :], first.slots, first.prefix_keys.shape[0],
                                          first.group, per_kv)
            o = grouped_decode_attention(q, layer_cache.prefix_keys, layer_cache.prefix_values, keys, values,
                                         layer_cache.slots, layer_cache.group, grouped_mask, attention.scaling)
        x = x + attention.o_proj(o.reshape(rows, 1, -1))
        h = _rms_norm(x, layer.post_attention_layernorm)
        x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
    return model.lm_head(_rms_norm(x, body.norm))[:, -1, :]


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, where rotate_half(x) = [-x2, x1] = roll(x) with its first half negated."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
