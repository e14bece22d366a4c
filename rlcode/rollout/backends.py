"""Pick a generation backend by its config name."""

from __future__ import annotations

from typing import Literal

from rlcode.models import resolve_model_source
from rlcode.rollout.hf_backend import HFGenerateBackend
from rlcode.rollout.openai.backend import OpenAIBackend
from rlcode.rollout.openai.client import OpenAISettings
from rlcode.rollout.vllm.backend import VLLMBackend
from rlcode.rollout.vllm.engine import VLLMSettings
from rlcode.stopping import StopToken

BackendName = Literal["hf", "vllm", "openai"]


def build_backend(name: BackendName, policy, tokenizer, model_name: str, *,
                  vllm: VLLMSettings | dict | None = None, seed: int = 0,
                  openai: OpenAISettings | dict | None = None, rollout_precision: str = "same",
                  stop_token: StopToken | None = None):
    """"hf": ``generate`` on the policy in this process; "vllm": an engine holding its own weights
    (told of weight changes through ``weights_changed()``, pushed before its next generate);
    "openai": a model behind an OpenAI-compatible server (``policy`` may be None: a dry run).

    ``vllm`` (settings or their dict, as hyperparameters restored from a checkpoint hold them) and
    ``seed`` (the engine's base seed) only matter for "vllm"; ``openai`` only for "openai";
    ``rollout_precision`` ("same" or "int8": an int8 copy samples) and ``stop_token`` (the run's
    ``rlcode.stopping.StopToken``: the decode loop ends its rows on it) only for "hf".
    """
    if name == "hf":
        return HFGenerateBackend(policy, tokenizer, rollout_precision=rollout_precision, stop_token=stop_token)
    if name == "vllm":
        settings = VLLMSettings(**vllm) if isinstance(vllm, dict) else vllm
        return VLLMBackend(policy, tokenizer, resolve_model_source(model_name), settings=settings, seed=seed)
    if name == "openai":
        return OpenAIBackend(openai, tokenizer)
    raise ValueError(f"rollout_backend={name!r} is unknown: use 'hf', 'vllm' or 'openai'")
