"""Memory of completion log-probs: peak RAM of one forward + backward, before vs after vs TRL.

The model is the tiny-random architecture (Qwen2, 2 layers, 64 wide, tied embeddings) with Qwen2.5's
151,936-token vocabulary, so the LM head's logits dominate as they do at scale; the batch is a
GRPO group at scale (4 completions x 512 tokens, 64-token prompts, one of them left-padded). Sides:

  before  the old rlcode code path (copied below): the model's full logits, per-row float32 log-softmax
  after   rlcode.logprobs.sequence_logps.completion_logps: decoder body + chunked fused LM head
  TRL     TRL 1.16 GRPOTrainer._get_per_token_logps_and_entropies (its fused, tiled LM head)

Each side runs in a fresh interpreter with 1 torch thread: build the model and inputs, note the
current RSS, run forward + backward of sum(logps * w) (fixed random w), and report the peak RSS
(ru_maxrss) minus that baseline. The parent then checks that all sides computed the same
log-probs and the same gradient for every parameter.

    .venv/bin/python benchmarks/logps_memory.py [--batch 4 --prompt 64 --completion 512 --vocab 151936]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIDES = ("before", "after", "TRL")
TEMPERATURE = 0.7


def _old_per_token_logps(logits, ids, temperature):
    """The old losses.per_token_logps (ef14352), verbatim but for the argument checks."""
    import torch

    rows = []
    for row_logits, row_ids in zip(logits, ids):
        scaled = row_logits.float() / temperature  # [T, V]
        picked = scaled.gather(-1, row_ids.unsqueeze(-1)).squeeze(-1)  # [T]
        rows.append(picked - torch.logsumexp(scaled, dim=-1))
    return torch.stack(rows)


def _old_completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature):
    """The old sequence_logps.completion_logps (ef14352), verbatim."""
    import torch

    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, P + C]
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()  # [B, P + C]
    length = completion_ids.size(1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=length + 1).logits
    logits = logits[:, :-1, :]  # [B, C, V]
    return _old_per_token_logps(logits, completion_ids, temperature)  # [B, C]


def _model(vocab: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def _inputs(args):
    import torch

    generator = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(2, args.vocab, (args.batch, args.prompt), generator=generator)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[-1, : args.prompt // 4] = 0  # one left-padded prompt
    completion_ids = torch.randint(2, args.vocab, (args.batch, args.completion), generator=generator)
    weights = torch.randn(completion_ids.shape, generator=generator)
    return prompt_ids * prompt_mask, prompt_mask, completion_ids, torch.ones_like(completion_ids), weights


def _trl_logps(model):
    """A GRPOTrainer around ``model`` (its fused head patched in) and a function calling TRL's log-probs."""
    import os

    import torch
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    backend = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    out = tempfile.mkdtemp(prefix="logps_memory_trl_")
    os.environ.setdefault("WANDB_MODE", "disabled")
    args = GRPOConfig(output_dir=out, bf16=False, use_cpu=True, activation_checkpointing=False,
                      per_device_train_batch_size=4, num_generations=4, temperature=TEMPERATURE, report_to=[])
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_dict({"prompt": ["a"] * 4}),
                          processing_class=tokenizer)

    def logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature):
        assert temperature == trainer.temperature
        input_ids = torch.cat([prompt_ids, completion_ids], 1)
        attention_mask = torch.cat([prompt_mask, completion_mask], 1)
        return trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                          completion_ids.size(1))[0]

    return trainer.model, logps


def _current_rss_mb() -> float:
    import os

    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_side(side: str, args, out: Path) -> None:
    """In a fresh interpreter: one forward + backward, peak RSS above the baseline, results to ``out``."""
    import gc

    import torch

    torch.set_num_threads(1)
    model = _model(args.vocab).train()
    if side == "before":
        function = _old_completion_logps
    elif side == "after":
        from rlcode.logprobs.sequence_logps import completion_logps as function
    else:
        model, function = _trl_logps(model)
    prompt_ids, prompt_mask, completion_ids, completion_mask, weights = _inputs(args)
    gc.collect()
    baseline, peak_before = _current_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    logps = function(model, prompt_ids, prompt_mask, completion_ids, completion_mask, TEMPERATURE)
    (logps * weights).sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    torch.save({"logps": logps.detach(), "grads": grads}, out)
    print(json.dumps({"side": side, "baseline_mb": baseline, "peak_mb": peak, "seconds": seconds,
                      # the measured call must set the process's peak, or the difference means nothing
                      "valid": peak > peak_before}))


def compare(results: dict[str, dict], reference: dict) -> tuple[float, float]:
    """max |d logp| and max |d grad| / max |grad| against the reference side."""
    logps = (results["logps"] - reference["logps"]).abs().max().item()
    assert results["grads"].keys() == reference["grads"].keys(), "different parameters got gradients"
    scale = max(g.abs().max().item() for g in reference["grads"].values())
    grads = max((results["grads"][n] - g).abs().max().item() for n, g in reference["grads"].items())
    return logps, grads / scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        run_side(args.side, args, args.out)
        return

    import torch

    shape = f"--batch {args.batch} --prompt {args.prompt} --completion {args.completion} --vocab {args.vocab}"
    measured, saved = {}, {}
    with tempfile.TemporaryDirectory(prefix="logps_memory_") as folder:
        for side in args.sides:
            out = Path(folder) / f"{side}.pt"
            child = subprocess.run([sys.executable, __file__, "--side", side, "--out", str(out), *shape.split()],
                                   capture_output=True, text=True, check=False)
            if child.returncode != 0:
                raise SystemExit(f"side {side} failed:\n{child.stderr[-3000:]}")
            measured[side] = json.loads(child.stdout.strip().splitlines()[-1])
            saved[side] = torch.load(out)
    reference = args.sides[0]
    print(f"\nforward + backward of completion log-probs, {args.batch} x {args.completion} completion tokens, "
          f"{args.prompt}-token prompts, vocabulary {args.vocab:,}, 1 torch thread")
    print(f"| side | peak RSS above baseline | vs {reference} | vs TRL | time | max abs d logp vs {reference} "
          f"| max abs d grad / max abs grad |")
    print("|---|---|---|---|---|---|---|")
    for side in args.sides:
        row = measured[side]
        memory = row["peak_mb"] - row["baseline_mb"]
        first = measured[reference]["peak_mb"] - measured[reference]["baseline_mb"]
        trl = measured["TRL"]["peak_mb"] - measured["TRL"]["baseline_mb"] if "TRL" in measured else float("nan")
        logps, grads = compare(saved[side], saved[reference])
        flag = "" if row["valid"] else " (not the process peak: invalid)"
        print(f"| {side} | {memory:,.0f} MB{flag} | {memory / first:.2f}x | {memory / trl:.2f}x | "
              f"{row['seconds']:.2f} s | {logps:.1e} | {grads:.1e} |")
    worst = max(max(compare(saved[side], saved[reference])) for side in args.sides)
    print(f"\nsame log-probs and gradients on every side: {'yes' if worst <= 1e-4 else 'NO'} (worst {worst:.1e})")


if __name__ == "__main__":
    main()
