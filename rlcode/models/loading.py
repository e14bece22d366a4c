"""Load a causal LM and its tokenizer from a short name, a local folder or a Hugging Face Hub id."""

from __future__ import annotations

import difflib
import logging
import os
from pathlib import Path

from rlcode.models.adapters import LoraSettings, Quantization, apply_lora, quantization_config
from rlcode.models.aliases import (MODEL_ALIASES, QWEN_CODER_ALIAS, SMOLLM2_ALIAS, TINY_RANDOM_ALIAS,
                                   TINY_RANDOM_LARGE_VOCABULARY_ALIAS)
from rlcode.models.embedded_smollm2 import smollm2_folder
from rlcode.models.qwen_coder import qwen_coder_folder
from rlcode.models.tiny_random import tiny_random_folder, tiny_random_large_vocabulary_folder

log = logging.getLogger(__name__)


class ModelNotFound(OSError):
    """A model name that is neither a short name, a local folder nor a Hub id that loads."""


# Lightning precision strings. "-mixed" keeps fp32 master weights (autocast does the rest);
# "-true" stores the weights in the low-precision dtype.
_WEIGHT_DTYPE_NAMES = {
    "32-true": "float32", "32": "float32", "bf16-mixed": "float32", "16-mixed": "float32",
    "bf16-true": "bfloat16", "bf16": "bfloat16", "16-true": "float16", "16": "float16",
    "64-true": "float64", "64": "float64",
}
_offline_reported = False
_ALIAS_FOLDERS = {
    SMOLLM2_ALIAS: smollm2_folder,
    QWEN_CODER_ALIAS: qwen_coder_folder,
    TINY_RANDOM_ALIAS: tiny_random_folder,
    TINY_RANDOM_LARGE_VOCABULARY_ALIAS: tiny_random_large_vocabulary_folder,
}


def weight_dtype(precision: str):
    """The torch dtype the weights are stored in under a Lightning precision string."""
    import torch

    name = _WEIGHT_DTYPE_NAMES.get(str(precision))
    if name is None:
        raise ValueError(
            f"precision={precision!r} is not understood: use one of {sorted(_WEIGHT_DTYPE_NAMES)}."
        )
    return getattr(torch, name)


def compute_dtype(precision: str):
    """The dtype the arithmetic runs in (what QLoRA should dequantize to)."""
    import torch

    precision = str(precision)
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return weight_dtype(precision)


