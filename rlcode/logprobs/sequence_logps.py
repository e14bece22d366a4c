"""Per-token log-probabilities of completions under a model, in micro-batches.

A completion's tokens are scored by running the model over prompt + completion and reading the
output one position earlier: position t predicts token t + 1. Only completion tokens are scored.

Memory: the decoder body runs alone and the LM head is applied by ``fused_head_logps`` a chunk of
tokens at a time, so no [B, C, V] logits tensor exists (Qwen's 152k vocabulary made those about
3 GB at micro-batch 4 x 512 tokens, kept for backward). Models whose head we cannot reproduce
exactly (an adapted, quantized or sharded head, logit scaling) take the plain path: the model's own
logits through ``per_token_logps``; a log line says so once.

Positions: prompts are left-padded, so each row's positions are counted from its first real
token (``cumsum(mask) - 1``), as the generation loop does; without them a padded row would be
scored at other positions than it was sampled at.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlcode.algorithms.losses import per_token_logps
from rlcode.logprobs.fused_head_logps import fused_head_logps
from rlcode.logprobs.packed_pass import PackedLayout, packed_layout, packed_outputs, packed_pass_support, row_tokens
from rlcode.models.adapters import is_lora_model
from rlcode.models.sharding import as_forward, gathered

log = logging.getLogger(__name__)

# Config fields that rescale logits after the head (Cohere, Falcon-H1, Granite, ...): plain path.
_LOGIT_SCALES = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")
_reported: set[str] = set()


@dataclass(frozen=True)
class _Head:
    body: nn.Module  # the decoder: input ids -> last hidden states
    weight: Tensor  # [V, H]
    bias: Tensor | None  # [V]
    softcap: float | None


def position_ids(attention_mask: Tensor) -> Tensor:
    """[B, L] mask of left-padded rows -> [B, L] positions counted from each row's first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def completion_logps(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                     completion_mask: Tensor, temperature: float, *, chunk_size: int | None = None,
                     share_prefix: bool = False) -> Tensor:
    """[B, P] left-padded prompts + [B, C] right-padded completions -> [B, C] float32 log-probs (float64
    for a float64 model).

    0 where ``completion_mask`` is 0 (as TRL). Gradients flow when called with grad enabled; wrap in
    ``torch.no_grad()`` for old/ref log-probs. ``chunk_size``: tokens per head chunk (default: about
    16M logits per chunk, see ``fused_head_logps``). ``share_prefix``: run the micro-batch as one
    packed sequence, each prompt prefix the rows share once (``rlcode.logprobs.packed_pass``), where the
    model's attention takes its mask; same log-probs and gradients, one decoder call either way. A
    sharded (FSDP2) model runs it as its root's forward (``rlcode.models.sharding.as_forward``): the
    head's weight whole, its gradients synced.
    """
    return as_forward(model, _completion_logps, prompt_ids, prompt_mask, completion_ids, completion_mask,
                      temperature, chunk_size=chunk_size, share_prefix=share_prefix)


def _completion_logps(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                      completion_mask: Tensor, temperature: float, *, chunk_size: int | None,
                      share_prefix: bool) -> Tensor:
    active = completion_mask.bool()  # [B, C]
    length = completion_ids.size(1)
    head = _fusable_head(model)
    body = head.body if head else model
    layout = _packing(body, prompt_ids, prompt_mask, completion_ids, completion_mask) if share_prefix else None
    if layout is not None:
        outputs = packed_outputs(body, layout, hidden_states=head is not None)  # [A, H] or [A, V]
        if head is None:
            picked = per_token_logps(outputs.unsqueeze(0), completion_ids[active].unsqueeze(0), temperature)[0]
            return picked.new_zeros(active.shape).masked_scatter(active, picked)  # [B, C]
        hidden = outputs
    else:
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, P + C]
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()  # [B, P + C]
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask))
        if head is None:
            # +1: the last prompt position predicts the first completion token; the final position
            # predicts nothing we sampled, so it is dropped.
            logits = model(**inputs, logits_to_keep=length + 1).logits[:, :-1, :]  # [B, C, V]
            return per_token_logps(logits, completion_ids, temperature).masked_fill(~active, 0.0)  # [B, C]
        hidden = head.body(**inputs, use_cache=False).last_hidden_state[:, -length - 1 : -1][active]  # [A, H]
    hidden = hidden.to(head.weight.device)  # a model split over devices may end elsewhere than its head
    picked = fused_head_logps(hidden, head.weight, head.bias, completion_ids[active], temperature,
                              head.softcap, chunk_size)  # [A]
    return picked.new_zeros(active.shape).masked_scatter(active, picked)  # [B, C]


