"""Pick a generation backend by its config name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rlcode.rollout.vllm_engine import VLLMSettings

BackendName = Literal["hf", "vllm"]


def build_backend(name: BackendName, policy, tokenizer, model_name: str, *,
                  vllm: VLLMSettings | dict | None = None, seed: int = 0):
    """"hf": ``generate`` on the policy in this process; "vllm": an engine holding its own weights
    (told of weight changes through ``weights_changed()``, pushed before its next generate).

    ``vllm`` (settings or their dict, as hyperparameters restored from a checkpoint hold them) and
    ``seed`` (the engine's base seed) only matter for "vllm".
    """
    if name == "hf":
        from rlcode.rollout.hf_backend import HFGenerateBackend

        return HFGenerateBackend(policy, tokenizer)
    if name == "vllm":
        from rlcode.models import resolve_model_source
        from rlcode.rollout.vllm_backend import VLLMBackend
        from rlcode.rollout.vllm_engine import VLLMSettings

        settings = VLLMSettings(**vllm) if isinstance(vllm, dict) else vllm
        return VLLMBackend(policy, tokenizer, resolve_model_source(model_name), settings=settings, seed=seed)
    raise ValueError(f"rollout_backend={name!r} is unknown: use 'hf' or 'vllm'")
