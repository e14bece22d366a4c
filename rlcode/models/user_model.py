"""A model the user built (a notebook's own ``from_pretrained``, 4-bit or not), made ready for training.

The Learner normally loads its policy from ``model_name``; ``Learner.from_pretrained_model(model, tokenizer, mode=...)``
takes one instead. What loading would have done still has to happen: the tokenizer pads on the left
(generation appends on the right) and has a pad token, and with ``lora`` settings a model without
adapters gets them, a quantized one prepared for k-bit training first.
"""

from __future__ import annotations

from rlcode.models.adapters import LoraSettings, apply_lora, is_lora_model, keep_4bit_layers_trainable


def from_pretrained_model(cls, model, tokenizer, **settings):
    """``Learner.from_pretrained_model(model, tokenizer, mode=GRPO(...), lora=..., **settings)``: the module around a model
    you built (a notebook's own 4-bit loading). The tokenizer is set up for batched generation,
    ``lora`` adapters are added if the model has none; model and tokenizer are kept on the module,
    outside its hyperparameters (``model_name`` records where the model came from)."""
    module = cls(model_name=settings.pop("model_name", None) or source_name(model), **settings)
    module.policy, module.tokenizer = prepare_user_model(model, tokenizer, module.hparams.lora)
    return module


def source_name(model) -> str:
    """Where the model came from (a hub id or folder), for the run's records and the vLLM backend."""
    return str(getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", "")
               or "user-model")


def is_quantized(model) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def prepare_user_model(model, tokenizer, lora: LoraSettings | dict | None):
    """(model, tokenizer) ready for training; the tokenizer object is changed in place."""
    if tokenizer is None:
        raise ValueError("Learner.from_pretrained_model needs the model's tokenizer: pass "
                         "AutoTokenizer.from_pretrained(<the same name>)")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token: set tokenizer.pad_token")
        tokenizer.pad_token = tokenizer.eos_token
    if isinstance(lora, dict):
        lora = LoraSettings(**lora)
    if is_quantized(model) and lora is None and not is_lora_model(model):
        raise ValueError("a quantized model trains through adapters: pass lora={'r': 16} (or add peft adapters)")
    if lora is not None and not is_lora_model(model):
        gradient_checkpointing = bool(getattr(model, "is_activation_checkpointing", False)
                                      or getattr(model, "is_gradient_checkpointing", False))
        model = apply_lora(model, lora, quantized=is_quantized(model), gradient_checkpointing=gradient_checkpointing)
    elif is_quantized(model):
        keep_4bit_layers_trainable(model)  # the user's own adapters: apply_lora did not run
    return model, tokenizer
