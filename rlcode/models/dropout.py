"""Dropout off, everywhere in a model: RL scores its own samples and needs a deterministic policy.

Generation runs in eval mode, the loss in train mode. With dropout on, the log-probs the loss sees
are those of a randomly thinned network, not of the policy that sampled: the importance ratio of the
first pass is noise instead of 1, and the KL to the reference is biased. TRL turns dropout off by
default (``disable_dropout``) for the same reason.

Two kinds of dropout exist in transformers models: ``nn.Dropout`` modules (MLP/residual dropout,
peft's ``lora_dropout``) and float rates that attention layers pass to the attention function
(``self.attention_dropout``, used only in train mode). Both are set to 0.
"""

from __future__ import annotations

_RATE_ATTRIBUTES = ("attention_dropout", "dropout", "dropout_p", "attn_dropout", "resid_dropout")


def disable_dropout(model) -> int:
    """Set every dropout probability in ``model`` to 0; returns how many were non-zero."""
    from torch import nn

    changed = 0
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            changed += module.p != 0
            module.p = 0.0
            continue
        for name in _RATE_ATTRIBUTES:
            rate = getattr(module, name, None)
            if isinstance(rate, float) and not isinstance(getattr(type(module), name, None), property):
                changed += rate != 0
                setattr(module, name, 0.0)
    config = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)  # so copies built from the config (e.g. a reference) agree
    return changed
