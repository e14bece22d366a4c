"""Generating completions: the backend interface, prompt rendering, and the backends."""

from rlcode.rollout.base import RolloutBackend, RolloutBatch, SamplingParams
from rlcode.rollout.rendering import render_prompt

__all__ = ["HFGenerateBackend", "RolloutBackend", "RolloutBatch", "SamplingParams", "VLLMBackend", "render_prompt"]


def __getattr__(name: str):
    # Backends import torch (about 1.3 s); `import rlcode.rollout` stays light for commands that only
    # render prompts (tests/test_models.py checks).
    if name == "HFGenerateBackend":
        from rlcode.rollout.hf_backend import HFGenerateBackend

        return HFGenerateBackend
    if name == "VLLMBackend":
        from rlcode.rollout.vllm.backend import VLLMBackend

        return VLLMBackend
    raise AttributeError(f"module 'rlcode.rollout' has no attribute {name!r}")
