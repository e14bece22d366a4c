"""What ``rlcode --help`` and ``rlcode fit --help`` say: rlcode's commands and training modes.

LightningCLI's own help describes a generic Lightning trainer ("Lightning Trainer command line
tool", "Runs the full optimization routine.", LightningDataModule's docstring cut mid-sentence as the
data section's heading). A training mode is a (model class, data class) pair, which a user picks
with ``model.mode.class_path`` and ``data.class_path`` in a config: the table below is where the help, the "did you mean" of an unknown
class (``rlcode.cli.errors``) and the README name them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.cli import LightningArgumentParser

from rlcode.cli.sections import SECTIONS
from rlcode.setting import settings_by_key


@dataclass(frozen=True)
class Mode:
    """One training mode: its class (``model.mode``), the data class it needs and a config that runs it."""

    title: str
    model: str
    data: str
    config: str


MBPP_DATA = "rlcode.data.datamodule.MBPPDataModule"
GAME_DATA = "rlcode.data.games.GameDataModule"
MODES = (
    Mode("GRPO on MBPP (the default)", "rlcode.modes.GRPO", MBPP_DATA, "configs/quickstart.yaml"),
    Mode("SPIRAL self-play on text games", "rlcode.modes.SPIRAL", GAME_DATA, "configs/spiral_tictactoe.yaml"),
    Mode("multi-step MBPP with execution feedback", "rlcode.modes.MultiStepMBPP", MBPP_DATA,
         "configs/multistep_mbpp.yaml"),
    Mode("the adversarial code game", "rlcode.modes.CodeGame", MBPP_DATA, "configs/code_game.yaml"),
)
MODE_CLASSES = tuple(mode.model for mode in MODES)
DEFAULT_MODE = MODE_CLASSES[0]
DATA_CLASSES = (MBPP_DATA, GAME_DATA)

# One line per command; `export` is not a Lightning subcommand (rlcode.cli hands it to rlcode.cli.export).
COMMANDS = {
    "fit": "train: rollouts, rewards and policy updates, with MBPP evals, checkpoints and resume",
    "validate": "score a model or checkpoint (--ckpt_path): MBPP pass rate on data.eval_split, or game win rates",
    "test": "the same on MBPP's test split (500 problems)",
    "export": "a checkpoint as a peft adapter folder, or with --merge full weights (rlcode export --help)",
}

DESCRIPTION = "rlcode: train code-writing language models with reinforcement learning."
CKPT_PATH_HELP = ("checkpoint to start from: a .ckpt file (inside a run directory: that run goes on there), or "
                  "'last': the newest last.ckpt of run.experiment under run.root_dir, resumed in its own run "
                  "directory (none yet: start fresh)")

_mode_lines = "".join(
    f"  {mode.title}:\n    model.mode: {mode.model}\n"
    + (f"    data:  {mode.data}\n" if mode.data != MBPP_DATA else "")
    + f"    e.g.   rlcode fit --config {mode.config}\n"
    for mode in MODES)
EPILOG = (
    "training modes (class_path of model.mode: and data: in a config, or --model.mode / --data):\n" + _mode_lines
    + "\nSettings of a mode: rlcode fit --model.mode.help SPIRAL. Several --config files overlay left to right;\n"
    "--print_config shows the merged result. A mistake prints a short message naming the key and the fix;\n"
    "--debug (or RLCODE_DEBUG=1) shows the full traceback."
)

MODEL_TITLE = ("Model: the learner's settings (every mode reads them) and model.mode, the training mode (" + ", ".join(
    path.rsplit(".", 1)[1] for path in MODE_CLASSES) + "; rlcode fit --model.mode.help CLASS lists a mode's settings)")
DATA_TITLE = ("Data: MBPPDataModule (MBPP prompts; the default) or GameDataModule (SPIRAL's games); "
              "rlcode fit --data.help CLASS lists its settings")


USAGE = ("rlcode {name} [--config FILE.yaml ...] [--model.KEY VALUE] [--model.mode.KEY VALUE] [--data.KEY VALUE]\n"
         "       [--run.KEY VALUE] [--eval.KEY VALUE] [--checkpoint.KEY VALUE] [--trainer.KEY VALUE]\n"
         "       [--ckpt_path PATH] [--print_config]")
TRAINER_TITLE = ("Lightning's trainer flags (trainer.*; when unset, rlcode chooses precision for the hardware "
                 "and, on several GPUs, the strategy)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's formatter, keeping the line breaks of the description and the epilog; the
    strategy's help is rlcode's whole (jsonargparse would append every Strategy subclass it knows)."""

    def _get_help_string(self, action) -> str:
        if action.dest == "trainer.strategy":
            return STRATEGY_HELP
        text = super()._get_help_string(action)
        setting = SETTINGS.get(action.dest.replace(".init_args.", "."))
        if setting is None or not text.endswith(")"):
            return text
        allowed = f"allowed: {setting.range.describe()}, " if setting.range is not None else ""
        return f"{text[:-1]}, {allowed}{'fixed' if setting.on_resume == 'fixed' else 'may change'} on resume)"


