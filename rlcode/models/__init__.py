"""Loading models and tokenizers: short names (the embedded default, a tiny test model), LoRA, QLoRA.

torch, transformers and peft are imported inside the functions that use them (torch alone takes
about 1.3 s): `import rlcode.models` stays light for rlcode-eval and the rewards (tests/test_models.py).
"""

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
