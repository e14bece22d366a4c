"""The starting policy, kept to play against: a frozen copy of the weights, or (LoRA) the base with
the adapters switched off, which is the starting policy since adapters start at zero."""

from __future__ import annotations

import copy


def frozen_copy(policy):
    """A frozen deep copy for full fine-tuning; None under LoRA (the adapter-free base serves)."""
    from rlcode.models import is_lora_model

    return None if is_lora_model(policy) else copy.deepcopy(policy).requires_grad_(False).eval()


def frozen_generator(module, frozen):
    """(rendered prompts, seed) -> one completion each from the starting policy, with ``module``'s
    sampling settings."""
    from rlcode.models import reference_mode
    from rlcode.rollout.hf_backend import HFGenerateBackend

    backend = HFGenerateBackend(frozen.to(module.device), module.tokenizer) if frozen is not None else None

    def generate(prompts, seed):
        params = module.sampling_params(seed)
        if backend is not None:
            return backend.generate(prompts, 1, params)
        with reference_mode(module.policy):
            return module.backend.generate(prompts, 1, params)
    return generate
