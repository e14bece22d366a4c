"""LoRA and QLoRA: settings, applying them, and the adapter-free reference policy.

With LoRA the frozen base model *is* the reference policy of the KL term: disabling the adapter
gives it back without keeping a second copy of the weights in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ContextManager, Literal

from rlcode.setting import COUNT, FRACTION_BELOW_ONE, field_of

Quantization = Literal["4bit", "8bit"]


@dataclass
class LoraSettings:
    """LoRA adapter settings (peft's LoraConfig, reduced to what a recipe needs).

    Args:
        r: rank of the low-rank update.
        alpha: scaling numerator; the update is scaled by alpha / r.
        dropout: dropout on the adapter input. 0 by default: RL scores the policy's own samples,
            and any dropout makes those scores differ from the sampling policy (see
            ``rlcode.models.dropout``); GRPO turns it off anyway unless ``disable_dropout=False``.
        target_modules: module names to adapt, or "all-linear" for every linear layer except the
            output head.
    """

    r: Annotated[int, field_of(COUNT)] = 16
    alpha: Annotated[int, field_of(COUNT)] = 32
    dropout: Annotated[float, field_of(FRACTION_BELOW_ONE)] = 0.0
    target_modules: str | Sequence[str] = "all-linear"
    extra: dict[str, Any] = field(default_factory=dict)


def apply_lora(model, settings: LoraSettings, *, quantized: bool, gradient_checkpointing: bool):
    """Wrap `model` in a peft LoRA model; for a quantized base, prepare it for k-bit training first."""
    import peft  # slow import: only when LoRA is asked for

    if quantized:
        keep_4bit_layers_trainable(model)
        model = peft.prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    targets = settings.target_modules
    config = peft.LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        task_type="CAUSAL_LM",
        **settings.extra,
    )
    return peft.get_peft_model(model, config)


def keep_4bit_layers_trainable(model) -> None:
    """Stop bitsandbytes from repacking 4-bit weights into its inference-only CPU layout.

    On a CPU with AVX512-BF16, bitsandbytes (0.50.2 here) repacks a Linear4bit weight in place the first
    time the layer runs in eval mode without gradients. The packed weight has no backward, so the
    next training step fails ("a view of a leaf Variable ... in-place operation"). RL alternates
    generation and evaluation with training on the same layers, so the repacking is turned off here
    and a weight packed already (a model the user ran before handing it over) is unpacked.
    """
    for module in model.modules():
        if not hasattr(module, "support_avx512bf16_for_cpu"):
            continue
        module.support_avx512bf16_for_cpu = False
        weight = module.weight
        if getattr(getattr(weight, "quant_state", None), "packing_format_for_cpu", False):
            from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

            weight.data, weight.quant_state = _convert_weight_packed_for_cpu_inverse(weight.data, weight.quant_state)


def quantization_config(quantization: Quantization, compute_dtype):
    """transformers' BitsAndBytesConfig for QLoRA: NF4 double-quantized 4-bit, or 8-bit.

    Quantizing at load time (not Lightning's BitsandbytesPrecision) leaves the LoRA adapters,
    added afterwards, in full precision.
    """
    from transformers import BitsAndBytesConfig

    if quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"quantization={quantization!r} is not supported: use '4bit', '8bit' or None.")


def is_lora_model(model) -> bool:
    """True when `model` carries peft adapters that can be switched off."""
    return callable(getattr(model, "disable_adapter", None)) and hasattr(model, "peft_config")


def reference_mode(model) -> ContextManager | None:
    """A context in which `model` computes the reference policy (adapters off), or None without LoRA.

    None tells the caller it needs a separate frozen reference model for the KL term.
    """
    if not is_lora_model(model):
        return None
    return model.disable_adapter()