def _packing(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
             completion_mask: Tensor) -> PackedLayout | None:
    """The micro-batch packed as one sequence, or None (the plain pass) where the model cannot take it."""
    longest = prompt_ids.size(1) + completion_ids.size(1)
    reason = packed_pass_support(model, longest)
    if reason is None:
        rows = row_tokens(prompt_ids, prompt_mask, completion_ids, completion_mask)
        if rows is not None:
            return packed_layout(*rows, completion_ids.device)
        reason = "the prompts are not left-padded or the completions not right-padded"
    if reason not in _reported:
        _reported.add(reason)
        log.warning("Prompts are not shared in the training pass (each row runs its whole prompt): %s.", reason)
    return None


def batched_completion_logps(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor,
                             completion_ids: Tensor, completion_mask: Tensor, temperature: float,
                             micro_batch_size: int, *, chunk_size: int | None = None,
                             share_prefix: bool = False) -> Tensor:
    """``completion_logps`` without grad, ``micro_batch_size`` rows at a time -> [B, C]. A sharded model
    is gathered once for all of them (no collective per pass: ranks may run different numbers)."""
    rows = []
    with torch.no_grad(), gathered(model):
        for start in range(0, completion_ids.size(0), micro_batch_size):
            part = slice(start, start + micro_batch_size)
            rows.append(completion_logps(model, prompt_ids[part], prompt_mask[part], completion_ids[part],
                                         completion_mask[part], temperature, chunk_size=chunk_size,
                                         share_prefix=share_prefix))
    return torch.cat(rows)


def _fusable_head(model: nn.Module) -> _Head | None:
    """The decoder body and a plain linear head of a causal LM (peft LoRA unwrapped), or None."""
    causal_lm = model
    if is_lora_model(model):
        config = model.peft_config.get(model.active_adapter)
        if getattr(config, "is_prompt_learning", False):
            return _plain_path("a prompt-learning peft adapter changes the inputs")
        causal_lm = model.get_base_model()  # LoRA layers are injected in place: the body runs them
    get_head = getattr(causal_lm, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if type(head) is not torch.nn.Linear:
        kind = "missing" if head is None else f"{type(head).__module__}.{type(head).__qualname__}"
        return _plain_path(f"the output head is {kind}, not a plain torch.nn.Linear (adapted? quantized?)")
    body = getattr(causal_lm, "base_model", None)  # transformers: the decoder under base_model_prefix
    if body is None or body is causal_lm:
        return _plain_path(f"{type(causal_lm).__name__} exposes no decoder body")
    if type(head.weight) is not torch.nn.Parameter:
        return _plain_path(f"the head's weight is a {type(head.weight).__name__} (sharded?)")
    config = causal_lm.config.get_text_config() if hasattr(causal_lm.config, "get_text_config") else causal_lm.config
    scaled = [name for name in _LOGIT_SCALES if getattr(config, name, None) not in (None, 1, 1.0)]
    if scaled:
        return _plain_path(f"the config scales logits ({', '.join(scaled)})")
    return _Head(body, head.weight, head.bias, getattr(config, "final_logit_softcapping", None))


def _plain_path(reason: str) -> None:
    if reason not in _reported:
        _reported.add(reason)
        log.warning("Completion log-probs use the model's full logits (more memory): %s.", reason)
    return None
