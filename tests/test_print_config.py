"""``--print_config`` of every config in configs/ lists only settings its mode reads.

``model:`` is the Learner (the settings every mode reads) and ``model.mode`` the training mode with
its own settings. The expected key sets are derived from the classes' signatures, and each config's
mode from the config file itself, so a setting that moved to the wrong class, a mode key printed at
the learner level or a config that names another mode fails here.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from pathlib import Path

import pytest
import yaml

from rlcode.cli import command as cli
from rlcode.cli.help import DEFAULT_MODE
from rlcode.modes import GRPO, SPIRAL, CodeGame, MultiStepMBPP
from rlcode.training.learner import Learner

from config_stacks import CONFIGS, REPO, config_id, config_stack

# Linked from trainer.precision, so never printed (one precision knob).
LINKED = {"precision"}


def parameters(cls) -> set[str]:
    return {p.name for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"}


def printed(capsys, *configs: Path, extra: tuple[str, ...] = ()) -> dict:
    args = ["fit", *[item for config in configs for item in ("--config", str(config))], *extra, "--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def named_mode(files: list[Path]) -> str:
    """The mode class a stack of config files names (the last that names one), else the default."""
    named = DEFAULT_MODE
    for path in files:
        mode = ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("mode") or {}
        named = mode.get("class_path", named)
    return named


def resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_no_setting_is_both_a_learner_and_a_mode_setting():
    learner = parameters(Learner) - {"mode"}
    for mode in (GRPO, SPIRAL, MultiStepMBPP, CodeGame):
        assert not learner & parameters(mode), mode.__name__


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_the_model_section_lists_only_what_the_mode_reads(config, capsys):
    files = config_stack(config)
    shown = printed(capsys, *files)
    model = shown["model"]
    mode = model.pop("mode")
    games = shown["data"]["class_path"].endswith(".GameDataModule")
    assert ("game_eval" in shown, "eval" in shown) == (games, not games), \
        "only the evaluation the run's data feeds: games against a random mover, or MBPP/HumanEval problems"
    mode_class = resolve(mode["class_path"])
    assert mode_class is resolve(named_mode(files)), "the printed mode is the one the config names"
    assert set(model) == parameters(Learner) - {"mode"} - LINKED, "model: holds exactly the learner's settings"
    assert set(mode["init_args"]) == parameters(mode_class), "model.mode.init_args: exactly the mode's settings"


def test_spiral_shows_no_reward_group_or_sandbox_settings(capsys):
    model = printed(capsys, REPO / "configs/spiral_tictactoe.yaml")["model"]
    shown = set(model) | set(model["mode"]["init_args"])
    for key in ("rewards", "reward_weights", "num_generations", "scale_rewards", "reward_timeout", "sandbox",
                "sandbox_workers", "sandbox_allow_visible_filesystem", "filter_zero_std_groups"):
        assert key not in shown, key
    assert model["mode"]["init_args"]["move_format"] == "bracket"  # the config's own value, so not vacuous


def test_spiral_has_no_group_size_to_refuse(capsys):
    """num_generations belongs to the modes with groups: SPIRAL neither has nor refuses it, and the
    learner under SPIRAL builds without it."""
    assert "num_generations" not in parameters(SPIRAL)
    spiral = Learner(mode=SPIRAL(opponent="self"), model_name="tiny-random")
    assert spiral.run_description().group_size is None
    with pytest.raises(ValueError, match="num_generations=1 gives every group a zero std"):
        GRPO(num_generations=1)  # still refused where a group of one has no signal
    with pytest.raises(SystemExit, match="num_generations is not a setting of SPIRAL"):
        cli.main(["fit", "--config", str(REPO / "configs/spiral_tictactoe.yaml"),
                  "--model.mode.num_generations", "1", "--print_config"])


def test_print_config_warns_of_nothing_deprecated(capsys, monkeypatch):
    """A user's `--print_config` is a config to copy, not a page of jsonargparse deprecation notices
    (``dump(skip_check=, skip_none=)`` printed two, renamed ``skip_validation``, ``skip_unset``)."""
    from jsonargparse._deprecated import JsonargparseDeprecationWarning  # not exported at the top

    monkeypatch.setenv("JSONARGPARSE_DEPRECATION_WARNINGS", "all")  # else each shows once per process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        printed(capsys, REPO / "configs/quickstart.yaml")
    assert not [w for w in caught if issubclass(w.category, JsonargparseDeprecationWarning)]
