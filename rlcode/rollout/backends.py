"""Pick a generation backend by its config name."""

from __future__ import annotations

from typing import Literal

BackendName = Literal["hf", "vllm"]


def build_backend(name: BackendName, policy, tokenizer, model_name: str, *,
                  vllm_gpu_memory_utilization: float = 0.3):
    """"hf": ``generate`` on the policy in this process; "vllm": an engine holding its own weights
    (synced from the policy after each optimizer step through ``sync_weights``)."""
    if name == "hf":
        from rlcode.rollout.hf_backend import HFGenerateBackend

        return HFGenerateBackend(policy, tokenizer)
    if name == "vllm":
        from rlcode.models import resolve_model_source
        from rlcode.rollout.vllm_backend import VLLMBackend

        return VLLMBackend(resolve_model_source(model_name), gpu_memory_utilization=vllm_gpu_memory_utilization)
    raise ValueError(f"rollout_backend={name!r} is unknown: use 'hf' or 'vllm'")
