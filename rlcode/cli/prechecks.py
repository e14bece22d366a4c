"""Settings that would fail only after the trainer started (and printed its lines), checked before
anything is built: numbers out of range (``rlcode.cli.ranges``), the checkpoint to start from,
the model, the reward names. Each failure is a ``UserError`` of ``rlcode.cli.errors``: one line of
what and where, one of the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlcode.cli.errors import UserError, did_you_mean
from rlcode.models.aliases import MODEL_ALIASES
from rlcode.rewards.factory import check_reward_names
from rlcode.cli.ranges import check_ranges
from rlcode.run_dir.checkpoint_file import is_sharded_checkpoint
from rlcode.training.fsdp_strategy import STRATEGY_WORDS


def check_before_building(config, argv: list[str] | None = None) -> None:
    """Settings that would fail only after the trainer started (and printed its lines), checked first:
    the numeric settings' ranges, the checkpoint to start from, the model, the reward names."""
    check_ranges(config, argv or [])
    check_strategy((config.get("trainer") or {}).get("strategy", "auto"))
    check_ckpt_path(config.get("ckpt_path"), config["run"])
    model = config.get("model") or {}
    settings = model.get("init_args", model)
    if settings.get("model_name"):
        check_model_name(settings["model_name"], settings.get("rollout_backend"))
    mode = settings.get("mode") or {}
    if (mode.get("init_args") or {}).get("rewards"):
        check_reward_names(mode["init_args"]["rewards"])


# The strategies rlcode runs: Lightning's DDP (any of its registry names) and rlcode's FSDP2, plus what
# Lightning picks for one device. DeepSpeed (what TRL and accelerate users try first) and Lightning's
# FSDP1 wrap only the module's forward, while a training step generates and runs passes outside it.
RUNNING_STRATEGY_NAMES = ("auto", "single_device", *STRATEGY_WORDS)
RUNNING_STRATEGY_CLASSES = ("DDPStrategy", "FSDP2Strategy", "SingleDeviceStrategy", "ModelParallelStrategy")


def check_strategy(strategy) -> None:
    """A strategy rlcode does not run, refused before anything is built (no run folder, no traceback)."""
    if isinstance(strategy, str):
        name = strategy.lower()
        if name in RUNNING_STRATEGY_NAMES or name.startswith("ddp"):
            return
        shown = strategy
    elif isinstance(strategy, dict) or hasattr(strategy, "get"):
        class_path = str(strategy.get("class_path") or "")
        if class_path.rsplit(".", 1)[-1] in RUNNING_STRATEGY_CLASSES:
            return
        shown = class_path or str(strategy)
    else:  # a Strategy object (Python callers): the Learner's own check decides
        return
    raise UserError(f"--trainer.strategy {shown}: rlcode runs two strategies, ddp (Lightning's DDPStrategy) and "
                    "fsdp (rlcode's FSDP2)\n  Use --trainer.strategy ddp or --trainer.strategy fsdp, with "
                    "--trainer.devices N (docs/slurm-and-multi-gpu.md)")


def check_ckpt_path(ckpt_path: str | None, run) -> None:
    """A ``--ckpt_path`` file that does not exist, said before the trainer starts (not a Lightning traceback)."""
    special = str(ckpt_path) in ("best", "last", "hpc") or str(ckpt_path).startswith("registry")
    if not ckpt_path or special or "://" in str(ckpt_path):  # Lightning's keywords, remote files
        return
    path = Path(ckpt_path)
    if path.is_file() or is_sharded_checkpoint(path):  # a file, or FSDP's folder of shards
        return
    folder = Path(run["root_dir"]) / run["experiment"]
    found = sorted(folder.glob("version_*/checkpoints/*.ckpt"), key=lambda p: p.stat().st_mtime)
    hint = f"the newest checkpoint there is {found[-1]}" if found else f"no checkpoint under {folder} yet"
    raise UserError(f"--ckpt_path {ckpt_path}: no such file\n"
                    f"  Use --ckpt_path last to resume the newest run of {folder} ({hint})")


def check_model_name(name: str, backend: str | None) -> None:
    """A model that can only fail to load, said before the trainer starts: not a short name, not a folder,
    not in the Hugging Face cache, and the Hub offline. (Online, transformers decides.)"""
    if backend == "openai" or name in MODEL_ALIASES or Path(name).is_dir():
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on") or _cached(name):
        return
    raise UserError(f"model.model_name {name!r}: not a short name, a local folder or a cached Hub model, and the "
                    f"Hub is offline\n  {did_you_mean(name, MODEL_ALIASES)}Short names: {', '.join(MODEL_ALIASES)}; "
                    "or a local folder, or run once online to cache a Hub id")


def _cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # not a valid repo id: transformers will say why
        return True
