"""Rollouts with vLLM (GPU only): the interface shape, to be filled in when a GPU recipe needs it."""

from __future__ import annotations

from rlcode.rollout.base import RolloutBatch, SamplingParams


class VLLMBackend:
    """Generate with a vLLM engine colocated with the trainer.

    Args:
        model_name_or_path: what vLLM loads (a local folder or hub id).
        gpu_memory_utilization: share of GPU memory vLLM may take for weights and KV cache.
        dtype: vLLM weight dtype ("auto", "bfloat16", "float16").

    Policy weights must be pushed to the engine after each optimizer step (`sync_weights`).
    """

    def __init__(self, model_name_or_path: str, gpu_memory_utilization: float = 0.3, dtype: str = "auto") -> None:
        try:
            import vllm  # noqa: F401  (heavy, GPU-only: imported only when this backend is chosen)
        except ImportError as error:
            raise ImportError(
                "The vLLM rollout backend needs vllm, which is not installed: `pip install 'rlcode[vllm]'` "
                "on a CUDA machine, or use rollout backend 'hf'."
            ) from error
        self.model_name_or_path = model_name_or_path
        self.gpu_memory_utilization = gpu_memory_utilization
        self.dtype = dtype

    def generate(self, prompts: list[str], num_generations: int, params: SamplingParams) -> RolloutBatch:
        raise NotImplementedError("VLLMBackend.generate is not implemented yet: use HFGenerateBackend.")

    def sync_weights(self, model) -> None:
        raise NotImplementedError("VLLMBackend.sync_weights is not implemented yet.")
