"""A strict stand-in for the parts of vLLM 0.33's offline API the vLLM backend uses (vllm needs CUDA).

Strict: it accepts only what vLLM 0.33 accepts, read from the wheel's source into ``vllm_api.json``
(by ``record_vllm_api.py``, not copied code): the keywords of ``LLM()`` (its parameters and the
``EngineArgs`` fields), the fields of ``SamplingParams`` and the keys of ``TokensPrompt``, the
parameters of ``generate`` / ``sleep`` / ``wake_up`` / ``reset_prefix_cache``, and the weight-name
rules of ``load_weights`` (fused q/k/v and gate/up, the tied ``lm_head`` alias that must come with
its canonical weight in the same call, dropped rotary buffers, no unknown name, the right shape).

It behaves like vLLM where that is visible to the backend: ``LLM()`` seeds the global generators,
freezes the garbage collector's heap, caches ``vllm.envs`` and sets float32 matmul precision (as
vLLM's engine core and GPU worker do); ``SamplingParams`` raises a temperature in (0, 0.01) to 0.01
and refuses > 2 or greedy with n > 1; sample j of a request is drawn with ``seed + j``; a request
without a seed draws its seed from NumPy's global generator (vLLM's sampler states do). Completions
are random token ids drawn from the request's seed (not a language model).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import random
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy
import torch

API = json.loads(Path(__file__).with_name("vllm_api.json").read_text())
ENVIRONMENT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "VLLM_ENABLE_V1_MULTIPROCESSING")
_SAMPLING_DEFAULTS = dict(n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=None,
                          stop_token_ids=None, max_tokens=16, logprobs=None, include_stop_str_in_output=False,
                          skip_special_tokens=True)


def _check_keywords(where: str, given, allowed) -> None:
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise TypeError(f"{where} got unexpected keyword argument(s) {unknown} (not in vLLM {API['version']})")


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
        _check_keywords("SamplingParams", kwargs, API["sampling_params"])
        self.__dict__.update({**_SAMPLING_DEFAULTS, **kwargs})
        if self.seed == -1:
            self.seed = None
        if 0 < self.temperature < API["temperature_min_nonzero"]:  # vLLM warns and raises it
            self.temperature = API["temperature_min_nonzero"]
        if not 0 <= self.temperature <= API["temperature_max"]:
            raise ValueError(f"temperature must be in [0, {API['temperature_max']}], got {self.temperature}.")
        if self.temperature < API["greedy_below"]:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")


def sampled_logprob(position: int) -> float:
    """The log-prob the stand-in reports for the sampled token at ``position``."""
    return -0.25 * (1 + position % 3)


class EngineModel:
    """The model inside the engine: checks names as vLLM's ``load_weights`` does, keeps every tensor by name."""

    def __init__(self, log: list, model_path: str) -> None:
        self.log = log
        self.weights: dict[str, torch.Tensor] = {}
        self.tensors_per_call: list[int] = []
        self.shapes, self.rules, self.architecture = _checkpoint_shapes(model_path)

    def _target(self, name: str) -> str:
        for piece, (fused, _) in self.rules["stacked"].items():
            if piece in name:
                return name.replace(piece, fused, 1)
        return name

    def load_weights(self, weights):
        if self.shapes is None:
            raise AssertionError("the stand-in engine checks weight names against a model folder: build it with one")
        weights = list(weights)
        self.tensors_per_call.append(len(weights))
        loaded, skipped = set(), {}
        parameters = {self._target(name) for name in self.shapes}
        for name, tensor in weights:
            self.log.append(("load_weights", name))
            if any(piece in name for piece in API["dropped_weight_substrings"]):
                continue
            if name in self.rules["tied_aliases"] and self.rules["tied"]:
                skipped[name] = self.rules["tied_aliases"][name]  # vLLM: skipped, its canonical must load
                continue
            target = self._target(name)
            if target not in parameters:
                raise ValueError(f"There is no module or parameter named {name!r} in {self.architecture}")
            if tuple(tensor.shape) != self.shapes[name]:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != the engine's {self.shapes[name]}")
            self.weights[name] = tensor.detach().clone()
            loaded.add(target)
        for alias, canonical in skipped.items():
            if canonical not in loaded:
                raise ValueError(f"{alias!r} was skipped because it is tied to {canonical!r} in {self.architecture}, "
                                 f"but {canonical!r} was not found in the checkpoint, so the tied weight is uninitialized.")
        return loaded


