"""The policy's weights as vLLM's ``load_weights`` wants them: checkpoint names, one tensor at a time.

vLLM's model classes load from (name, tensor) pairs named as in the Hugging Face checkpoint
(``model.layers.0.self_attn.q_proj.weight``): the policy's plain weights
(``rlcode.models.plain_weights``: wrapper and peft names removed, LoRA merged out of place so the
frozen base never drifts, a sharded policy's tensors gathered one at a time), each in its own dtype.
Streaming, not a state dict: a push costs one layer's memory, not a second model.

Tied heads: vLLM 0.33 builds a model with ``tie_word_embeddings`` with ``lm_head`` *being*
``model.embed_tokens``; its loader skips ``lm_head.weight`` as an alias and raises (``tied weight is
uninitialized``) unless the embedding comes in the same call. Tied weights come once, under the
embedding's name. A head trained apart from its tied embedding (peft ``modules_to_save=["lm_head"]``
without ``ensure_weight_tying``) has no place in that model, so it is refused before the first push
(``check_servable``); with ``ensure_weight_tying=True`` peft trains one tied copy, streamed once as
``model.embed_tokens.weight``.

Switched-off adapters (peft's ``disable_adapter()``): the stream is what the module computes then,
the base without the LoRA deltas and with the original ``modules_to_save`` modules.

Not supported (a clear error, before training): what has no plain weights (LoRA variants such as
DoRA, peft's trainable tokens) and quantized (bitsandbytes) bases, which vLLM would serve dense.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rlcode.models.plain_weights import check_plain, is_quantized, named_sources, plain_weights

TIED_HEAD = "lm_head.weight"  # an alias of model.embed_tokens.weight in vLLM when tie_word_embeddings


def _ties_head(model) -> bool:
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    return bool(getattr(text_config, "tie_word_embeddings", False))


def check_servable(model: torch.nn.Module) -> None:
    """Raise, with the fix, if vLLM could not load ``model``'s weights (a head untied from its tied
    embedding, a quantized base, weights with no plain form)."""
    quantized = [name for name, parameter in model.named_parameters() if is_quantized(parameter)]
    if quantized:
        raise NotImplementedError(
            f"{quantized[0]} is a bitsandbytes-quantized weight, which cannot be streamed into vLLM: "
            "train without quantization or use the 'hf' rollout backend.")
    try:
        check_plain(model)
    except NotImplementedError as error:
        raise NotImplementedError(f"{error}, or use the 'hf' rollout backend") from None
    if not _ties_head(model):
        return
    for name, target, _ in named_sources(model):
        if target == TIED_HEAD:
            raise NotImplementedError(
                f"{name} is trained apart from the embedding it is tied to (tie_word_embeddings=True, e.g. LoRA "
                "modules_to_save=['lm_head']), but vLLM serves this model with lm_head tied to model.embed_tokens: "
                "set the LoRA extra ensure_weight_tying: true (peft trains one tied copy), leave lm_head out of "
                "modules_to_save, or use the 'hf' rollout backend.")


def streamed_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) for each parameter of ``model``, LoRA merged out of place.

    Yields detached tensors; a merged one is a fresh tensor, any other is the parameter itself
    (gathered when sharded), so nothing is copied but the one layer being merged. The policy is not
    modified. A sharded policy's tensors are gathered one at a time: a collective, so every rank
    streams in the same order.
    """
    check_servable(model)
    yield from plain_weights(model)