def resolve_model_source(name_or_path: str) -> str:
    """Map a short name to its cached folder (building it if needed); pass anything else through."""
    build = _ALIAS_FOLDERS.get(name_or_path)
    return str(build()) if build is not None else str(name_or_path)


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False):
    """Load a tokenizer ready for batched generation: left padding, a pad token, chat template kept.

    Args:
        name_or_path: a short name from MODEL_ALIASES, a local folder or a Hugging Face Hub id.
        trust_remote_code: allow custom tokenizer code from the hub repository.
    """
    from transformers import AutoTokenizer

    source = resolve_model_source(name_or_path)
    tokenizer = _from_pretrained(AutoTokenizer, source, name_or_path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"  # generation appends on the right; prompts must end aligned
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"Tokenizer of {name_or_path!r} has neither a pad nor an eos token: set one.")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    name_or_path: str,
    *,
    precision: str = "32-true",
    gradient_checkpointing: bool = False,
    lora: LoraSettings | None = None,
    quantization: Quantization | None = None,
    trust_remote_code: bool = False,
    weights: bool = True,
):
    """Load a causal LM for training, optionally with LoRA adapters on a (quantized) base.

    Args:
        name_or_path: a short name from MODEL_ALIASES ("smollm2-135m-instruct", "tiny-random"),
            a local Hugging Face folder, or a hub id such as "Qwen/Qwen2.5-1.5B".
        precision: Lightning precision string; "-true" loads the weights in that dtype, "-mixed"
            keeps fp32 weights.
        gradient_checkpointing: recompute activations in backward to save memory (slower: the forward runs twice).
        lora: adapter settings; None trains every weight.
        quantization: "4bit" (QLoRA, NF4) or "8bit" base weights via bitsandbytes; needs `lora`
            (quantized weights cannot be trained) and a CUDA device.
        trust_remote_code: allow custom model code from the hub repository.
        weights: False builds the same model on the meta device from its config (no weights read, no
            memory): the other ranks of a sharded run, which take rank 0's weights
            (``rlcode.models.sharding.shard_from_rank_zero``).
    """
    from transformers import AutoModelForCausalLM

    if quantization is not None and lora is None:
        raise ValueError("quantization needs LoRA: quantized base weights are frozen; pass lora=LoraSettings().")
    source = resolve_model_source(name_or_path)
    kwargs: dict = {"dtype": weight_dtype(precision), "trust_remote_code": trust_remote_code}
    if quantization is not None:
        kwargs["quantization_config"] = quantization_config(quantization, compute_dtype(precision))
        # bitsandbytes weights cannot be moved after loading: place them on this rank's GPU now (or the
        # CPU, where bitsandbytes >= 0.48 runs 4-bit too: the tests use that).
        kwargs["device_map"] = {"": _quantized_device()}
    if weights:
        model = _from_pretrained(AutoModelForCausalLM, source, name_or_path, **kwargs)
    else:
        if quantization is not None:  # bitsandbytes packs weights as it reads them: nothing to build empty
            raise ValueError("a quantized model cannot be built without its weights (weights=False)")
        model = _on_meta_device(source, name_or_path, dtype=kwargs["dtype"], trust_remote_code=trust_remote_code)
    if gradient_checkpointing:
        _enable_activation_checkpointing(model)
        if lora is not None:
            model.enable_input_require_grads()  # frozen embeddings would cut the checkpointed graph
    if lora is not None:
        model = apply_lora(
            model, lora, quantized=quantization is not None, gradient_checkpointing=gradient_checkpointing
        )
    return model


def _on_meta_device(source: str, requested: str, *, dtype, trust_remote_code: bool):
    """The model ``from_pretrained`` would build, with its generation config, on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = _from_pretrained(AutoConfig, source, requested, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    try:  # the stop tokens and sampling defaults generation reads, as from_pretrained sets them
        model.generation_config = GenerationConfig.from_pretrained(source)
    except OSError:  # the folder has none: from_pretrained keeps the one made from the config too
        pass
    return model


def _quantized_device():
    import torch

    return int(os.environ.get("LOCAL_RANK", 0)) if torch.cuda.is_available() else "cpu"


def _enable_activation_checkpointing(model) -> None:
    # Non-reentrant checkpointing works with frozen inputs (LoRA) and is torch's recommended mode.
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _from_pretrained(auto_class, source: str, requested: str, **kwargs):
    if not Path(source).is_dir() and _hub_offline():
        _report_offline_once("HF_HUB_OFFLINE is set")
    try:
        return auto_class.from_pretrained(source, **kwargs)
    except OSError as error:
        if Path(source).is_dir():
            raise
        _report_offline_once(str(error).splitlines()[0] if str(error) else type(error).__name__)
        close = difflib.get_close_matches(requested, list(MODEL_ALIASES), n=1, cutoff=0.6)
        raise ModelNotFound(
            f"Could not load {requested!r}: it is not a local folder and the Hugging Face Hub copy is "
            f"neither cached nor reachable ({error.__class__.__name__}). Fix: "
            + (f"did you mean {close[0]!r}? " if close else "")
            + f"Use a short name from {sorted(MODEL_ALIASES)}, a local folder, or run once online to fill "
            "the HF cache."
        ) from error


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}


def _report_offline_once(reason: str) -> None:
    global _offline_reported
    if not _offline_reported:
        _offline_reported = True
        log.warning("Hugging Face Hub unavailable (%s): only local folders and cached models load.", reason)


def parameter_count(name_or_path: str, *, trust_remote_code: bool = False) -> int | None:
    """The model's parameter count from its config alone (built on the meta device: no weights read,
    no memory), or None when its config cannot be read here (offline, not cached)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(resolve_model_source(name_or_path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sum(parameter.numel() for parameter in model.parameters())
