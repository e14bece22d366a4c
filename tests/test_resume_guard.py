"""A resume goes on with the run its checkpoint belongs to: another mode, or settings that change what
a step computes, are refused in one line naming each difference and how to start a new run, before
anything is built or trimmed; settings of speed, evaluation and length may change."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcode.cli.command import main
from rlcode.cli.resume_guard import differences

REPO = Path(__file__).resolve().parents[1]
TINY_GRPO = ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
             "--config", str(REPO / "configs/tiny_grpo.yaml")]
QUIET = ["--eval.at_start", "false", "--eval.at_end", "false"]


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory) -> Path:
    """The root of a one-step GRPO run of the tiny stack (its last.ckpt)."""
    root = tmp_path_factory.mktemp("resume_guard")
    try:
        main(["fit", *TINY_GRPO, *QUIET, "--run.root_dir", str(root), "--trainer.max_steps", "1"])
    except SystemExit as stop:
        assert stop.code in (0, None), stop.code
    assert (root / "tiny/version_0/checkpoints/last.ckpt").is_file()
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in sorted(root.rglob("*"))
            if path.is_file() and "wandb" not in path.parts}


def _refusal(args) -> str:
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code not in (0, None)
    return str(stop.value.code)


@pytest.mark.slow
def test_resuming_with_another_modes_config_is_refused_and_leaves_the_run_as_it_was(grpo_run):
    before = _snapshot(grpo_run)
    message = _refusal(["fit", "--config", str(REPO / "configs/spiral_tictactoe.yaml"),
                        "--config", str(REPO / "configs/tiny_test.yaml"), "--run.root_dir", str(grpo_run),
                        "--ckpt_path", "last"])
    assert len(message.splitlines()) == 1, message
    assert "belongs to a run with other settings: model.mode SPIRAL (checkpoint: GRPO)" in message
    assert "another --run.experiment or without --ckpt_path" in message
    assert "tiny/version_0/config.yaml" in message
    assert _snapshot(grpo_run) == before  # no new version, rollouts not trimmed, nothing written


@pytest.mark.slow
def test_resuming_with_another_learning_rate_or_group_size_is_refused(grpo_run):
    ckpt = grpo_run / "tiny/version_0/checkpoints/last.ckpt"
    message = _refusal(["fit", *TINY_GRPO, *QUIET, "--run.root_dir", str(grpo_run), "--ckpt_path", str(ckpt),
                        "--model.learning_rate=3e-6", "--model.mode.num_generations=2"])
    assert "model.mode.num_generations 2 (checkpoint: 4)" in message, message
    assert "model.learning_rate 3e-06 (checkpoint: 2e-05)" in message, message


def test_settings_of_speed_may_change_and_fixed_ones_may_not():
    saved = {"model_name": "tiny-random", "learning_rate": 1e-6, "micro_batch_size": 8, "precision": "32-true",
             "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
             "mode": {"class_path": "rlcode.modes.grpo.GRPO",
                      "init_args": {"num_generations": 4, "sandbox": {"workers": 2}, "rewards": ["execution"]}}}
    config = {**saved, "micro_batch_size": 2, "precision": "bf16-true",
              "mode": {"class_path": "rlcode.modes.GRPO",
                       "init_args": {"num_generations": 4, "sandbox": {"workers": 8}, "rewards": ("execution",)}}}
    assert differences(saved, config) == []
    changed = {**config, "lora": {"r": 8, "alpha": 8, "dropout": 0.0}}
    assert differences(saved, changed) == ["model.lora {'r': 8, 'alpha': 8, 'dropout': 0.0} "
                                           "(checkpoint: {'r': 4, 'alpha': 8, 'dropout': 0.0})"]
    other_mode = {**config, "mode": {"class_path": "rlcode.modes.SPIRAL", "init_args": {}}}
    assert differences(saved, other_mode) == ["model.mode SPIRAL (checkpoint: GRPO)"]
