"""The policy's plain weights: LoRA merged, a quantized base dequantized, by the base model's names.

What a model without peft, wrappers or quantization needs to compute what the policy computes, one
tensor at a time. Three things take it: the vLLM weight push (``rlcode.rollout.vllm.weights``), the
int8 sampler's copy (``rlcode.rollout.quantized_sampler``) and ``rlcode export --merge``.

Names are the checkpoint's (``model.layers.0.self_attn.q_proj.weight``). The policy's own may differ:

- activation-checkpoint wrappers insert ``_checkpoint_wrapped_module.`` (torch's
  ``checkpoint_wrapper``), ``torch.compile`` inserts ``_orig_mod.``, FSDP ``_fsdp_wrapped_module.``;
- peft prefixes ``base_model.model.``, moves adapted weights under ``.base_layer``, adds
  ``lora_A`` / ``lora_B`` (merged here, never yielded), and for ``modules_to_save`` keeps the trained
  copy under ``modules_to_save.<adapter>.`` beside the frozen ``original_module``.

Parameters are read with ``named_parameters()``: tied weights come once, under the embedding's name,
and buffers are not yielded. With the adapters switched off (peft's ``disable_adapter()``) the weights
are what the module computes then: the base, no deltas, the original ``modules_to_save`` modules.

Streaming, not a state dict: one merged tensor exists at a time, so the caller pays one layer's
memory, not a second model. A sharded (FSDP2) policy's tensors are gathered one at a time (a
collective: every rank must iterate in the same order). LoRA is merged out of place, base + delta
into a new tensor: peft's ``merge_adapter()`` / ``unmerge_adapter()`` adds and subtracts the delta
in the weights' own dtype, and in bf16 the round trip does not give the base back, so the frozen
base (also the KL reference under LoRA) would drift a little at every use.

Dtypes: by default each tensor keeps its own (a dequantized weight takes bitsandbytes' dtype for it,
the compute dtype) and an unmerged one is the parameter itself, not a copy; with ``dtype`` every
tensor is cast to it and merged in it (float64 for export: the merge adds no rounding of its own
before the one rounding to the stored dtype).

Not supported (a clear error): LoRA variants such as DoRA, LoRA on layers other than linear ones and
embeddings, peft's trainable tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn

from rlcode.models.sharding import full_tensor

# Inserted by wrappers around modules, absent from checkpoint names.
_WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
_PEFT_PREFIX = "base_model.model."
_QUANTIZED_WEIGHT_TYPES = ("Params4bit", "Int8Params")  # bitsandbytes' 4-bit and 8-bit weights

# One LoRA layer's merge of one of its base tensors: (the whole tensor, dtype or None) -> the merged tensor.
Merge = Callable[[torch.Tensor, torch.dtype | None], torch.Tensor]


def plain_weights(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, whole plain tensor) for each parameter of ``model``, lazily: a sharded tensor
    is gathered when its turn comes, a merge computed then.

    The policy is not modified. ``dtype``: None keeps each tensor's own dtype (merges in it, as
    peft's safe merge does); a dtype casts every tensor to it and merges in it.
    """
    merges = {} if not is_peft_model(model) or adapters_disabled(model) else _lora_merges(model)
    quantized_owners = {id(module.weight): module for module in model.modules()
                        if is_quantized(getattr(module, "weight", None))}
    with torch.no_grad():
        for _, target, parameter in named_sources(model):
            owner = quantized_owners.get(id(parameter))
            tensor = _whole(parameter, dtype) if owner is None else _dequantized(owner, dtype)
            merge = merges.get(id(parameter))
            yield target, tensor if merge is None else merge(tensor, dtype)


def check_plain(model: nn.Module) -> None:
    """Raise NotImplementedError, naming the layer and the fix, where ``plain_weights(model)`` would:
    before the first use, and without computing anything."""
    if is_peft_model(model) and not adapters_disabled(model):
        _lora_merges(model)
    for _ in named_sources(model):
        pass


def lora_delta(a: torch.Tensor, b: torch.Tensor, scaling: float, transposed: bool) -> torch.Tensor:
    """An adapter's update of its base weight, peft's formula: (B A)^T? x scaling.

    a: [r, in], b: [out, r] -> [out, in]; transposed -> [in, out] (a ``fan_in_fan_out`` weight,
    or an embedding: A is [r, vocab], B is [dim, r], the weight [vocab, dim]). In a's and b's dtype.
    """
    delta = b @ a
    return (delta.T if transposed else delta) * scaling


def is_quantized(tensor) -> bool:
    return type(tensor).__name__ in _QUANTIZED_WEIGHT_TYPES


def checkpoint_name(name: str) -> str:
    """A plain model's parameter name without wrapper segments."""
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def plain_name(name: str) -> str:
    """A parameter's or buffer's name in the base model: wrapper segments and peft's prefix removed."""
    return checkpoint_name(name).removeprefix(_PEFT_PREFIX)


