"""A resume goes on with the run the checkpoint belongs to, or is refused in one line.

A checkpoint knows its run's settings: the Learner saves its own in ``hyper_parameters`` and the
mode's class and settings as ``hyper_parameters["mode"]``. ``rlcode fit --ckpt_path X`` (or
``last``) with a config whose settings differ in what a step computes would train one run on top of
another (SPIRAL's games into a GRPO run, its summary mixing both), or be silently overridden (the
optimizer's learning rate comes back from the checkpoint). Such a resume is refused before
anything is built or trimmed, naming each difference and how to start a new run instead.

What must match is what each setting says of itself (``fixed(...)`` in its annotation,
``rlcode.setting``; ``rlcode fit --help`` shows "fixed on resume"): the mode's class and its fixed
settings (all but ``sandbox``: where the code runs, not what it computes); the Learner's model
(``model_name``, ``lora``, ``quantization``), sampling, loss and update settings.

What may change on resume: everything else. ``trainer.max_steps`` (to train longer), data,
evaluation, logging, checkpointing and ``run:`` settings; and the Learner's settings that change
only where or how fast a step runs, not what it computes: ``precision`` (another GPU),
``gradient_checkpointing``, the micro-batch sizes, ``share_prefix``, ``skip_zero_advantage_rows``,
and the sampler (``rollout_backend``, ``rollout_precision``, ``vllm``, ``openai``: a run may move
between a CPU and a GPU machine; a sampler that is not the policy is corrected for by the
importance weights either way). Settings a checkpoint does not record (written by an older rlcode)
are not compared.
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from rlcode.cli.errors import UserError
from rlcode.cli.sections import SECTIONS
from rlcode.run_dir.checkpoint_file import checkpoint_metadata
from rlcode.setting import fixed_names
from rlcode.training.learner import Learner

FIXED = tuple(name for name in fixed_names(Learner) if name != "mode")  # the mode: its class, then its own
MODE_FIXED = {mode.__name__: fixed_names(mode) for mode in SECTIONS["model.mode"]}
SHOWN = 3  # differences named in the line; the rest are counted


class RunAlreadyFinished(Exception):
    """A resume of a run that reached its ``max_steps``: nothing to do, and nothing is touched (it had
    rewritten metrics.csv, the plot and the summary, which then said ``0.00 at step 0``)."""


def check_not_finished(ckpt_path: str | None, max_steps: int | None) -> None:
    """Raise ``RunAlreadyFinished`` when ``ckpt_path`` holds a run at or past ``max_steps``."""
    if not ckpt_path or not Path(ckpt_path).exists() or not max_steps or max_steps < 0:
        return
    step = int(checkpoint_metadata(ckpt_path).get("global_step", 0))
    if step >= max_steps:
        raise RunAlreadyFinished(f"the run of {ckpt_path} already finished (step {step} of --trainer.max_steps "
                                 f"{max_steps}): nothing to resume, nothing changed. To train it further, raise "
                                 "--trainer.max_steps")


def check_resume(ckpt_path: str | None, model_config) -> None:
    """Raise a one-line ``UserError`` when ``ckpt_path``'s run had other fixed settings than ``model_config``."""
    if not ckpt_path or not Path(ckpt_path).exists():  # Lightning's keywords ("hpc"), remote files
        return
    saved = checkpoint_metadata(ckpt_path).get("hyper_parameters") or {}
    found = differences(_plain(saved), _plain(model_config))
    if found:
        raise UserError(_refusal(ckpt_path, found))


def differences(saved: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """``model.X VALUE (checkpoint: VALUE)`` for each fixed setting that differs."""
    found = _mode_differences(saved.get("mode"), config.get("mode"))
    for key in FIXED:
        if key in saved and key in config and not _same(saved[key], config[key]):
            found.append(f"model.{key} {config[key]!r} (checkpoint: {saved[key]!r})")
    return found


def _mode_differences(saved, config) -> list[str]:
    if not isinstance(saved, dict) or not isinstance(config, dict):
        return []
    old, new = _class_name(saved.get("class_path")), _class_name(config.get("class_path"))
    if old != new:  # another mode: its settings are not comparable
        return [f"model.mode {new} (checkpoint: {old})"]
    old_args, new_args = saved.get("init_args") or {}, config.get("init_args") or {}
    fixed = MODE_FIXED.get(new, tuple(old_args))  # a class rlcode does not know: every setting counts
    return [f"model.mode.{key} {new_args[key]!r} (checkpoint: {old_args[key]!r})" for key in old_args
            if key in new_args and key in fixed and not _same(old_args[key], new_args[key])]


def _refusal(ckpt_path: str, found: list[str]) -> str:
    shown = ", ".join(found[:SHOWN]) + (f" and {len(found) - SHOWN} more" if len(found) > SHOWN else "")
    own = Path(ckpt_path).parent.parent / "config.yaml"
    resume = f"resume with its own config ({own})" if own.is_file() else "resume with the run's own settings"
    return (f"--ckpt_path {ckpt_path} belongs to a run with other settings: {shown}; {resume}, or start a "
            "new run with another --run.experiment or without --ckpt_path")


def _class_name(class_path) -> str:
    """``rlcode.modes.spiral.SPIRAL`` and ``rlcode.modes.SPIRAL`` are one class: compare the names."""
    return str(class_path).rsplit(".", 1)[-1]


def _same(a, b) -> bool:
    return _plain(a) == _plain(b)


def _plain(value):
    """Namespaces, settings objects and tuples as dicts and lists, as a checkpoint stores them."""
    if hasattr(value, "as_dict"):  # jsonargparse's Namespace
        value = value.as_dict()
    elif is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    elif hasattr(value, "__dict__") and not isinstance(value, type) and type(value).__module__.startswith("rlcode"):
        value = vars(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
