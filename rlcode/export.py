"""``rlcode export --ckpt runs/x/version_0/checkpoints/last.ckpt --out DIR [--merge]``.

A training checkpoint is Lightning's file (adapters only under LoRA, with optimizer state); people
want what transformers and peft load. Without ``--merge`` a LoRA run gives a peft adapter folder
(``adapter_config.json`` naming the base model, ``adapter_model.safetensors``), a full fine-tune the
whole model; with ``--merge`` the adapters are folded into a full-precision copy of the base (a
4-bit base is reloaded unquantized first: merging into NF4 weights would round the update away).
The tokenizer is saved beside either, so ``AutoModelForCausalLM.from_pretrained(DIR)`` works.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def export(ckpt: str | Path, out: str | Path, *, merge: bool = False) -> Path:
    """Write the checkpoint's policy to ``out`` as a peft adapter folder or full weights."""
    import torch

    from rlcode.algorithms.grpo import GRPO
    from rlcode.models import is_lora_model

    if not Path(ckpt).is_file():
        raise SystemExit(f"rlcode export: no checkpoint at {ckpt}: pass a .ckpt file, e.g. runs/<exp>/version_0/"
                         "checkpoints/last.ckpt")
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    settings = dict(checkpoint["hyper_parameters"])
    if merge:
        settings["quantization"] = None  # merge into full-precision base weights
    module = GRPO(**settings)
    module.configure_model()
    missing = module.load_state_dict(checkpoint["state_dict"], strict=not is_lora_model(module.policy))
    if is_lora_model(module.policy) and not any("lora_" in key for key in checkpoint["state_dict"]):
        raise SystemExit(f"rlcode export: {ckpt} holds no LoRA adapters ({len(missing.missing_keys)} missing)")
    policy = module.policy.merge_and_unload() if merge and is_lora_model(module.policy) else module.policy
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(out)
    module.tokenizer.save_pretrained(out)
    kind = "peft adapters" if is_lora_model(policy) else ("merged weights" if merge else "full weights")
    print(f"rlcode export: {kind} of step {checkpoint.get('global_step', '?')} in {out}")
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="rlcode export", description=__doc__.split("\n\n")[1])
    parser.add_argument("--ckpt", required=True, help="a training checkpoint (.ckpt)")
    parser.add_argument("--out", required=True, help="folder to write (created)")
    parser.add_argument("--merge", action="store_true", help="fold LoRA adapters into the base weights")
    args = parser.parse_args(argv)
    export(args.ckpt, args.out, merge=args.merge)
