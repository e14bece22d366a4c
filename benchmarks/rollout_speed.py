"""Rollout speed: rlcode's decoding loop vs transformers' `generate()` (the peer TRL uses).

Three paths over the same 16 rows (4 prompts x 4 generations, by default temperature 1, 64 new tokens):
  generate            model.generate(do_sample=True): multinomial sampling
  generate+gumbel     model.generate(do_sample=False) with a logits processor adding Gumbel noise
  rlcode loop         HFGenerateBackend: Gumbel-max, finished rows leave the batch, shared prefill
Prints tokens/s (tokens up to and including EOS) and the ratio to `generate`, best of --repeats,
per wall-clock second and per CPU second of this process (steadier on a shared machine; use
--threads 1 there so idle OpenMP threads do not count).

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


def run(model_name: str, repeats: int, max_new_tokens: int, group: int, temperature: float) -> None:
    tokenizer = load_tokenizer(model_name)
    model = load_model(model_name).eval()
    prompts = [render_prompt(tokenizer, text, chat=True) for text in PROMPTS]
    rows = [prompt for prompt in prompts for _ in range(group)]
    encoded = tokenizer(rows, padding=True, return_tensors="pt", add_special_tokens=False)
    eos = tokenizer.eos_token_id
    common = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)

    def hf_generate():
        torch.manual_seed(0)
        out = model.generate(**encoded, do_sample=True, temperature=temperature, top_k=0, top_p=1.0, **common)
        return counted_tokens(out[:, encoded["input_ids"].shape[1]:], eos)

    def hf_generate_gumbel():
        generator = torch.Generator().manual_seed(0)
        out = model.generate(**encoded, do_sample=False, logits_processor=[GumbelNoise(temperature, generator)], **common)
        return counted_tokens(out[:, encoded["input_ids"].shape[1]:], eos)

    backend = HFGenerateBackend(model, tokenizer)
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=0)

    def rlcode_loop():
        return backend.generate(prompts, group, params).num_generated_tokens

    paths = {"generate": hf_generate, "generate+gumbel": hf_generate_gumbel, "rlcode loop": rlcode_loop}
    best_wall: dict[str, float] = {}
    best_cpu: dict[str, float] = {}
    with torch.no_grad():
        for _ in range(repeats):
            for name, path in paths.items():  # interleaved, so load changes hit every path alike
                wall, cpu = time.perf_counter(), time.process_time()
                tokens = path()
                best_wall[name] = max(best_wall.get(name, 0.0), tokens / (time.perf_counter() - wall))
                best_cpu[name] = max(best_cpu.get(name, 0.0), tokens / (time.process_time() - cpu))
    print(f"\n{model_name}: batch {len(rows)}, {max_new_tokens} new tokens, T={temperature}, torch threads {torch.get_num_threads()}")
    for name in paths:
        print(
            f"  {name:16s} {best_wall[name]:8.1f} tokens/s wall (x{best_wall[name] / best_wall['generate']:.2f})"
            f"   {best_cpu[name]:8.1f} tokens/CPU-s (x{best_cpu[name] / best_cpu['generate']:.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny-random", "tiny-random-49k", "smollm2-135m-instruct"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for model_name in args.models:
        run(model_name, args.repeats, args.max_new_tokens, args.group, args.temperature)


if __name__ == "__main__":
    main()
