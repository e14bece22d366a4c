"""Loading models and tokenizers: short names (the embedded default, a tiny test model), LoRA, QLoRA."""

from rlcode.models.adapters import LoraSettings, is_lora_model, reference_mode
from rlcode.models.aliases import MODEL_ALIASES, ModelAlias, cache_root
from rlcode.models.dropout import disable_dropout
from rlcode.models.loading import compute_dtype, load_model, load_tokenizer, resolve_model_source, weight_dtype

__all__ = [
    "LoraSettings",
    "MODEL_ALIASES",
    "ModelAlias",
    "cache_root",
    "compute_dtype",
    "disable_dropout",
    "is_lora_model",
    "load_model",
    "load_tokenizer",
    "reference_mode",
    "resolve_model_source",
    "weight_dtype",
]
