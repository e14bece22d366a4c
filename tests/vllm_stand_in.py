"""A stand-in for the parts of vLLM 0.33's offline API the vLLM backend uses (vllm itself needs CUDA).

It checks what vLLM 0.33 checks where rlcode relies on it (greedy needs n == 1, temperature <= 2),
records what the backend does to it, in order, and behaves like vLLM where that is visible to the
backend: ``LLM()`` seeds the global generators, sample j of a request is drawn with ``seed + j``,
prompts must be token ids, ``load_weights`` takes (name, tensor) pairs named as in the checkpoint.
Completions are random token ids drawn from the request's seed (not a language model).
"""

from __future__ import annotations

import os
import random
import types
from dataclasses import dataclass, field

import numpy
import torch

ENVIRONMENT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "VLLM_ENABLE_V1_MULTIPROCESSING")


@dataclass
class Logprob:
    logprob: float
    rank: int = 1


@dataclass
class Sample:
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[dict[int, Logprob]] | None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[Sample]


class SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
        if not 0 <= kwargs.get("temperature", 1.0) <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {kwargs['temperature']}.")
        if kwargs.get("temperature", 1.0) == 0 and kwargs.get("n", 1) > 1:
            raise ValueError(f"n must be 1 when using greedy sampling, got {kwargs['n']}.")


def sampled_logprob(position: int) -> float:
    """The log-prob the stand-in reports for the sampled token at ``position``."""
    return -0.25 * (1 + position % 3)


@dataclass
class EngineModel:
    """The model inside the engine: keeps every tensor it is given, by name."""

    log: list
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    tensors_per_call: list[int] = field(default_factory=list)

    def load_weights(self, weights):
        weights = list(weights)
        self.tensors_per_call.append(len(weights))
        for name, tensor in weights:
            self.log.append(("load_weights", name))
            self.weights[name] = tensor.detach().clone()
        return {name for name, _ in weights}


class LLM:
    instances: list[LLM] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.log: list[tuple] = [("build",)]
        self.environment = {name: os.environ.get(name) for name in ENVIRONMENT}
        self.default_dtype = torch.get_default_dtype()
        self.default_device = torch.empty(0).device
        self.inference_mode = torch.is_inference_mode_enabled()
        self.autocast = torch.is_autocast_enabled("cpu")
        seed = kwargs.get("seed", 0)  # vLLM's set_random_seed: every global generator
        random.seed(seed)
        numpy.random.seed(seed)
        torch.manual_seed(seed)
        self.model = EngineModel(self.log)
        runner = types.SimpleNamespace(get_model=lambda: self.model)
        self.llm_engine = types.SimpleNamespace(
            model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner)))
        self.prompts: list = []
        self.sampling_params: list = []
        self.autocast_during_generate: list[bool] = []
        self.weights_at_generate: list[dict[str, torch.Tensor]] = []  # what each generate sampled from
        self.tokenizer = _tokenizer_of(kwargs.get("model", ""))  # texts decoded like vLLM's
        LLM.instances.append(self)

    def generate(self, prompts, sampling_params, use_tqdm=True):
        if not isinstance(sampling_params, list) or len(sampling_params) != len(prompts):
            raise AssertionError("expected one SamplingParams per prompt")
        if any(not isinstance(prompt, dict) or "prompt_token_ids" not in prompt for prompt in prompts):
            raise AssertionError("expected token-id prompts")
        self.log.append(("generate",))
        self.prompts.append(prompts)
        self.sampling_params.append(sampling_params)
        self.autocast_during_generate.append(torch.is_autocast_enabled("cpu"))
        self.weights_at_generate.append(dict(self.model.weights))  # pushes replace tensors, never mutate
        return [RequestOutput(list(prompt["prompt_token_ids"]), self._samples(params))
                for prompt, params in zip(prompts, sampling_params)]

    def _samples(self, params) -> list[Sample]:
        samples = []
        for index in range(params.n):
            generator = torch.Generator()
            generator.manual_seed(params.seed + index if params.seed is not None else random.randrange(2**31))
            length = int(torch.randint(1, params.max_tokens + 1, (1,), generator=generator))
            tokens = torch.randint(3, 200, (length,), generator=generator).tolist()
            finished = length < params.max_tokens
            if finished:
                tokens[-1] = params.stop_token_ids[0]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True) if self.tokenizer else f"s{index}"
            logprobs = ([{token: Logprob(sampled_logprob(position))} for position, token in enumerate(tokens)]
                        if params.logprobs == 0 else None)
            samples.append(Sample(index, tokens, text, "stop" if finished else "length", logprobs))
        return list(reversed(samples))  # out of order on purpose: the backend sorts by index

    def reset_prefix_cache(self):
        self.log.append(("reset_prefix_cache",))
        return True

    def sleep(self, level=1):
        self.log.append(("sleep", level))

    def wake_up(self, tags=None):
        self.log.append(("wake_up", tuple(tags or ())))
        return True


def _tokenizer_of(model: str):
    if not os.path.isdir(model):
        return None  # "some/model" in tests that do not look at texts
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def module() -> types.ModuleType:
    """A fresh ``vllm`` stand-in module (put it in sys.modules["vllm"])."""
    stand_in = types.ModuleType("vllm")
    stand_in.LLM, stand_in.SamplingParams = LLM, SamplingParams
    LLM.instances = []
    return stand_in
