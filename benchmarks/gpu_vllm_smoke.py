"""GPU smoke check of the vLLM rollout backend (needs CUDA and `pip install 'rlcode[vllm]'`; it cannot
run on the project's CPU machines, where only `--help` works).

In a few minutes, on one GPU:

1. Agreement: vLLM's log-probs of a fixed completion (its prompt log-probs over prompt + completion)
   against the trainer's (`completion_logps`, temperature 1), before any update.
2. Sync: a few optimizer steps raise the policy's log-prob of that completion. Before the trainer
   says the weights changed, vLLM must still report the old log-probs (the sync is lazy); after
   `weights_changed()`, its log-probs must move as the trainer's did and agree with them again.
   `--lora` runs the same through a LoRA policy (merged out of place into the engine).
3. Speed: samples/s and tokens/s of the vLLM backend against the HF backend on the same prompts.

Exits 1 when check 1 or 2 fails.

    python benchmarks/gpu_vllm_smoke.py --model Qwen/Qwen2.5-0.5B-Instruct [--lora] [--prompts 8 --generations 8]
"""

from __future__ import annotations

import argparse
import sys
import time

PROMPTS = [
    "Write a Python function that returns the sum of the squares of a list of integers.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that removes duplicate items from a list, keeping their order.",
]
FIXED_COMPLETION = "```python\ndef square_sum(values):\n    return sum(value * value for value in values)\n```"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="hub id, local folder or rlcode short name")
    parser.add_argument("--precision", default="32-true", help="the trainer's weights (vLLM runs its own dtype)")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (r=16) instead of every weight")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--sleep", action="store_true", help="enable vLLM's sleep mode")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per throughput batch")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--update-steps", type=int, default=20, help="most optimizer steps to move the log-probs")
    parser.add_argument("--target-shift", type=float, default=1.0, help="nats/token the update must add")
    parser.add_argument("--tolerance", type=float, default=0.1, help="allowed mean |vLLM - trainer| log-prob")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_vllm_smoke.py needs a CUDA GPU (vLLM does); nothing was checked.", file=sys.stderr)
        return 2
    from rlcode.models import LoraSettings, load_model, load_tokenizer, resolve_model_source
    from rlcode.rollout import SamplingParams, render_prompt
    from rlcode.rollout.vllm.backend import VLLMBackend
    from rlcode.rollout.vllm.engine import VLLMSettings

    tokenizer = load_tokenizer(args.model)
    policy = load_model(args.model, precision=args.precision,
                        lora=LoraSettings(r=16, dropout=0.0) if args.lora else None).cuda()
    settings = VLLMSettings(gpu_memory_utilization=args.gpu_memory_utilization, enable_sleep_mode=args.sleep)
    backend = VLLMBackend(policy, tokenizer, resolve_model_source(args.model), settings=settings, seed=0)

    prompt = render_prompt(tokenizer, PROMPTS[0], chat=bool(getattr(tokenizer, "chat_template", None)))
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(FIXED_COMPLETION, add_special_tokens=False)["input_ids"]
    scores = FixedCompletionScores(backend, policy, prompt_ids, completion_ids)

    failures = []
    trainer_before, vllm_before = scores.trainer(), scores.vllm()
    gap = mean_abs(trainer_before, vllm_before)
    report("1. before any update", trainer_before, vllm_before)
    if gap > args.tolerance:
        failures.append(f"vLLM and the trainer disagree before any update: mean |diff| {gap:.4f} > {args.tolerance}")

    shift = scores.raise_log_probs(args.update_steps, args.target_shift)
    trainer_after = scores.trainer()
    vllm_stale = scores.vllm()  # nobody said the weights changed: the engine must not have them
    backend.weights_changed()
    vllm_after = scores.vllm()
    report("2. after the update, not synced", trainer_after, vllm_stale)
    report("2. after the update, synced", trainer_after, vllm_after)
    trainer_move, vllm_move = mean(trainer_after) - mean(trainer_before), mean(vllm_after) - mean(vllm_before)
    print(f"   the update moved the trainer's mean log-prob by {trainer_move:+.3f}, vLLM's by {vllm_move:+.3f} "
          f"({shift} optimizer steps)")
    if mean_abs(vllm_stale, vllm_before) > 1e-3:
        failures.append("vLLM's log-probs changed before weights_changed(): the lazy sync is not what it says")
    if mean_abs(trainer_after, vllm_after) > args.tolerance:
        failures.append(f"after the sync vLLM disagrees with the trainer: mean |diff| "
                        f"{mean_abs(trainer_after, vllm_after):.4f} > {args.tolerance}")
    if abs(vllm_move - trainer_move) > 0.25 * abs(trainer_move):
        failures.append(f"vLLM moved by {vllm_move:+.3f} where the trainer moved by {trainer_move:+.3f}")

    measure_speed(args, backend, policy, tokenizer, SamplingParams, render_prompt)
    for failure in failures:
        print("FAILED:", failure)
    print("vLLM smoke check:", "FAILED" if failures else "passed")
    return 1 if failures else 0


