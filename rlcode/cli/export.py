"""``rlcode export --ckpt runs/x/version_0/checkpoints/last.ckpt --out DIR [--merge]``.

A training checkpoint is Lightning's file (adapters only under LoRA, with optimizer state); people
want what transformers and peft load. Without ``--merge`` a LoRA run gives a peft adapter folder
(``adapter_config.json`` naming the base model, ``adapter_model.safetensors``), a full fine-tune the
whole model; with ``--merge`` the adapters are folded into full-precision weights (a 4-bit or 8-bit
base is dequantized first: merging into NF4 weights would round the update away).
The tokenizer is saved beside either, so ``AutoModelForCausalLM.from_pretrained(DIR)`` works.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from jsonargparse import ArgumentParser

from rlcode.models import is_lora_model, load_model
from rlcode.models.aliases import MODEL_ALIASES
from rlcode.models.plain_weights import plain_weights
from rlcode.run_dir.checkpoint_file import is_sharded_checkpoint, load_whole_checkpoint
from rlcode.training.learner import Learner
from rlcode.training.mode import Mode
# Settings that build things export never uses: a vLLM engine or a server client instead of the
# weights, activation checkpointing (it would also save use_cache=false into config.json), a frozen
# KL reference copy of the whole model.
_EXPORT_SETTINGS = {"rollout_backend": "hf", "gradient_checkpointing": False, "beta": 0.0}


class ExportError(SystemExit):
    """A one-line error about the user's input (no traceback): what is wrong and what to pass."""

    def __init__(self, message: str) -> None:
        super().__init__(f"rlcode export: {message}")


def export(ckpt: str | Path, out: str | Path, *, merge: bool = False) -> Path:
    """Write the checkpoint's policy to ``out`` as a peft adapter folder or full weights."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {out} exists and is not an empty folder: pass a new one (an earlier export's "
                          "files would mix with this one's, e.g. an adapter_config.json beside merged weights)")
    checkpoint = read_checkpoint(ckpt)
    module = restore_module(checkpoint, ckpt)
    policy = module.policy
    if merge and is_lora_model(policy):
        policy, kind = merged_model(module), "merged weights"
    else:
        kind = "peft adapters" if is_lora_model(policy) else "full weights"
        if merge:
            kind += " (a full fine-tune: no adapters to merge)"
    # Written beside the target and renamed into place: an interrupted export leaves no half folder.
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        if is_lora_model(policy):
            name_base_model(policy, module.hparams.model_name)
        policy.save_pretrained(partial)
        module.tokenizer.save_pretrained(partial)
        readable_as_umask_allows(partial)
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print(f"rlcode export: {kind} of {type(module.mode).__name__} at step {checkpoint.get('global_step', '?')} in {out}")
    return out


def name_base_model(policy, model_name: str) -> None:
    """Adapters name their base by what others can load: a short name's public hub id (its own
    name where none exists, which rlcode resolves), never the folder in this user's cache."""
    alias = MODEL_ALIASES.get(model_name)
    if alias is not None:
        for config in policy.peft_config.values():
            config.base_model_name_or_path = alias.public_name or alias.name


