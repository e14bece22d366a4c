"""The policy's weights as vLLM's ``load_weights`` wants them: checkpoint names, one tensor at a time.

vLLM's model classes load from (name, tensor) pairs named as in the Hugging Face checkpoint
(``model.layers.0.self_attn.q_proj.weight``). The policy the trainer holds may be named otherwise:

- activation-checkpoint wrappers insert ``_checkpoint_wrapped_module.`` (torch's
  ``checkpoint_wrapper``), ``torch.compile`` inserts ``_orig_mod.``, FSDP ``_fsdp_wrapped_module.``;
- peft prefixes ``base_model.model.``, moves adapted weights under ``.base_layer``, adds
  ``lora_A`` / ``lora_B`` (merged here, never sent), and for ``modules_to_save`` keeps the trained
  copy under ``modules_to_save.<adapter>.`` beside the frozen ``original_module``.

Streaming, not a state dict: one merged tensor exists at a time, so a sync costs one layer's
memory, not a second model. LoRA is merged out of place, ``base + delta`` into a new tensor:
peft's ``merge_adapter()`` / ``unmerge_adapter()`` adds and subtracts the delta in the weights' own
dtype, and in bf16 the round trip does not give the base back, so the frozen base (which is also
the KL reference under LoRA) would drift a little at every sync.

Like TRL, parameters are read with ``named_parameters()``: tied weights come once, under the
embedding's name, and buffers are not sent. Tied heads: vLLM 0.33 builds a model with
``tie_word_embeddings`` with ``lm_head`` *being* ``model.embed_tokens``; its loader skips
``lm_head.weight`` as an alias and raises (``tied weight is uninitialized``) unless the embedding
comes in the same call. A head trained apart from its tied embedding (peft ``modules_to_save=
["lm_head"]`` without ``ensure_weight_tying``) has no place in that model, so it is refused before
the first push (``check_servable``); with ``ensure_weight_tying=True`` peft trains one tied copy,
streamed once as ``model.embed_tokens.weight``.

Switched-off adapters (peft's ``disable_adapter()``): the stream is what the module computes then,
the base without the LoRA deltas and with the original ``modules_to_save`` modules.

Not supported (a clear error): LoRA variants such as DoRA, peft's trainable tokens, and quantized
(bitsandbytes) bases. Sharded (FSDP) parameters are not gathered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from rlcode.models.sharding import full_tensor

# Inserted by wrappers around modules, absent from checkpoint names.
_WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
_PEFT_PREFIX = "base_model.model."
_QUANTIZED_WEIGHT_TYPES = ("Params4bit", "Int8Params")
TIED_HEAD = "lm_head.weight"  # an alias of model.embed_tokens.weight in vLLM when tie_word_embeddings


def checkpoint_name(name: str) -> str:
    """A plain model's parameter name without wrapper segments."""
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def peft_checkpoint_name(name: str, active_adapters: list[str], disabled: bool = False) -> str | None:
    """The checkpoint name of a peft model's parameter, or None when it is not sent to vLLM.

    Not sent: LoRA factors (merged into their base weight), the frozen ``original_module`` of a
    ``modules_to_save`` wrapper (its trained copy replaces it) and other adapters' copies. With the
    adapters switched off (``disabled``) it is the other way round: the original module is sent.
    """
    name = checkpoint_name(name).removeprefix(_PEFT_PREFIX)
    parts = name.split(".")
    if any(part.startswith("lora_") for part in parts):
        return None
    if "trainable_tokens_delta" in parts or "token_adapter" in parts:
        raise NotImplementedError(
            f"{name}: peft trainable tokens cannot be synced to vLLM; use plain LoRA (with modules_to_save) "
            "or the 'hf' rollout backend."
        )
    if "original_module" in parts:
        if not disabled:
            return None
        parts.remove("original_module")
    if "modules_to_save" in parts:
        at = parts.index("modules_to_save")
        if disabled or parts[at + 1] not in active_adapters:
            return None
        parts = parts[:at] + parts[at + 2:]
    return ".".join(part for part in parts if part != "base_layer")


def is_peft_model(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "active_adapters")


def adapters_disabled(model) -> bool:
    """True inside peft's ``disable_adapter()``: the model computes its base, not the trained policy."""
    if not is_peft_model(model):
        return False
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    return any(module.disable_adapters for module in model.modules()
               if isinstance(module, (BaseTunerLayer, AuxiliaryTrainingWrapper)))


