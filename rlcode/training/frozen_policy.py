"""The starting policy, kept to play against: a frozen copy of the weights, or (LoRA) the policy with
its adapters switched off, which is the starting policy since adapters start at zero.

The opponent always samples with transformers' ``generate`` in this process, whatever the rollout
backend: switching adapters off changes the torch module, not an engine holding its own copy of
the weights (vLLM keeps the merged policy), nor a model behind a server.
"""

from __future__ import annotations

import copy

from rlcode.models import is_lora_model, reference_mode
from rlcode.models.sharding import ShardingPlan, shard_from_rank_zero
from rlcode.rollout.hf_backend import HFGenerateBackend


def frozen_copy(policy, plan: ShardingPlan | None = None):
    """A frozen deep copy for full fine-tuning, sharded by ``plan`` under FSDP (taken before the policy
    is sharded: ``Learner.configure_model`` shards it last; rank 0's copy is whole, the others' may be
    empty, on the meta device); None under LoRA (the adapter-free base serves)."""
    if is_lora_model(policy):
        return None
    frozen = copy.deepcopy(policy).requires_grad_(False).eval()
    return shard_from_rank_zero(frozen, plan) if plan is not None else frozen


def frozen_generator(module, frozen):
    """(rendered prompts, seed) -> one completion each from the starting policy, with ``module``'s
    sampling settings."""
    lora = frozen is None
    if not lora and getattr(module, "sharding_plan", None) is None:  # a sharded copy lives on its mesh's device
        frozen = frozen.to(module.device)
    # The opponent samples at the trainer's rollout precision: an int8 copy (of the frozen weights, or of
    # the base: built inside reference_mode) is made once, since nothing tells it the weights changed.
    precision = getattr(module, "hparams", {}).get("rollout_precision", "same")
    backend = HFGenerateBackend(module.policy if lora else frozen, module.tokenizer, rollout_precision=precision,
                                stop_token=module.stop_token)

    def generate(prompts, seed):
        params = module.sampling_params(seed)
        if not lora:
            return backend.generate(prompts, 1, params)
        with reference_mode(module.policy):
            return backend.generate(prompts, 1, params)
    return generate
