"""Turning rlcode's sampling settings into vLLM requests, and vLLM's outputs into a RolloutBatch.

Rules that differ from the HF backend because vLLM 0.33 refuses what it accepts, decided here:

- temperature 0 (greedy) with G > 1: vLLM raises (``n must be 1 when using greedy sampling``).
  Greedy decoding is deterministic, so rlcode asks vLLM for one completion per prompt and repeats
  it G times: the same rows the HF backend returns.
- temperature > 2: vLLM raises (``temperature must be in [0, 2]``). rlcode raises too, at the first
  generate, with the fix; clamping silently would sample from a different distribution than the
  trainer scores the tokens under.
- temperature in (0, 0.01): vLLM raises it to 0.01 (with a warning) while the trainer would score
  the tokens at the configured value: refused, with the fix.
- top_p < 1 or top_k > 0 with the importance-sampling correction: vLLM's processed log-probs are
  renormalised over the kept tokens while the trainer scores the full vocabulary, so every weight
  exp(trainer - sampler) is biased below 1 (TRL has the same bias): refused, with the fix. (rlcode
  has no min_p; vLLM's default 0 is sent.) Greedy decoding trains nothing and is always allowed.

Seeds: one ``SamplingParams`` per prompt, each with its own seed, always: a request without one
would take its seed from NumPy's global generator (vLLM's sampler does), moving the trainer's
random state. A step without a seed draws its start from the backend's own generator. With a single seed for the batch,
vLLM 0.33 seeds sample j of every request with ``seed + j``, so row j of every group would share
its draws and two identical prompts would get identical groups. Prompt i gets ``start + i * G``
(``start`` a hash of the step's seed), so the ``seed + j`` of its G samples never meets another
prompt's.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.rollout.base import RolloutBatch, SamplingParams

MAX_VLLM_TEMPERATURE = 2.0
MIN_VLLM_TEMPERATURE = 0.01  # vLLM raises a temperature in (0, this) to this
_SEED_RANGE = 2**62  # start + i * G stays inside int64 for any realistic batch


@dataclass(frozen=True)
class RequestPlan:
    """How G completions per prompt are obtained from vLLM."""

    samples_per_request: int
    """``n`` of each prompt's SamplingParams."""
    copies_per_sample: int
    """How many rows each returned sample fills (G for greedy decoding, else 1)."""


def plan_requests(params: SamplingParams, num_generations: int, importance_correction: bool = False) -> RequestPlan:
    check_sampling(params, importance_correction)
    if params.greedy and num_generations > 1:
        return RequestPlan(samples_per_request=1, copies_per_sample=num_generations)
    return RequestPlan(samples_per_request=num_generations, copies_per_sample=1)


def check_sampling(params: SamplingParams, importance_correction: bool) -> None:
    """Refuse, with the fix, settings vLLM would change or that would bias the importance correction."""
    if params.temperature > MAX_VLLM_TEMPERATURE:
        raise ValueError(f"temperature={params.temperature} is above {MAX_VLLM_TEMPERATURE}, which vLLM refuses: "
                         f"use a temperature <= {MAX_VLLM_TEMPERATURE} or the 'hf' rollout backend.")
    if 0 < params.temperature < MIN_VLLM_TEMPERATURE:
        raise ValueError(f"temperature={params.temperature} is below {MIN_VLLM_TEMPERATURE}, which vLLM raises to "
                         f"{MIN_VLLM_TEMPERATURE} while the trainer scores at {params.temperature}: use 0 (greedy) "
                         f"or a temperature >= {MIN_VLLM_TEMPERATURE}.")
    truncating = [f"{name}={value}" for name, value, off in (("top_p", params.top_p, 1.0), ("top_k", params.top_k, 0))
                  if value != off]
    if importance_correction and truncating and not params.greedy:
        raise ValueError(f"{', '.join(truncating)} with vllm importance_sampling_correction: vLLM's log-probs are "
                         "renormalised over the kept tokens while the trainer scores the whole vocabulary, which biases "
                         "the weights below 1. Use top_p 1 and top_k 0, or vllm importance_sampling_correction false.")


