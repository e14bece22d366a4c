"""The name of a model's key/value cache in its forward call and output: ``cache`` in transformers 5.x
releases that renamed it, ``past_key_values`` before (and in remote-code models that keep it).

The old name still works in the renamed releases but warns on every call (a FutureWarning from torch's
module call, and once through transformers' logger), which filled every generation's output; it is
due to be removed, so the name is chosen from the model's own forward signature.
"""

from __future__ import annotations

import inspect


def cache_argument(model) -> str:
    """The keyword the model's forward takes its cache by."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps as **kwargs
    try:
        parameters = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def output_cache(output):
    """The cache a forward call returned, read by the name its output class has."""
    fields = getattr(output, "__dataclass_fields__", {})
    return output.cache if "cache" in fields else output.past_key_values
