"""Rollout speed: rlcode's decoding loop vs transformers' `generate()` (the peer TRL uses).

Three paths over the same 16 rows (4 prompts x 4 generations, by default temperature 1, 64 new tokens):
  generate            model.generate(do_sample=True): multinomial sampling
  generate+gumbel     model.generate(do_sample=False) with a logits processor adding Gumbel noise
  rlcode loop         HFGenerateBackend: Gumbel-max, finished rows leave the batch, shared prefill
Prints tokens/s (tokens up to and including EOS) and the ratio to the first path (`generate` by
default): best of --repeats per wall-clock second and per CPU second of this process (steadier on a
shared machine; use --threads 1 there so idle OpenMP threads do not count), and the median per CPU
second (steadier still when other jobs share the cores). `--stop` adds stop strings to every path
(`generate()` gets `stop_strings`); `--paths` runs a subset; `--baseline REV` adds the loop as it was
at git revision REV (its hf_backend.py and stop_strings.py), interleaved with today's, and checks
that both sample the same completions.

`--decode-step` times one decode step instead (batch `--batch` rows: `--batch / --group` prompts of
`--context` tokens, each decoded by `--group` rows as in a GRPO rollout, then `--max-new-tokens` steps;
the median step), with transformers' concatenating cache and with the backend's in-place one
(`rlcode.rollout.kv_cache`), against two floors measured in the same process:
  matmul bound   2 x linear parameters x rows FLOPs at the rate of one [rows, H] x [H, I] product
                 repeated on the same weight (it stays in the CPU's cache: the most optimistic rate;
                 grpo_sides.matmul_flops_per_s, as step_throughput.py's utilisation uses)
  weight floor   every nn.Linear of the model once, in module order, on [rows, in] inputs: the
                 products a decode step cannot avoid, with the weights read from memory as in a step
and the int8 sampler's step (`model.rollout_precision: int8`) against its own floor, measured the same
way: every linear of the int8 copy once (the dynamic int8 ones, and the MLP down projections it keeps
in fp32; the int8 ones alone are shown too). The int8 step runs three ways: as it samples (`int8
(shared, rlcode)`: each prompt's keys and values once per group, `rlcode.rollout.shared_prompt_cache`,
attended by the fused kernel of `rlcode.rollout.attention_kernel` where it is built, and for a
llama-family model the plain-tensor step `rlcode.rollout.llama_decode_step`), the same through the
model's own forward (`int8, shared, forward`), and with SDPA over a per-row copy of the prompt (`int8,
per-row prompts`). `--group 1` gives every row its own
prompt (the decode-step figures before 2026-11-28 were measured so).

    python benchmarks/rollout_speed.py --models tiny-random tiny-random-49k smollm2-135m-instruct
    python benchmarks/rollout_speed.py --models tiny-random --threads 1 --stop '```' '[DONE]' \
        --paths "rlcode loop" --baseline ef14352
    python benchmarks/rollout_speed.py --models smollm2-135m-instruct --threads 1 --decode-step \
        --batch 16 --context 200 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from rlcode.models import load_model, load_tokenizer
from rlcode.models.cache_name import output_cache
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt
from rlcode.rollout.quantized_sampler import quantized_copy

from grpo_sides import matmul_flops_per_s

DynamicInt8Linear = torch.ao.nn.quantized.dynamic.Linear

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


def backend_at(revision: str):
    """HFGenerateBackend as it was at git `revision`, with that revision's stop-string matcher."""
    root = Path(__file__).resolve().parents[1]

    def load(path: str, name: str) -> types.ModuleType:
        source = subprocess.run(["git", "-C", str(root), "show", f"{revision}:{path}"],
                                capture_output=True, text=True, check=True).stdout
        module = sys.modules[name] = types.ModuleType(name)
        exec(compile(source, f"{revision}:{path}", "exec"), module.__dict__)
        return module

    current = sys.modules["rlcode.rollout.stop_strings"]
    try:  # the old backend imports the old matcher under the usual name
        load("rlcode/rollout/stop_strings.py", "rlcode.rollout.stop_strings")
        return load("rlcode/rollout/hf_backend.py", f"hf_backend_at_{revision}").HFGenerateBackend
    finally:
        sys.modules["rlcode.rollout.stop_strings"] = current


def counted_tokens(new_tokens: torch.Tensor, eos: int) -> int:
    """Tokens up to and including the first EOS of each row."""
    total = 0
    for row in new_tokens.tolist():
        total += row.index(eos) + 1 if eos in row else len(row)
    return total


