"""Rollouts with vLLM, colocated with the trainer on the same GPU.

Not exercised on this CPU-only project machine: the mapping of parameters and outputs is unit-tested
against a stand-in `vllm` module; the engine calls follow vLLM's offline `LLM` API (0.6 - 0.10).
"""

from __future__ import annotations

from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.rollout.base import RolloutBatch, SamplingParams

# Where the engine keeps the torch model, across vLLM versions (V0 engine, then V1 in-process).
_ENGINE_MODEL_PATHS = (
    "llm_engine.model_executor.driver_worker.model_runner.model",
    "llm_engine.model_executor.driver_worker.worker.model_runner.model",
)


class VLLMBackend:
    """Generate with a vLLM engine in this process.

    Args:
        model_name_or_path: what vLLM loads: a local folder (e.g. from
            `rlcode.models.resolve_model_source`) or a hub id.
        gpu_memory_utilization: share of GPU memory vLLM may take for weights and KV cache; the
            trainer needs the rest.
        dtype: vLLM weight dtype ("auto", "bfloat16", "float16").
        max_model_len: longest prompt + completion; None takes the model's limit.
        enable_prefix_caching: reuse the KV cache of a prompt across its G samples and steps.

    After each optimizer step call `sync_weights(policy)` so rollouts come from the current policy.
    """

    def __init__(
        self,
        model_name_or_path: str,
        gpu_memory_utilization: float = 0.3,
        dtype: str = "auto",
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
    ) -> None:
        try:
            import vllm  # heavy, CUDA-only: imported when this backend is chosen
        except ImportError as error:
            raise ImportError(
                "The vLLM rollout backend needs vllm, which is not installed: `pip install 'rlcode[vllm]'` "
                "on a CUDA machine, or use the 'hf' rollout backend."
            ) from error
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=model_name_or_path,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
        )
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: list[str], num_generations: int, params: SamplingParams) -> RolloutBatch:
        """Sample `num_generations` completions per prompt; rows i*G..i*G+G-1 belong to prompt i."""
        if not prompts:
            raise ValueError("generate() got no prompts.")
        if num_generations < 1:
            raise ValueError(f"num_generations={num_generations} must be at least 1.")
        outputs = self.llm.generate(prompts, self._sampling_params(num_generations, params), use_tqdm=False)
        prompt_ids, completion_ids, ended, texts = [], [], [], []
        for request in outputs:
            for sample in sorted(request.outputs, key=lambda sample: sample.index):
                prompt_ids.append(list(request.prompt_token_ids))
                completion_ids.append(list(sample.token_ids))
                ended.append(sample.finish_reason == "stop")  # EOS or a stop string; "length" = truncated
                texts.append(sample.text)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        return batch_from_token_lists(prompt_ids, completion_ids, ended, texts, pad, device="cuda")

    def _sampling_params(self, num_generations: int, params: SamplingParams):
        return self._vllm.SamplingParams(
            n=num_generations,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,  # vLLM's "disabled"
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,  # same text as the HF backend: cut after the stop string
            skip_special_tokens=True,
            seed=params.seed,
        )

    def sync_weights(self, model) -> None:
        """Copy the policy's current weights into the engine (LoRA adapters merged in)."""
        engine_model = self._engine_model()
        engine_model.load_weights(weights=_merged_state_dict(model).items())
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached prompt KV came from the old weights

    def _engine_model(self):
        for path in _ENGINE_MODEL_PATHS:
            target = self.llm
            try:
                for name in path.split("."):
                    target = getattr(target, name)
                return target
            except AttributeError:
                continue
        raise RuntimeError(
            "This vLLM version hides its model from the trainer process; run it in-process "
            "(VLLM_ENABLE_V1_MULTIPROCESSING=0) or pin a vllm version where one of "
            f"{_ENGINE_MODEL_PATHS} exists."
        )


def _merged_state_dict(model) -> dict:
    """The plain transformers state dict of a policy; for peft, with adapters merged into the base."""
    if not hasattr(model, "peft_config"):
        return {name: tensor.detach() for name, tensor in model.state_dict().items()}
    model.merge_adapter()
    try:
        merged = {}
        for name, tensor in model.state_dict().items():
            if "lora_" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            merged[name] = tensor.detach().clone()
        return merged
    finally:
        model.unmerge_adapter()
