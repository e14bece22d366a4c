"""GPU memory of a GRPO training pass on Qwen2.5-1.5B, per platform profile, from CPU measurements.

What the platform profiles (rlcode.platform.profile_for) are sized from. Two parts:

- states: parameters counted on the meta device (no download, no memory) times the bytes each one
  costs under Lightning's "-mixed" precisions: fp32 weight, fp32 grad, two fp32 AdamW moments, and
  the half-precision copy autocast casts for the matmuls and keeps for backward (18 bytes);
- activations: the bytes autograd keeps for backward per token and layer, counted with saved-tensor
  hooks on a 2-layer model of the same shape under bf16 autocast (fp16 takes the same bytes), at two
  lengths so that the per-token slope is separated from what does not grow with length (the weight
  copies), with and without activation recomputation (gradient checkpointing).

Then, for each profile, the peak of one micro-batch at the recipe's longest rows beside the states.
The log-probs' LM head runs in chunks (fused_head_logps: about 64 MB of logits at a time), left out.

    python benchmarks/training_memory.py [--row_tokens 870]
"""

from __future__ import annotations

import argparse

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcode.platform import PROFILE_LABELS, PlatformInfo, profile_for, profile_kind

QWEN25_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768)
STATE_BYTES = 4 + 4 + 8 + 2  # fp32 weight, fp32 grad, AdamW exp_avg + exp_avg_sq, autocast's half copy
GB = 1e9
CARDS = {  # name: (compute capability, memory in GiB as torch reports it)
    "V100 16 GB": ((7, 0), 15.8), "V100 32 GB": ((7, 0), 31.7), "A100 40 GB": ((8, 0), 39.4),
    "A100 80 GB": ((8, 0), 79.2), "H100 80 GB": ((9, 0), 79.1),
}


def parameter_count() -> int:
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_15B))
    return sum(p.numel() for p in model.parameters())


def saved_bytes(tokens: int, recompute: bool) -> int:
    """Bytes autograd keeps after the forward of a 2-layer Qwen2.5-1.5B-shaped model on one row."""
    torch.manual_seed(0)
    config = Qwen2Config(**{**QWEN25_15B, "num_hidden_layers": 2, "vocab_size": 1024}, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).train()
    if recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    storages: dict[int, int] = {}  # one count per storage: views of one tensor are saved several times

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    ids = torch.randint(0, config.vocab_size, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model.model(input_ids=ids, use_cache=False)
    return sum(storages.values())


def per_token_per_layer(recompute: bool, short: int = 128, long: int = 384) -> float:
    return (saved_bytes(long, recompute) - saved_bytes(short, recompute)) / (long - short) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row_tokens", type=int, default=870,
                        help="longest row: prompt (MBPP, up to ~350 tokens) + max_new_tokens 512, rounded up")
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = parameter_count()
    layers = QWEN25_15B["num_hidden_layers"]
    states = params * STATE_BYTES
    kept = per_token_per_layer(recompute=False)
    kept_recompute = per_token_per_layer(recompute=True)
    # With recomputation every layer keeps its input, and the layer being recomputed holds its full
    # activations for the length of its backward.
    row = {False: kept * layers * args.row_tokens, True: (kept_recompute * layers + kept) * args.row_tokens}
    print(f"parameters {params / 1e9:.3f} B; states {STATE_BYTES} B each = {states / GB:.1f} GB")
    print(f"kept for backward per token and layer: {kept / 1e3:.1f} kB, {kept_recompute / 1e3:.1f} kB with "
          f"recomputation; per {args.row_tokens}-token row over {layers} layers: {row[False] / GB:.2f} GB, "
          f"{row[True] / GB:.2f} GB")
    print("| card | profile | micro-batch | recompute | states + activations | card | vLLM share "
          "| left beside awake vLLM |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (capability, memory_gib) in CARDS.items():
        info = PlatformInfo(device_type="cuda", gpu_name=name, gpu_count=1, compute_capability=capability,
                            gpu_memory_bytes=int(memory_gib * 2**30))
        profile = profile_for(info)
        recompute = profile["model.gradient_checkpointing"]
        batch = profile["model.micro_batch_size"]
        need = states + batch * row[recompute]
        card = memory_gib * 2**30
        share = profile["model.vllm.gpu_memory_utilization"]
        print(f"| {name} | {PROFILE_LABELS[profile_kind(info)].split(' ')[0]} | {batch} | {recompute} | "
              f"{need / GB:.1f} GB | {card / GB:.1f} GB | {share} = {share * card / GB:.1f} GB | "
              f"{(card * (1 - share) - need) / GB:.1f} GB |")


if __name__ == "__main__":
    main()
