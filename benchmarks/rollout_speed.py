"""Rollout speed: rlcode's decoding loop vs transformers' `generate()` (the peer TRL uses).

Three paths over the same 16 rows (4 prompts x 4 generations, temperature 1, 64 new tokens):
  generate            model.generate(do_sample=True): multinomial sampling
  generate+gumbel     model.generate(do_sample=False) with a logits processor adding Gumbel noise
  rlcode loop         HFGenerateBackend: Gumbel-max, finished rows leave the batch, shared prefill
Prints tokens/s (tokens up to and including EOS) and the ratio to `generate`; best of --repeats.

    python benchmarks/rollout_speed.py --models tiny-random tiny-random-49k smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import time

import torch

from rlcode.models import load_model, load_tokenizer
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt

PROMPTS = [
    "Write a Python function that returns the sum of the squares of a list of integers.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that removes duplicate items from a list, keeping their order.",
]


class GumbelNoise:
    """Logits processor: temperature + Gumbel noise, so greedy decoding samples softmax(logits / T)."""

    def __init__(self, temperature: float, generator: torch.Generator) -> None:
        self.temperature, self.generator = temperature, generator

    def __call__(self, input_ids, scores):
        uniform = torch.rand(scores.shape, generator=self.generator).clamp_min_(1e-30)
        return scores / self.temperature - torch.log(-torch.log(uniform))


def counted_tokens(new_tokens: torch.Tensor, eos: int) -> int:
    """Tokens up to and including the first EOS of each row."""
    total = 0
    for row in new_tokens.tolist():
        total += row.index(eos) + 1 if eos in row else len(row)
    return total


def run(model_name: str, repeats: int, max_new_tokens: int, group: int) -> None:
    tokenizer = load_tokenizer(model_name)
    model = load_model(model_name).eval()
    prompts = [render_prompt(tokenizer, text, chat=True) for text in PROMPTS]
    rows = [prompt for prompt in prompts for _ in range(group)]
    encoded = tokenizer(rows, padding=True, return_tensors="pt", add_special_tokens=False)
    eos = tokenizer.eos_token_id
    common = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)

    def hf_generate():
        torch.manual_seed(0)
        out = model.generate(**encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, **common)
        return counted_tokens(out[:, encoded["input_ids"].shape[1]:], eos)

    def hf_generate_gumbel():
        generator = torch.Generator().manual_seed(0)
        out = model.generate(**encoded, do_sample=False, logits_processor=[GumbelNoise(1.0, generator)], **common)
        return counted_tokens(out[:, encoded["input_ids"].shape[1]:], eos)

    backend = HFGenerateBackend(model, tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=0)

    def rlcode_loop():
        return backend.generate(prompts, group, params).num_generated_tokens

    paths = {"generate": hf_generate, "generate+gumbel": hf_generate_gumbel, "rlcode loop": rlcode_loop}
    best: dict[str, float] = {}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, path in paths.items():
                start = time.perf_counter()
                tokens = path()
                rate = tokens / (time.perf_counter() - start)
                best[name] = max(best.get(name, 0.0), rate)
    print(f"\n{model_name}: batch {len(rows)}, {max_new_tokens} new tokens, torch threads {torch.get_num_threads()}")
    for name, rate in best.items():
        print(f"  {name:16s} {rate:8.1f} tokens/s   x{rate / best['generate']:.2f} vs generate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny-random", "tiny-random-49k", "smollm2-135m-instruct"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--group", type=int, default=4)
    args = parser.parse_args()
    for model_name in args.models:
        run(model_name, args.repeats, args.max_new_tokens, args.group)


if __name__ == "__main__":
    main()
