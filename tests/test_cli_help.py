"""``rlcode --help`` and ``rlcode fit --help`` describe rlcode: its commands, its four training modes
with their class paths and a config of each, and headings of its own."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from rlcode.cli.command import main
from rlcode.cli.help import COMMANDS, MODES

REPO = Path(__file__).resolve().parents[1]


def _help(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as stop:
        main([*args, "--help"])
    assert stop.value.code in (0, None)
    return capsys.readouterr().out


def test_main_help_lists_the_commands_and_the_training_modes(capsys):
    text = _help(capsys)
    assert "rlcode: train code-writing language models" in text and "Lightning Trainer" not in text
    for command in ("fit", "validate", "test", "export"):
        assert any(line.split()[:1] == [command] and len(line.split()) > 3 for line in text.splitlines()), command
    assert "predict" not in text
    for path in ("rlcode.modes.GRPO", "rlcode.modes.SPIRAL", "rlcode.data.games.GameDataModule",
                 "rlcode.modes.MultiStepMBPP", "rlcode.modes.CodeGame", "model.mode"):
        assert path in text, path
    assert "--debug" in text


@pytest.mark.parametrize("mode", MODES, ids=[mode.model.rsplit(".", 1)[1] for mode in MODES])
def test_each_mode_names_real_classes_and_a_config_that_uses_them(mode):
    for path in (mode.model, mode.data):
        module, name = path.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), name), path
    config = yaml.safe_load((REPO / mode.config).read_text())
    model_class = ((config.get("model") or {}).get("mode") or {}).get("class_path", "rlcode.modes.GRPO")
    data_class = (config.get("data") or {}).get("class_path", "rlcode.data.datamodule.MBPPDataModule")
    assert (model_class, data_class) == (mode.model, mode.data)


def test_fit_help_lists_every_mode_class_under_headings_of_its_own(capsys):
    text = _help(capsys, "fit")
    for name in ("SPIRAL", "MultiStepMBPP", "CodeGame", "GameDataModule", "MBPPDataModule"):
        assert f".{name}" in text, name  # as a known subclass: `--model.mode SPIRAL` works
    assert "A DataModule standardizes" not in text and "Runs the full optimization routine" not in text
    data_heading = next(line for line in text.splitlines() if line.startswith("Data:"))
    assert "MBPPDataModule" in data_heading and "GameDataModule" in data_heading
    assert f"rlcode fit: {COMMANDS['fit']}" in text
    assert "newest last.ckpt of run.experiment" in text  # what --ckpt_path last means in rlcode


def test_a_mode_is_chosen_by_its_short_name(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--model.mode", "MultiStepMBPP", "--data", "MBPPDataModule", "--print_config"])
    merged = yaml.safe_load(capsys.readouterr().out)
    assert merged["model"]["mode"]["class_path"] == "rlcode.modes.MultiStepMBPP"


def test_fit_help_shows_rlcode_settings_before_lightning_trainer_flags(capsys):
    """Lightning's order opened with ~40 trainer flags, in the usage line too: rlcode's own settings
    (the mode and the learner, data, run, evals, checkpoints, --ckpt_path) come first now."""
    text = _help(capsys, "fit")
    usage = text.split("\n\n", 1)[0]
    assert usage.startswith("usage: rlcode fit") and "--trainer.KEY VALUE" in usage and "accelerator" not in usage
    lines = text.splitlines()
    first = {key: next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"--{key}"))
             for key in ("model.mode", "model.model_name", "data", "run.experiment", "eval.num_questions",
                         "checkpoint.every_n_train_steps", "ckpt_path", "trainer.accelerator")}
    assert max(v for k, v in first.items() if not k.startswith("trainer")) < first["trainer.accelerator"], first
    assert first["model.mode"] < first["model.model_name"]
    assert any(line.startswith("Lightning's trainer flags") for line in lines)


def test_fit_help_lists_only_the_strategies_that_run(capsys):
    """Lightning listed DeepSpeedStrategy, XLAStrategy and FSDPStrategy as choices; only ddp and
    rlcode's FSDP2 run (the rest is refused before a run starts: tests/test_cli_errors.py)."""
    text = _help(capsys, "fit")
    block = text.split("--trainer.strategy STRATEGY", 1)[1].split("\n  --", 1)[0]
    assert "ddp" in block and "fsdp" in block, block
    assert "DeepSpeedStrategy" not in block and "XLAStrategy" not in block and "known subclasses" not in block, block