def run(model_name: str, repeats: int, max_new_tokens: int, group: int, temperature: float,
        stop: list[str], selected: list[str], baseline: str | None) -> None:
    tokenizer = load_tokenizer(model_name)
    model = load_model(model_name).eval()
    prompts = [render_prompt(tokenizer, text, chat=True) for text in PROMPTS]
    rows = [prompt for prompt in prompts for _ in range(group)]
    encoded = tokenizer(rows, padding=True, return_tensors="pt", add_special_tokens=False)
    eos = tokenizer.eos_token_id
    common = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
    if stop:
        common.update(stop_strings=stop, tokenizer=tokenizer)

    def hf_generate():
        torch.manual_seed(0)
        out = model.generate(**encoded, do_sample=True, temperature=temperature, top_k=0, top_p=1.0, **common)
        return counted_tokens(out[:, encoded["input_ids"].shape[1]:], eos)

    def hf_generate_gumbel():
        generator = torch.Generator().manual_seed(0)
        out = model.generate(**encoded, do_sample=False, logits_processor=[GumbelNoise(temperature, generator)], **common)
        return counted_tokens(out[:, encoded["input_ids"].shape[1]:], eos)

    backend = HFGenerateBackend(model, tokenizer)
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, stop=stop, seed=0)

    def rlcode_loop():
        return backend.generate(prompts, group, params).num_generated_tokens

    paths = {"generate": hf_generate, "generate+gumbel": hf_generate_gumbel, "rlcode loop": rlcode_loop}
    paths = {name: path for name, path in paths.items() if name in selected}
    if baseline:
        old_backend = backend_at(baseline)(model, tokenizer)
        paths[f"loop @{baseline}"] = lambda: old_backend.generate(prompts, group, params).num_generated_tokens
    first = next(iter(paths))
    best_wall: dict[str, float] = {}
    best_cpu: dict[str, float] = {}
    cpu_rates: dict[str, list[float]] = {name: [] for name in paths}
    with torch.no_grad():
        for repeat in range(repeats):
            # interleaved, so load changes hit every path alike; the order alternates, as the path
            # run first in a round measured slower
            for name, path in list(paths.items())[:: -1 if repeat % 2 else 1]:
                wall, cpu = time.perf_counter(), time.process_time()
                tokens = path()
                best_wall[name] = max(best_wall.get(name, 0.0), tokens / (time.perf_counter() - wall))
                cpu_rates[name].append(tokens / (time.process_time() - cpu))
                best_cpu[name] = max(best_cpu.get(name, 0.0), cpu_rates[name][-1])
    print(f"\n{model_name}: batch {len(rows)}, {max_new_tokens} new tokens, T={temperature}, "
          f"stop {stop or 'none'}, torch threads {torch.get_num_threads()}")
    median = {name: statistics.median(rates) for name, rates in cpu_rates.items()}
    for name in paths:
        print(
            f"  {name:16s} {best_wall[name]:8.1f} tokens/s wall (x{best_wall[name] / best_wall[first]:.2f})"
            f"   {best_cpu[name]:8.1f} tokens/CPU-s (x{best_cpu[name] / best_cpu[first]:.2f})"
            f"   median {median[name]:8.1f} tokens/CPU-s (x{median[name] / median[first]:.2f})"
        )
    if baseline:
        with torch.no_grad():
            ours, theirs = backend.generate(prompts, group, params), old_backend.generate(prompts, group, params)
        same = (torch.equal(ours.completion_ids, theirs.completion_ids)
                and ours.completion_texts == theirs.completion_texts)
        print(f"  same completions as @{baseline} (seed 0): {'yes' if same else 'NO'}")