def readable_as_umask_allows(folder: Path) -> None:
    """Give the folder and its files the modes a plain ``open``/``mkdir`` would: mkdtemp makes the
    folder owner-only, and safetensors wrote its weights 0600 while the rest was 0644."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def read_checkpoint(ckpt: str | Path) -> dict[str, Any]:
    path = Path(ckpt)
    if path.is_dir() and not is_sharded_checkpoint(path):
        raise ExportError(f"{ckpt} is a folder: pass the .ckpt file in it, e.g. {path}/checkpoints/last.ckpt")
    if not path.exists():
        raise ExportError(f"no checkpoint at {ckpt}: pass a .ckpt file, "
                          "e.g. runs/<exp>/version_0/checkpoints/last.ckpt")
    try:
        checkpoint = load_whole_checkpoint(path)  # a sharded (FSDP) folder's shards joined
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError, ModuleNotFoundError) as error:
        first_line = (str(error).splitlines() or [""])[0]
        raise ExportError(f"{ckpt} is not a checkpoint torch can read ({type(error).__name__}: {first_line}): "
                          "pass a .ckpt written by rlcode fit") from None
    if not isinstance(checkpoint, dict) or not {"state_dict", "hyper_parameters"} <= checkpoint.keys():
        raise ExportError(f"{ckpt} is not an rlcode training checkpoint (no state_dict and hyper_parameters): "
                          "pass a .ckpt written by rlcode fit")
    return checkpoint


def build_mode(checkpoint: dict[str, Any], ckpt: str | Path = "the checkpoint") -> Mode:
    """The checkpoint's training mode, built from ``hyper_parameters["mode"]`` (its class path and
    settings, as the Learner saves them) the way a config builds it (settings objects from dicts)."""
    spec = checkpoint["hyper_parameters"].get("mode")
    if not isinstance(spec, dict) or "class_path" not in spec:
        raise ExportError(f"{ckpt} names no training mode (hyper_parameters has no mode): it was written by an "
                          "rlcode from before model.mode, or not by rlcode fit; export it with the rlcode that wrote it")
    module_name, _, name = str(spec["class_path"]).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        raise ExportError(f"{ckpt} was trained with the mode {spec['class_path']}, which cannot be imported here: "
                          "install or put on PYTHONPATH the package that defines it") from None
    if not (isinstance(cls, type) and issubclass(cls, Mode)):
        raise ExportError(f"{ckpt} names {spec['class_path']} as its mode, which is not an rlcode training mode "
                          "(rlcode.training.mode.Mode): pass a .ckpt written by rlcode fit")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--mode", type=Mode)
    config = parser.parse_object({"mode": {"class_path": spec["class_path"], "init_args": spec.get("init_args", {})}})
    return parser.instantiate_classes(config).mode


def restore_module(checkpoint: dict[str, Any], ckpt: str | Path = "the checkpoint") -> Learner:
    """The checkpoint's Learner and mode, built from its settings, with the trained weights loaded."""
    mode = build_mode(checkpoint, ckpt)
    settings = {key: value for key, value in checkpoint["hyper_parameters"].items()
                if not key.startswith("_") and key != "mode"}
    settings.update({key: value for key, value in _EXPORT_SETTINGS.items() if key in settings})
    settings["dry_run"] = False  # a served dry run would build no local policy at all
    module = Learner(mode=mode, **settings)
    module.configure_model()
    saved = checkpoint["state_dict"]
    result = module.load_state_dict(saved, strict=False)
    trainable = {f"policy.{name}" for name, p in module.policy.named_parameters() if p.requires_grad}
    # LoRA checkpoints hold the adapters only (the frozen base comes from model_name); a full
    # fine-tune holds every weight. Either way each trained weight must come from the file.
    expected_missing = set(result.missing_keys) - trainable if is_lora_model(module.policy) else set()
    absent = set(result.missing_keys) - expected_missing
    if result.unexpected_keys or absent:
        what = "LoRA adapters" if is_lora_model(module.policy) else "full weights"
        raise ExportError(f"{ckpt} does not fit {type(mode).__name__}({module.hparams.model_name!r}) with {what}: "
                          f"{len(absent)} weights missing (e.g. {sorted(absent)[:1]}), {len(result.unexpected_keys)} "
                          f"unexpected (e.g. {result.unexpected_keys[:1]}): was it written by a different rlcode?")
    module.policy.eval()
    return module


def merged_model(module: Learner):
    """A plain (peft-free, unquantized) copy of the LoRA policy with the adapters folded in.

    Every merged weight is computed in float64 from the weights the trained policy computes with (a
    quantized base dequantized, as its forward does) and rounded once to the training weight dtype
    (the plain model's ``copy_``), so the result is as close to the trained policy as that dtype
    allows. One weight at a time: the float64 copy is never a whole model.
    """
    plain = load_model(module.hparams.model_name, precision=module.hparams.precision)
    targets = dict(plain.named_parameters())  # a tied head comes once, as the embedding, in both
    unknown = []
    try:
        with torch.no_grad():
            for name, tensor in plain_weights(module.policy, dtype=torch.float64):
                target = targets.pop(name, None)
                if target is None:
                    unknown.append(name)
                else:
                    target.copy_(tensor)
    except NotImplementedError as error:
        raise ExportError(f"--merge: {error}, or export without --merge and load the adapter folder with "
                          "peft") from None
    if unknown or targets:
        raise ExportError(f"--merge: the trained policy's weights do not fit {module.hparams.model_name} "
                          f"(not in it: {unknown[:3]}, not trained: {sorted(targets)[:3]}); export without --merge")
    return plain.eval()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="rlcode export", description=__doc__.split("\n\n")[1])
    parser.add_argument("--ckpt", required=True, help="a training checkpoint (.ckpt) of rlcode fit, any mode")
    parser.add_argument("--out", required=True, help="a new or empty folder to write")
    parser.add_argument("--merge", action="store_true",
                        help="fold LoRA adapters into full-precision base weights (a quantized base is dequantized)")
    args = parser.parse_args(argv)
    export(args.ckpt, args.out, merge=args.merge)
