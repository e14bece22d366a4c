"""The int8 sampler's log-probs against the fp32 policy's, with each decode attention it can use.

Samples `--prompts` MBPP train prompts x `--group` completions (T `--temperature`, `--max-new-tokens`)
from the HF backend's int8 copy (`model.rollout_precision: int8`), once with its shared-prompt cache
(`rlcode.rollout.shared_prompt_cache`, how it samples) and once with SDPA over a per-row copy of each
prompt (how it sampled before), and scores the sampled tokens with the policy
(`completion_logps`). Prints per side: tokens, mean and max |log p_policy - log p_sampler| per token,
and the share of tokens whose importance ratio exceeds the cap (3), the numbers the trainer logs as
`loss/importance_*`. Both sides use the same seeds; their tokens differ (int8 dynamic quantization
turns float-rounding differences into different samples), so the two are compared as distributions.

    MBPP_DATASET_PATH=... .venv/bin/python benchmarks/sampler_mismatch.py [--prompts 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

import rlcode.rollout.quantized_sampler as quantized_sampler
from rlcode.algorithms.importance_correction import DEFAULT_CAP
from rlcode.data.mbpp import load_mbpp
from rlcode.logprobs.sequence_logps import completion_logps
from rlcode.models import load_model, load_tokenizer
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt


def mismatch(model, tokenizer, prompts: list[str], group: int, params: SamplingParams, shared: bool) -> dict:
    switch = quantized_sampler.use_shared_prompt_attention
    if not shared:  # the copy keeps SDPA, so the backend gives every row its own copy of the prompt
        quantized_sampler.use_shared_prompt_attention = lambda model: False
    try:
        backend = HFGenerateBackend(model, tokenizer, rollout_precision="int8")
        ratios = []
        for start in range(0, len(prompts), 4):
            seeded = dataclasses.replace(params, seed=start)
            batch = backend.generate(prompts[start:start + 4], group, seeded)
            with torch.no_grad():
                policy = completion_logps(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                          batch.completion_mask, params.temperature)
            ratios.append((policy - batch.sampling_logps)[batch.completion_mask.bool()])
    finally:
        quantized_sampler.use_shared_prompt_attention = switch
    ratio = torch.cat(ratios)
    return {"tokens": ratio.numel(), "mean_abs_log_ratio": round(float(ratio.abs().mean()), 4),
            "max_abs_log_ratio": round(float(ratio.abs().max()), 3),
            "capped_share": round(float((ratio.exp() > DEFAULT_CAP).float().mean()), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model).eval(), load_tokenizer(args.model)
    prompts = [render_prompt(tokenizer, task.text, chat=True) for task in load_mbpp(split="train")[:args.prompts]]
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    report = {side: mismatch(model, tokenizer, prompts, args.group, params, shared=side == "shared prompts")
              for side in ("shared prompts", "per-row prompts")}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