def prompt_seeds(seed: int | None, num_prompts: int, num_generations: int,
                 unseeded: random.Random | None = None) -> list[int]:
    """One seed per prompt, spaced by G so that vLLM's per-sample ``seed + j`` never collide.

    ``seed`` None: the start is drawn from ``unseeded`` (the backend's own generator), never left to vLLM.
    """
    if seed is None:
        start = (unseeded or random.Random()).randrange(_SEED_RANGE)
    else:
        digest = hashlib.blake2b(str(seed).encode(), digest_size=8).digest()  # stable across processes
        start = int.from_bytes(digest, "big") % _SEED_RANGE
    return [start + index * num_generations for index in range(num_prompts)]


def sampling_params_per_prompt(vllm, params: SamplingParams, plan: RequestPlan, seeds: Sequence[int],
                               stop_token_ids: Sequence[int], with_logprobs: bool) -> list:
    """One ``vllm.SamplingParams`` per prompt."""
    common = dict(
        n=plan.samples_per_request,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,  # 0 disables top-k in both rlcode and vLLM 0.33
        max_tokens=params.max_new_tokens,
        stop=list(params.stop) or None,
        stop_token_ids=list(stop_token_ids),  # the HF backend's EOS set, not only the model config's
        include_stop_str_in_output=True,  # same text as the HF backend: cut after the stop string
        skip_special_tokens=True,
        logprobs=0 if with_logprobs else None,  # 0: the sampled token's log-prob only
    )
    return [vllm.SamplingParams(seed=seed, **common) for seed in seeds]


def token_prompts(prompt_ids: Sequence[Sequence[int]]) -> list[dict]:
    """vLLM prompts given as token ids: vLLM then adds no special tokens (no second BOS)."""
    return [{"prompt_token_ids": list(ids)} for ids in prompt_ids]


def rollout_from_outputs(outputs: Sequence, prompt_ids: Sequence[Sequence[int]], plan: RequestPlan,
                         pad_token_id: int, device: torch.device | str, with_logprobs: bool) -> RolloutBatch:
    """Rows i*G .. i*G+G-1 for prompt i, in vLLM's sample order (``index``)."""
    if len(outputs) != len(prompt_ids):
        raise RuntimeError(f"vLLM returned {len(outputs)} results for {len(prompt_ids)} prompts.")
    rows_prompt, rows_completion, ended, texts, logps = [], [], [], [], []
    for ids, request in zip(prompt_ids, outputs):
        samples = sorted(request.outputs, key=lambda sample: sample.index)
        if len(samples) != plan.samples_per_request:
            raise RuntimeError(f"vLLM returned {len(samples)} samples for a prompt, expected {plan.samples_per_request}.")
        for sample in samples:
            tokens = list(sample.token_ids)
            sample_logps = _sampled_token_logps(sample, tokens) if with_logprobs else None
            for _ in range(plan.copies_per_sample):
                rows_prompt.append(list(ids))
                rows_completion.append(tokens)
                ended.append(sample.finish_reason == "stop")  # EOS, stop token or string; "length": truncated
                texts.append(sample.text)
                logps.append(sample_logps)
    return batch_from_token_lists(rows_prompt, rows_completion, ended, texts, pad_token_id, device=device,
                                  sampling_logps=logps if with_logprobs else None)


def _sampled_token_logps(sample, tokens: list[int]) -> list[float]:
    """vLLM's log-prob of each sampled token (NaN where it gave none: no correction there)."""
    entries = sample.logprobs
    if entries is None or len(entries) != len(tokens):
        raise RuntimeError("vLLM returned no log-prob per sampled token although logprobs=0 was requested.")
    values = []
    for token, entry in zip(tokens, entries):
        logprob = entry.get(token) if entry is not None else None
        values.append(float("nan") if logprob is None else float(logprob.logprob))
    return values