class RLCodeParser(LightningArgumentParser):
    """Lightning's parser with rlcode's formatter in every help, ``--model.mode.help SPIRAL`` too
    (jsonargparse builds that one as a fresh ``type(parser)()``, which would take its own formatter)."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


# Each setting's range and resume rule, from its annotation (rlcode.setting), by its dotted key.
SETTINGS = {key: setting for section, classes in SECTIONS.items() for cls in classes
            for key, setting in settings_by_key(cls, section).items()}

STRATEGY_HELP = ("ddp (Lightning's DDPStrategy) or fsdp (rlcode's FSDP2), with --trainer.devices N; unset, rlcode "
                 "picks per GPU. Nothing else runs (DeepSpeed, XLA and Lightning's FSDP1 are refused)")


def describe_subcommands(parser) -> None:
    """Replace the Trainer-method docstrings LightningCLI lists the subcommands with by rlcode's lines,
    list ``export`` with them (help only: ``rlcode.cli`` hands it to ``rlcode.cli.export`` before parsing)
    and say what ``--ckpt_path last`` means in rlcode."""
    action = parser._subcommands_action
    for choice in action._choices_actions:
        choice.help = COMMANDS.get(choice.dest, choice.help)
    if "export" not in action.choices:
        action._choices_actions.append(action._ChoicesPseudoAction("export", (), COMMANDS["export"]))
        action.metavar = "{" + ",".join(COMMANDS) + "}"
    for name, subparser in action.choices.items():
        subparser.description = f"rlcode {name}: {COMMANDS.get(name, '')}"
        for group in subparser._action_groups:
            for option in group._group_actions:
                if option.dest == "ckpt_path":
                    option.help, group.title = CKPT_PATH_HELP, f"Where {name} starts from"
        rlcode_settings_first(subparser, name)


def rlcode_settings_first(subparser, name: str) -> None:
    """``rlcode <command> --help`` in the order a user reads it: a short usage line, then the mode and
    the learner (``model``), the data, the run, the callbacks, where it starts from, and Lightning's
    trainer flags last. Lightning's order put ~40 trainer flags first, in the usage line too."""
    trainer = (getattr(subparser, "groups", None) or {}).get("trainer")
    if trainer is None:
        return
    trainer.title = TRAINER_TITLE
    subparser._action_groups.remove(trainer)
    subparser._action_groups.append(trainer)
    subparser.usage = USAGE.format(name=name)


def retitle_groups(parser) -> None:
    """Headings of the model and data sections of ``rlcode <command> --help``."""
    groups = getattr(parser, "groups", None) or {}
    for key, title in (("model", MODEL_TITLE), ("data", DATA_TITLE)):
        if key in groups:
            groups[key].title = title
