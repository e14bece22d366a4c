"""An int8 copy of the policy to sample rollouts from on CPU (``model.rollout_precision: int8``).

A CPU decode step streams every weight once per token; in fp32 that is the bound (SmolLM2-135M: 538 MB
per step). torch's dynamic int8 quantization (``torch.ao``: int8 weights packed for fbgemm, which uses
the AVX-512 VNNI dot products, activations quantized per call) streams a quarter of the bytes. The
sampler then is not the policy, so the HF backend records the sampler's log-probs of the sampled
tokens and the update weights each token by TRL's truncated importance ratio
(``rlcode.algorithms.importance_correction``).

The copy: a skeleton of the policy's architecture built on the meta device (no allocation), given the
policy's own tensors by name (``rlcode.models.plain_weights`` in fp32: LoRA merged out of place, a
4-bit base dequantized, wrappers' names removed; inside peft's ``disable_adapter()`` the base), then
every ``nn.Linear`` is swapped for a dynamic int8 one, per output channel, in place. Embeddings, norms
and buffers stay the policy's tensors, shared, not copied: the copy adds only the int8 weights
(SmolLM2: ~106 MB), and the copy is rebuilt before any generate that follows a weight change, so
sharing never shows a half-updated policy. The copy has its own config, whose attention is
``shared_prompt_cache``'s: a group's rows read their prompt's keys and values once (equal to SDPA up
to float rounding, which the recorded log-probs include).

Accuracy, measured on SmolLM2-135M-Instruct (a 167-token MBPP prompt and solution, per-channel
weights; mean |log p_policy - log p_int8| of tokens sampled at T=0.7):

    every linear int8, torch's 7-bit activations (reduce_range)     1.97
    MLP down projections kept fp32                                   0.46
    down projections fp32, 8-bit activations on a VNNI CPU           0.24   <- what ``int8`` samples with

The down projections' inputs (SiLU(gate) x up) carry activation outliers that one per-tensor 8-bit
scale flattens, so they stay fp32 (``FP32_LAYERS``; a quarter of the linear weights). torch keeps
activations to 7 bits because AVX2's u8 x s8 pair sums saturate at int16; VNNI accumulates in int32,
so on a CPU with it the eighth bit is free (same speed; ``FullRangeInt8Linear``). The LM head (tied to
the embedding in SmolLM2) is quantized: a separate int8 copy of the tied matrix (+28 MB) makes the
head ~10x cheaper (49152 x 576, a fifth of all weights) for a small share of the mismatch (1.73 ->
1.91 with 7-bit activations and the down projections int8).

On a GPU: torch's dynamic quantization has no CUDA kernels, and torch's own fp8/int8 matmuls
(``_scaled_mm``, ``_int_mm``) made a decode step's linears slower, not faster, on an H200 (a 1.5B
model's, 16-32 rows: ``benchmarks/gpu_check.py``'s ``quantized_linears`` in
``benchmarks/results/gpu_check_2026-11-28.json``), so ``int8`` is refused there. QLoRA (a 4-bit
NF4 base): each base weight is dequantized (bitsandbytes), the adapters' deltas added in fp32, then
quantized to int8 like any other; an 8-bit bitsandbytes base is refused (its int8 format is not fbgemm's).
"""

from __future__ import annotations

import copy
import functools
import logging
import time
import warnings
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from rlcode.errors import SettingError
from rlcode.models.plain_weights import is_peft_model, plain_name, plain_weights
from rlcode.rollout.shared_prompt_cache import use_shared_prompt_attention

logger = logging.getLogger(__name__)

RolloutPrecision = Literal["same", "int8"]
ROLLOUT_PRECISIONS = ("same", "int8")
FP32_LAYERS = ("down_proj",)  # module-name suffixes kept in fp32 (see the module docstring)


def precision_refusal(precision: str, rollout_backend: str, quantization) -> str | None:
    """Why ``precision`` cannot sample with these settings (one line naming the fix), or None."""
    if precision not in ROLLOUT_PRECISIONS:
        return f"model.rollout_precision={precision!r} is unknown: use 'same' or 'int8'"
    if precision == "same":
        return None
    if rollout_backend != "hf":
        return (f"model.rollout_precision int8 quantizes the 'hf' backend's sampler, not rollout_backend "
                f"{rollout_backend!r}: use model.rollout_precision same")
    if quantization is not None and quantization != "4bit":
        return (f"model.rollout_precision int8 dequantizes a 4-bit QLoRA base, not model.quantization="
                f"{quantization!r}: use model.rollout_precision same, or model.quantization 4bit")
    return None


def device_refusal(device: torch.device) -> str | None:
    """int8 sampling runs on CPU only: torch's dynamic quantization has no GPU kernels."""
    if torch.device(device).type == "cpu":
        return None
    return (f"model.rollout_precision int8 runs on CPU only (torch's dynamic int8 quantization has no "
            f"{torch.device(device).type} kernels): use model.rollout_precision same on this device")