class LLM:
    instances: list[LLM] = []

    def __init__(self, **kwargs):
        if "model" not in kwargs:
            raise TypeError("LLM() missing 1 required argument: 'model'")
        _check_keywords("LLM", kwargs, API["llm_init"])
        for name, allowed in (("logprobs_mode", "logprobs_modes"),
                              ("distributed_executor_backend", "distributed_executor_backends")):
            if name in kwargs and kwargs[name] not in API[allowed]:
                raise ValueError(f"{name}={kwargs[name]!r} is not one of {API[allowed]}")
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
        self.model = EngineModel(self.log, kwargs["model"])
        torch.set_float32_matmul_precision(os.environ.get("VLLM_FLOAT32_MATMUL_PRECISION", "highest"))  # GPU worker
        envs.enable_envs_cache()  # engine core, after start-up
        gc.collect()
        gc.freeze()  # engine core's freeze_gc_heap
        runner = types.SimpleNamespace(get_model=lambda: self.model)
        self.llm_engine = types.SimpleNamespace(
            model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner)))
        self.prompts: list = []
        self.sampling_params: list = []
        self.autocast_during_generate: list[bool] = []
        self.weights_at_generate: list[dict[str, torch.Tensor]] = []  # what each generate sampled from
        self.tokenizer = _tokenizer_of(kwargs["model"])  # texts decoded like vLLM's
        LLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, **kwargs):
        _check_keywords("LLM.generate", kwargs, API["llm_methods"]["generate"])
        if not isinstance(sampling_params, list) or len(sampling_params) != len(prompts):
            raise AssertionError("expected one SamplingParams per prompt")
        for prompt in prompts:
            if not isinstance(prompt, dict) or "prompt_token_ids" not in prompt:
                raise AssertionError("expected token-id prompts")
            _check_keywords("TokensPrompt", prompt, API["tokens_prompt"])
        self.log.append(("generate",))
        self.prompts.append(prompts)
        self.sampling_params.append(sampling_params)
        self.autocast_during_generate.append(torch.is_autocast_enabled("cpu"))
        self.weights_at_generate.append(dict(self.model.weights))  # pushes replace tensors, never mutate
        return [RequestOutput(list(prompt["prompt_token_ids"]), self._samples(params))
                for prompt, params in zip(prompts, sampling_params)]

    def _samples(self, params) -> list[Sample]:
        # vLLM's sampler states: a request without a seed takes one from NumPy's global generator
        seed = params.seed if params.seed is not None else int(numpy.random.randint(0, 2**62))
        samples = []
        for index in range(params.n):
            generator = torch.Generator()
            generator.manual_seed(seed + index)
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

    def reset_prefix_cache(self, **kwargs):
        _check_keywords("LLM.reset_prefix_cache", kwargs, API["llm_methods"]["reset_prefix_cache"])
        self.log.append(("reset_prefix_cache",))
        return True

    def sleep(self, level=1, **kwargs):
        _check_keywords("LLM.sleep", kwargs, API["llm_methods"]["sleep"])
        self.log.append(("sleep", level))

    def wake_up(self, tags=None):
        self.log.append(("wake_up", tuple(tags or ())))
        return True


def _checkpoint_shapes(model: str):
    """The checkpoint's parameter shapes by name (tied weights once), the architecture's rules and name."""
    if not os.path.isdir(model):
        return None, None, None
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model)
    (architecture,) = config.architectures
    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in AutoModelForCausalLM.from_config(config).named_parameters()}
    rules = dict(API["weight_rules"][architecture], tied=bool(getattr(config, "tie_word_embeddings", False)))
    return shapes, rules, architecture


def _tokenizer_of(model: str):
    if not os.path.isdir(model):
        return None  # "some/model" in tests that do not look at texts
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def _envs_module() -> types.ModuleType:
    """``vllm.envs``: read lazily until ``enable_envs_cache()`` freezes the values (as vLLM's does)."""
    module = types.ModuleType("vllm.envs")
    module.cached = False

    def enable_envs_cache():
        module.cached = True

    def disable_envs_cache():
        module.cached = False

    module.enable_envs_cache, module.disable_envs_cache = enable_envs_cache, disable_envs_cache
    module._is_envs_cache_enabled = functools.partial(getattr, module, "cached")
    return module


envs = _envs_module()


def module() -> types.ModuleType:
    """A fresh ``vllm`` stand-in module (put it in sys.modules["vllm"])."""
    global envs
    stand_in = types.ModuleType("vllm")
    envs = _envs_module()
    stand_in.LLM, stand_in.SamplingParams, stand_in.envs = LLM, SamplingParams, envs
    LLM.instances = []
    return stand_in
