"""Configs and command lines written before training modes had their own settings, said in one line.

Before, ``model:`` was the mode's class (``class_path: rlcode.algorithms.spiral.SPIRAL``) with every
setting under ``init_args``, the mode's own next to the shared ones. Now ``model:`` is the Learner
(the settings every mode reads, no class_path) and ``model.mode:`` the mode with its own settings.
jsonargparse would report such a config as an unknown key with the whole usage; this check runs
first and names the new form: ``rlcode: model.num_generations is a setting of the mode now: write it
under model.mode.init_args (see docs/configs.md); model.class_path rlcode.algorithms.spiral.SPIRAL
is now model.mode.class_path rlcode.modes.SPIRAL``.
"""

from __future__ import annotations

import inspect

import yaml

from rlcode.cli.errors import UserError, config_files
from rlcode.cli.help import MODE_CLASSES
from rlcode.modes import GRPO, SPIRAL, CodeGame, MultiStepMBPP
from rlcode.training.learner import Learner

RENAMED = {
    "filter_zero_std_groups": "model.skip_zero_advantage_rows",
    "drop_zero_advantage_turns": "model.skip_zero_advantage_rows",
    "sandbox_workers": "model.mode.init_args.sandbox.workers",
    "sandbox_allow_visible_filesystem": "model.mode.init_args.sandbox.allow_visible_filesystem",
}
SEE = "(see docs/configs.md)"


def _parameters(cls) -> set[str]:
    return {p.name for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"}


LEARNER_KEYS = _parameters(Learner)
MODE_KEYS = set().union(*(_parameters(mode) for mode in (GRPO, SPIRAL, MultiStepMBPP, CodeGame))) - LEARNER_KEYS


def new_class_path(old: str) -> str | None:
    """``rlcode.algorithms.spiral.SPIRAL`` -> ``rlcode.modes.SPIRAL`` (None: not a mode's name)."""
    name = str(old).rsplit(".", 1)[-1]
    return next((path for path in MODE_CLASSES if path.rsplit(".", 1)[1] == name), None)


def _keys_problems(keys: list[str], prefix: str = "model.") -> list[str]:
    """What to say about old keys: renamed ones one by one, the mode's together."""
    problems = [f"{prefix}{key} is now {'--' if prefix.startswith('--') else ''}{RENAMED[key]}"
                for key in keys if key in RENAMED]
    moved = [f"{prefix}{key}" for key in keys if key in MODE_KEYS]
    if len(moved) == 1:
        problems.insert(0, f"{moved[0]} is a setting of the mode now: write it under model.mode.init_args {SEE}")
    elif moved:
        problems.insert(0, f"{', '.join(moved)} are settings of the mode now: write them under "
                           f"model.mode.init_args {SEE}")
    return problems


def _class_problem(old: str) -> str:
    new = new_class_path(old)
    if new is None:
        return (f"model.class_path {old} is gone: model is the Learner, and the training mode is "
                f"model.mode.class_path (one of {', '.join(MODE_CLASSES)})")
    return f"model.class_path {old} is now model.mode.class_path {new}"


def _model_flag_problem(value: str) -> str:
    """``--model SPIRAL`` named the mode before; ``--model Qwen/...`` names the model in older scripts."""
    new = new_class_path(value)
    if new is not None:
        return f"--model {value} is now --model.mode {new}"
    return f"--model {value}: the model is --model.model_name {value} (the training mode is --model.mode)"


def _problems_of_section(model: dict) -> list[str]:
    keys = [key for key in model if key not in ("class_path", "init_args")]
    keys += list(model.get("init_args") or {}) if isinstance(model.get("init_args"), dict) else []
    problems = _keys_problems(keys)
    if "class_path" in model:
        problems.append(_class_problem(model["class_path"]))
    elif "init_args" in model and not problems:
        problems.append(f"model.init_args is gone: write the learner's settings directly under model: {SEE}")
    return problems


def _problems_of_flags(argv: list[str]) -> list[str]:
    problems, keys = [], []
    for index, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag == "--model" and not value and index + 1 < len(argv):
            value = argv[index + 1]
        if flag == "--model" and value and not value.lstrip().startswith("{"):
            problems.append(_model_flag_problem(value))
        elif flag in ("--model.class_path", "--model.init_args"):
            problems.append(f"{flag} is gone: model is the Learner; the mode is --model.mode NAME")
        elif flag.startswith("--model.init_args."):
            keys.append(flag.removeprefix("--model.init_args."))
        elif flag.startswith("--model.") and flag.count(".") == 1:
            keys.append(flag.removeprefix("--model."))
    return problems + _keys_problems([key for key in keys if key in RENAMED or key in MODE_KEYS], prefix="--model.")


def check(argv: list[str]) -> None:
    """Raise a one-line ``UserError`` naming the new form when a config or flag has the old one."""
    for path in config_files(argv):
        try:
            model = (yaml.safe_load(path.read_text()) or {}).get("model")
        except (OSError, yaml.YAMLError, AttributeError):
            continue  # a missing or broken file: the parser says so
        if isinstance(model, dict):
            problems = _problems_of_section(model)
            if problems:
                raise UserError(f"{'; '.join(problems)} ({path})")
    problems = _problems_of_flags(argv)
    if problems:
        raise UserError(f"{'; '.join(problems)} (on the command line)")