class FixedCompletionScores:
    """The trainer's and vLLM's log-probs of one fixed completion after one prompt."""

    def __init__(self, backend, policy, prompt_ids: list[int], completion_ids: list[int]) -> None:
        self.backend, self.policy = backend, policy
        self.prompt_ids, self.completion_ids = prompt_ids, completion_ids

    def _tensors(self):
        import torch

        device = next(self.policy.parameters()).device
        prompt = torch.tensor([self.prompt_ids], device=device)
        completion = torch.tensor([self.completion_ids], device=device)
        return prompt, torch.ones_like(prompt), completion, torch.ones_like(completion)

    def trainer(self) -> list[float]:
        import torch

        from rlcode.logprobs.sequence_logps import completion_logps

        self.policy.eval()
        with torch.no_grad():
            return completion_logps(self.policy, *self._tensors(), temperature=1.0)[0].tolist()

    def vllm(self) -> list[float]:
        """vLLM's prompt log-probs of the completion tokens, with prompt + completion as the prompt."""
        import vllm

        self.backend.ensure_current_weights()  # what generate() does first: push only if stale
        if self.backend.weights.kv_cache_asleep:
            self.backend.llm.wake_up(tags=["kv_cache"])
            self.backend.weights.kv_cache_woken()
        # temperature 1, as the trainer scores here: raw and processed log-probs are then the same
        params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        ids = self.prompt_ids + self.completion_ids
        (output,) = self.backend.engine().generate([{"prompt_token_ids": ids}], [params], use_tqdm=False)
        entries = output.prompt_logprobs[len(self.prompt_ids):]
        return [entry[token].logprob for entry, token in zip(entries, self.completion_ids)]

    def raise_log_probs(self, max_steps: int, target: float) -> int:
        """Adam steps on -log p(completion) until its mean per-token log-prob rose by ``target``."""
        import torch

        from rlcode.logprobs.sequence_logps import completion_logps

        start = mean(self.trainer())
        optimizer = torch.optim.Adam([p for p in self.policy.parameters() if p.requires_grad], lr=2e-4)
        self.policy.train()
        for step in range(1, max_steps + 1):
            loss = -completion_logps(self.policy, *self._tensors(), temperature=1.0).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if -loss.item() - start >= target:
                return step
        return max_steps


def measure_speed(args, backend, policy, tokenizer, SamplingParams, render_prompt) -> None:  # noqa: N803
    import torch

    from rlcode.rollout import HFGenerateBackend

    chat = bool(getattr(tokenizer, "chat_template", None))
    prompts = [render_prompt(tokenizer, PROMPTS[i % len(PROMPTS)], chat=chat) for i in range(args.prompts)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=1)
    print(f"3. speed: {args.prompts} prompts x {args.generations} completions, up to {args.max_new_tokens} tokens")
    for name, generator in (("vllm", backend), ("hf", HFGenerateBackend(policy, tokenizer))):
        generator.generate(prompts[:1], 1, params)  # warm-up (and the vLLM engine's weights)
        torch.cuda.synchronize()
        started = time.perf_counter()
        batch = generator.generate(prompts, args.generations, params)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        print(f"   {name:5s} {len(batch) / seconds:8.1f} samples/s  {batch.num_generated_tokens / seconds:9.1f} tokens/s")


def report(title: str, trainer: list[float], vllm: list[float]) -> None:
    print(f"{title}: mean log-prob trainer {mean(trainer):+.4f}, vLLM {mean(vllm):+.4f}, "
          f"mean |diff| {mean_abs(trainer, vllm):.4f} over {len(trainer)} tokens")


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def mean_abs(first: list[float], second: list[float]) -> float:
    return sum(abs(a - b) for a, b in zip(first, second)) / len(first)


if __name__ == "__main__":
    sys.exit(main())