def _named_sources(model) -> Iterator[tuple[str, str, torch.nn.Parameter]]:
    """(parameter name, checkpoint name, parameter) of what is streamed, before any merging."""
    if not is_peft_model(model):
        for name, parameter in model.named_parameters():
            yield name, checkpoint_name(name), parameter
        return
    active, disabled = list(model.active_adapters), adapters_disabled(model)
    for name, parameter in model.named_parameters():
        target = peft_checkpoint_name(name, active, disabled)
        if target is not None:
            yield name, target, parameter


def _ties_head(model) -> bool:
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    return bool(getattr(text_config, "tie_word_embeddings", False))


def check_servable(model: torch.nn.Module) -> None:
    """Raise, with the fix, if vLLM could not load ``model``'s weights (a head untied from its tied embedding)."""
    if not _ties_head(model):
        return
    for name, target, _ in _named_sources(model):
        if target == TIED_HEAD:
            raise NotImplementedError(
                f"{name} is trained apart from the embedding it is tied to (tie_word_embeddings=True, e.g. LoRA "
                "modules_to_save=['lm_head']), but vLLM serves this model with lm_head tied to model.embed_tokens: "
                "set the LoRA extra ensure_weight_tying: true (peft trains one tied copy), leave lm_head out of "
                "modules_to_save, or use the 'hf' rollout backend.")


def streamed_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) for each parameter of ``model``, LoRA merged out of place.

    Yields detached tensors; a merged one is a fresh tensor, any other is the parameter itself,
    so nothing is copied but the one layer being merged. The policy is not modified. With the
    adapters switched off it yields the base (nothing merged). A sharded (FSDP) policy's tensors are
    gathered one at a time (``full_tensor``: a collective, so every rank streams in the same order).
    """
    check_servable(model)
    with torch.no_grad():
        merged_by_parameter = {} if not is_peft_model(model) or adapters_disabled(model) \
            else _merged_tensor_makers(model, list(model.active_adapters))
        for name, target, parameter in _named_sources(model):
            make_merged = merged_by_parameter.get(id(parameter))
            if make_merged is None:
                _check_not_quantized(name, parameter)
                yield target, full_tensor(parameter.detach())
            else:
                yield target, full_tensor(make_merged())


def _merged_tensor_makers(model, active: list[str]) -> dict[int, Callable[[], torch.Tensor]]:
    """For each base weight (and bias) under an active LoRA adapter: a function computing it merged."""
    from peft.tuners.lora import LoraLayer

    makers: dict[int, Callable[[], torch.Tensor]] = {}
    for module_name, layer in model.named_modules():
        if not isinstance(layer, LoraLayer):
            continue
        adapters = [name for name in active if name in layer.lora_A or name in layer.lora_embedding_A]
        if not adapters or layer.merged:  # already merged in place by someone else: base is current
            continue
        variants = [name for name in adapters if name in getattr(layer, "lora_variant", {})]
        if variants:
            raise NotImplementedError(
                f"{module_name}: LoRA variant adapters {variants} (e.g. DoRA) cannot be merged for vLLM here; "
                "use plain LoRA or the 'hf' rollout backend."
            )
        base = layer.get_base_layer()
        _check_not_quantized(module_name, base.weight)
        makers[id(base.weight)] = _merged_weight(layer, base, adapters)
        if any(layer.lora_bias.get(name, False) for name in adapters):
            makers[id(base.bias)] = _merged_bias(layer, base, adapters)
    return makers


def _merged_weight(layer, base, adapters: list[str]) -> Callable[[], torch.Tensor]:
    def merged() -> torch.Tensor:
        weight = base.weight.detach()
        # Same arithmetic as peft's safe merge (delta cast to the base dtype, then added), into a new tensor.
        for adapter in adapters:
            weight = weight + layer.get_delta_weight(adapter).to(weight.dtype)
        return weight

    return merged


def _merged_bias(layer, base, adapters: list[str]) -> Callable[[], torch.Tensor]:
    def merged() -> torch.Tensor:
        bias = base.bias.detach()
        for adapter in adapters:
            if layer.lora_bias.get(adapter, False):
                bias = bias + (layer.lora_B[adapter].bias * layer.scaling[adapter]).to(bias.dtype)
        return bias

    return merged


def _check_not_quantized(name: str, tensor: torch.Tensor) -> None:
    if type(tensor).__name__ in _QUANTIZED_WEIGHT_TYPES:
        raise NotImplementedError(
            f"{name} is a bitsandbytes-quantized weight, which cannot be streamed into vLLM: "
            "train without quantization or use the 'hf' rollout backend."
        )