def peft_checkpoint_name(name: str, active_adapters: list[str], disabled: bool = False) -> str | None:
    """The checkpoint name of a peft model's parameter, or None when it is not a plain weight.

    Not one: LoRA factors (merged into their base weight), the frozen ``original_module`` of a
    ``modules_to_save`` wrapper (its trained copy replaces it) and other adapters' copies. With the
    adapters switched off (``disabled``) it is the other way round: the original module is one.
    """
    name = plain_name(name)
    parts = name.split(".")
    if any(part.startswith("lora_") for part in parts):
        return None
    if "trainable_tokens_delta" in parts or "token_adapter" in parts:
        raise NotImplementedError(
            f"{name}: peft trainable tokens have no plain weights here; use plain LoRA (with modules_to_save)")
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


def named_sources(model: nn.Module) -> Iterator[tuple[str, str, nn.Parameter]]:
    """(parameter name, checkpoint name, parameter) of each plain weight, before any merging."""
    if not is_peft_model(model):
        for name, parameter in model.named_parameters():
            yield name, checkpoint_name(name), parameter
        return
    active, disabled = list(model.active_adapters), adapters_disabled(model)
    for name, parameter in model.named_parameters():
        target = peft_checkpoint_name(name, active, disabled)
        if target is not None:
            yield name, target, parameter


def _whole(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The whole tensor in ``dtype``: gathered, then cast (a float64 shard would gather twice the bytes)."""
    whole = full_tensor(tensor.detach())
    return whole if dtype is None else whole.to(dtype)


def _dequantized(module: nn.Module, dtype: torch.dtype | None) -> torch.Tensor:
    """A bitsandbytes layer's weight as its forward computes with it: [out, in], bitsandbytes' dtype or ``dtype``."""
    from peft.utils.integrations import dequantize_module_weight

    weight = dequantize_module_weight(module).detach()
    return weight if dtype is None else weight.to(dtype)


def _lora_merges(model: nn.Module) -> dict[int, Merge]:
    """For each base weight (and bias) under an active LoRA adapter: its merge, keyed by id(parameter)."""
    from peft.tuners.lora import LoraLayer

    active = list(model.active_adapters)
    merges: dict[int, Merge] = {}
    for module_name, layer in model.named_modules():
        if not isinstance(layer, LoraLayer):
            continue
        adapters = [name for name in active if name in layer.lora_A or name in layer.lora_embedding_A]
        if not adapters or layer.merged:  # already merged in place by someone else: the base is current
            continue
        _check_mergeable(module_name, layer, adapters)
        base = layer.get_base_layer()
        merges[id(base.weight)] = functools.partial(_merged_weight, layer, adapters)
        if any(layer.lora_bias.get(name, False) for name in adapters):
            if base.bias is None:
                raise NotImplementedError(f"{module_name}: a LoRA bias on a layer without one has no plain weight")
            merges[id(base.bias)] = functools.partial(_merged_bias, layer, adapters)
    return merges


def _check_mergeable(module_name: str, layer, adapters: list[str]) -> None:
    variants = [name for name in adapters if name in getattr(layer, "lora_variant", {})]
    if variants:
        raise NotImplementedError(
            f"{module_name}: LoRA variant adapters {variants} (e.g. DoRA) cannot be merged into plain weights "
            "here; use plain LoRA")
    base = layer.get_base_layer()
    # fan_in_fan_out: transformers' Conv1D (GPT-2), a linear layer stored [in, out]
    if not isinstance(base, (nn.Linear, nn.Embedding)) and not getattr(layer, "fan_in_fan_out", False):
        raise NotImplementedError(
            f"{module_name}: LoRA on a {type(base).__name__} cannot be merged into plain weights here; "
            "adapt linear layers and embeddings only")


def _factors(layer, adapter: str) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(A, B, transposed) of one adapter of a linear layer or an embedding (see ``lora_delta``)."""
    if adapter in layer.lora_A:
        return layer.lora_A[adapter].weight, layer.lora_B[adapter].weight, getattr(layer, "fan_in_fan_out", False)
    return layer.lora_embedding_A[adapter], layer.lora_embedding_B[adapter], True


def _merged_weight(layer, adapters: list[str], weight: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The whole base weight plus each adapter's delta (in ``dtype``, else the factors' own dtype), cast to
    the weight's dtype and added: peft's safe merge, into a new tensor."""
    for adapter in adapters:
        a, b, transposed = _factors(layer, adapter)
        delta = lora_delta(_whole(a, dtype), _whole(b, dtype), layer.scaling[adapter], transposed)
        weight = weight + delta.to(weight.dtype)
    return weight


def _merged_bias(layer, adapters: list[str], bias: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The base bias [out] plus each biased adapter's B bias x scaling."""
    for adapter in adapters:
        if layer.lora_bias.get(adapter, False):
            bias = bias + (_whole(layer.lora_B[adapter].bias, dtype) * layer.scaling[adapter]).to(bias.dtype)
    return bias