class QuantizedSampler:
    """The int8 copy of ``policy``, rebuilt on the first use after ``weights_changed()``.

    ``take_refresh_seconds()`` hands over the time spent rebuilding since it was last asked (the
    trainer logs it as ``perf/sampler_refresh_s``).
    """

    def __init__(self, policy: nn.Module, fp32_layers: tuple[str, ...] = FP32_LAYERS) -> None:
        self.policy = policy
        self.fp32_layers = fp32_layers
        self._model: nn.Module | None = None
        self._refresh_seconds: float | None = None
        self._fallbacks_logged = False

    def weights_changed(self) -> None:
        self._model = None  # dropped now: its shared tensors are already the new weights

    def model(self) -> nn.Module:
        if self._model is None:
            self.refresh()
        return self._model

    def refresh(self) -> None:
        started = time.perf_counter()
        self._model = None  # the old int8 weights are freed before the new ones exist (peak memory)
        self._model, fallbacks = quantized_copy(self.policy, self.fp32_layers)
        if fallbacks and not self._fallbacks_logged:  # one line per run, not one per refresh
            logger.warning("int8 sampler: %d linear layer(s) could not be quantized and sample in fp32: %s",
                           len(fallbacks), "; ".join(fallbacks))
            self._fallbacks_logged = True
        self._refresh_seconds = (self._refresh_seconds or 0.0) + time.perf_counter() - started

    def take_refresh_seconds(self) -> float | None:
        seconds, self._refresh_seconds = self._refresh_seconds, None
        return seconds


def quantized_copy(policy: nn.Module, fp32_layers: tuple[str, ...] = FP32_LAYERS) -> tuple[nn.Module, list[str]]:
    """(int8 copy of ``policy`` in eval mode, ["layer: reason"] of linears left in fp32)."""
    refusal = device_refusal(policy_device(policy))
    if refusal is not None:  # a SettingError: `rlcode fit` prints it as one line
        raise SettingError(refusal)
    model = dense_copy(policy)
    fallbacks = []
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or name.split(".")[-1] in fp32_layers:
            continue
        try:
            quantized = int8_linear(module)
        except Exception as error:  # noqa: BLE001 (any layer torch cannot pack samples in fp32)
            fallbacks.append(f"{name}: {type(error).__name__}: {error}")
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, quantized)
    use_shared_prompt_attention(model)
    return model.eval(), fallbacks


def policy_device(policy: nn.Module) -> torch.device:
    return next(policy.parameters()).device


def int8_linear(module: nn.Linear) -> nn.Module:
    """A dynamic int8 linear (per-output-channel weight scales) computing ``module``."""
    module.qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    with warnings.catch_warnings():  # torch 2.13 marks torch.ao deprecated; it is still its CPU int8 path
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return int8_linear_class().from_float(module)


class FullRangeInt8Linear(torch.ao.nn.quantized.dynamic.Linear):
    """torch's dynamic int8 linear with activations quantized to 8 bits instead of 7 (``reduce_range``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params,
                                                  reduce_range=False).to(x.dtype)


def int8_linear_class() -> type:
    """``FullRangeInt8Linear`` on a CPU with VNNI (int32 accumulation: 8-bit activations cannot saturate),
    else torch's own (7-bit activations, safe for AVX2's int16 pair sums)."""
    return FullRangeInt8Linear if _has_vnni() else torch.ao.nn.quantized.dynamic.Linear


@functools.cache
def _has_vnni() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: assume the worst
        return False
    return any(flag in flags.split() for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))


def dense_copy(policy: nn.Module) -> nn.Module:
    """The policy's architecture as a plain (non-peft) model holding the policy's tensors, LoRA merged.

    Nothing is allocated but the merged LoRA weights (and, in a policy not held in fp32, dequantized
    or cast ones): the other parameters and the buffers are the policy's own.
    """
    base = policy.get_base_model() if is_peft_model(policy) else policy
    with torch.device("meta"):
        skeleton = type(base)(copy.deepcopy(base.config))  # its own config: the attention set below is the copy's
    weights = dict(plain_weights(policy, dtype=torch.float32))  # fbgemm packs fp32 weights only
    _, unexpected = skeleton.load_state_dict(weights, strict=False, assign=True)
    if unexpected:
        raise RuntimeError(f"int8 sampler: the policy has weights its architecture lacks: {unexpected[:3]}")
    _tie_head(skeleton)
    for name, buffer in policy.named_buffers():
        target = plain_name(name)
        owner, _, attribute = target.rpartition(".")
        module = skeleton.get_submodule(owner) if owner else skeleton
        if attribute in module._buffers:
            module._buffers[attribute] = buffer
    left = [name for name, tensor in [*skeleton.named_parameters(), *skeleton.named_buffers()] if tensor.is_meta]
    if left:
        raise RuntimeError(f"int8 sampler: no weights for {left[:3]} in the policy")
    return skeleton.requires_grad_(False)


def _tie_head(model: nn.Module) -> None:
    """A tied LM head comes once, as the embedding (``named_parameters``): point the head at it."""
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight.is_meta and embeddings is not None:
        head.weight = embeddings.weight


def sampling_logps(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T)[token] per row: [B, V], [B] -> [B] float32.

    Over the whole vocabulary, at the sampling temperature: the distribution the trainer scores the
    tokens under (top-k/top-p are not applied there either); greedy rows are scored at T = 1.
    """
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    return scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)