def _median_ms(call, repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def decode_steps_ms(backend: HFGenerateBackend, batch: int, group: int, context: int, steps: int, in_place: bool,
                    model=None, forward: bool = False) -> list[float]:
    """Times of the backend's decode step (`_decode_step`), `steps` times after a `context`-token
    prefill of `batch // group` prompts, each repeated for `group` rows, with transformers' cache or
    (`in_place`) the one the backend builds (`_prefill`: in place; the int8 copy's shares each
    prompt's keys and values across its group); `model`: the model stepped (default the backend's);
    `forward`: through the model's own forward even where the backend takes the llama-family step."""
    model = backend.model if model is None else model
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, model.config.vocab_size - 1, (batch // group, context), generator=generator)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        if in_place:
            logits, cache, positions = backend._prefill(model, ids, mask, group, room=steps)
        else:
            output = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
            cache = output_cache(output)
            cache.batch_repeat_interleave(group)
            logits, positions = output.logits[:, -1].repeat_interleave(group, dim=0), torch.full((batch, 1), context - 1)
        mask, times = mask.repeat_interleave(group, dim=0), []
        tokens = logits.argmax(-1)
        for _ in range(steps):
            mask, positions = torch.cat([mask, mask.new_ones(batch, 1)], dim=-1), positions + 1
            start = time.perf_counter()
            logits = (backend._forward_step if forward else backend._decode_step)(model, tokens, mask, positions, cache)
            times.append(time.perf_counter() - start)
            tokens = logits.argmax(-1)
    return [seconds * 1e3 for seconds in times]


def decode_step_report(model_name: str, batch: int, group: int, context: int, steps: int, repeats: int) -> None:
    model = load_model(model_name).eval()
    backend = HFGenerateBackend(model, load_tokenizer(model_name))
    linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    flops = 2 * batch * sum(module.weight.numel() for module in linears)
    hidden, inner = model.config.hidden_size, model.config.intermediate_size
    hot_rate = matmul_flops_per_s(hidden, inner, tokens=batch)  # one weight, repeated: it stays cached
    bound = flops / hot_rate * 1e3
    inputs = {size: torch.randn(batch, size) for size in {module.in_features for module in linears}}
    int8 = quantized_copy(model)[0]
    per_row_int8 = quantized_copy(model)[0]  # the same copy with SDPA over a per-row prompt cache
    per_row_int8.config._attn_implementation = "sdpa"
    int8_layers = [m for m in int8.modules() if isinstance(m, (torch.nn.Linear, DynamicInt8Linear))]
    with torch.no_grad():
        floor = _median_ms(lambda: [F.linear(inputs[m.in_features], m.weight, m.bias) for m in linears], repeats)
        int8_floor = _median_ms(lambda: [m(inputs[m.in_features]) for m in int8_layers], repeats)
        int8_only = _median_ms(lambda: [m(inputs[m.in_features]) for m in int8_layers
                                        if isinstance(m, DynamicInt8Linear)], repeats)
    stepped = {"transformers' cache": (model, False, True), "in-place cache": (model, True, True),
               "int8, per-row prompts": (per_row_int8, True, True), "int8, shared, forward": (int8, True, True),
               "int8 (shared, rlcode)": (int8, True, False)}
    step = {name: [] for name in stepped}
    for repeat in range(repeats):  # interleaved, the order alternating, so load changes hit all alike
        for name in list(step)[:: -1 if repeat % 2 else 1]:
            stepped_model, in_place, forward = stepped[name]
            step[name] += decode_steps_ms(backend, batch, group, context, steps, in_place, model=stepped_model,
                                          forward=forward)
    print(f"\n{model_name}: decode step, batch {batch} ({batch // group} prompts x {group}), "
          f"context {context} -> {context + steps}, torch threads {torch.get_num_threads()}")
    print(f"  matmul bound   {bound:7.1f} ms  ({flops / 1e9:.2f} GFLOP at {hot_rate / 1e9:.1f} GFLOP/s, "
          f"[{batch}, {hidden}] x [{hidden}, {inner}] repeated)")
    print(f"  weight floor   {floor:7.1f} ms  (x{floor / bound:.2f} the bound: {len(linears)} linears once each)")
    kept = sum(not isinstance(m, DynamicInt8Linear) for m in int8_layers)
    print(f"  int8 floor     {int8_floor:7.1f} ms  ({len(int8_layers) - kept} int8 linears {int8_only:.1f} ms, "
          f"{kept} kept fp32)")
    for name, times in step.items():
        median = statistics.median(times)
        own_floor = int8_floor if name.startswith("int8") else floor
        print(f"  {name:22s} {median:7.1f} ms  (x{median / bound:.2f} the bound, x{median / own_floor:.2f} "
              f"{'the int8' if name.startswith('int8') else 'the'} floor)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny-random", "tiny-random-49k", "smollm2-135m-instruct"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--group", type=int, default=4, help="rows per prompt (--decode-step too)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--stop", nargs="*", default=[], help="stop strings for every path")
    parser.add_argument("--baseline", help="git revision whose rlcode loop runs too (before/after)")
    parser.add_argument("--decode-step", action="store_true", help="time one decode step against its floors")
    parser.add_argument("--batch", type=int, default=16, help="rows of --decode-step")
    parser.add_argument("--context", type=int, default=200, help="prompt tokens of --decode-step")
    parser.add_argument("--paths", nargs="+", default=["generate", "generate+gumbel", "rlcode loop"],
                        choices=["generate", "generate+gumbel", "rlcode loop"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for model_name in args.models:
        if args.decode_step:
            decode_step_report(model_name, args.batch, args.group, args.context, args.max_new_tokens, args.repeats)
            continue
        run(model_name, args.repeats, args.max_new_tokens, args.group, args.temperature, args.stop, args.paths,
            args.baseline)


if __name__ == "__main__":
    main()
