"""Every YAML under configs/ parses with --print_config; the CLI's run-directory and offline rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlcode import run_dir
from rlcode.cli import command as cli
from rlcode.run_dir import loggers

from config_stacks import CONFIGS, REPO, config_id, config_stack


def _print_config(capsys, *configs: Path, extra: tuple[str, ...] = ()) -> dict:
    """The merged config: ``model`` holds the learner's settings and the mode's (``model_class``: the
    mode's class), ``data`` the data's settings (``data_class``: its class)."""
    args = ["fit"] + [item for config in configs for item in ("--config", str(config))] + list(extra)
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*args, "--print_config"])
    assert exit_info.value.code in (0, None)
    merged = yaml.safe_load(capsys.readouterr().out)
    mode = merged["model"].pop("mode")
    merged["model_class"] = mode["class_path"]
    merged["model"] = {**merged["model"], **mode.get("init_args", {})}
    merged["data_class"] = merged["data"]["class_path"]
    merged["data"] = merged["data"].get("init_args", {})
    return merged


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_every_config_parses(config, capsys):
    merged = _print_config(capsys, *config_stack(config))
    if merged["model_class"].endswith(".SPIRAL"):
        assert merged["data_class"].endswith(".GameDataModule") and merged["data"]["games"]
    elif merged["model_class"].endswith(".GRPO"):
        assert merged["model"]["rewards"], "a GRPO config without rewards cannot train"
    assert merged["checkpoint"] and merged["run"]["experiment"]
    # One evaluation group, the one the run's data feeds.
    assert ("game_eval" in merged) == merged["data_class"].endswith(".GameDataModule") != ("eval" in merged)
    text = config.read_text().lower()
    assert "api_key" not in text and "wandb_api" not in text  # secrets live in the environment / .env


def test_overlays_apply_left_to_right(capsys):
    merged = _print_config(capsys, REPO / "configs/quickstart.yaml", REPO / "configs/tiny_test.yaml",
                           extra=("--model.mode.num_generations", "3"))
    assert merged["model"]["model_name"] == "tiny-random"  # from the overlay
    assert merged["model"]["temperature"] == 1.0
    assert merged["data"]["prompt_format"] == "chat"  # kept from the base
    assert merged["model"]["num_generations"] == 3  # the command line wins


def test_seed_recipe_matches_the_seed_project(capsys):
    merged = _print_config(capsys, REPO / "configs/grpo_code_execution.yaml")
    model, data, evaluation = merged["model"], merged["data"], merged["eval"]
    assert model["model_name"] == "Qwen/Qwen2.5-1.5B" and model["rewards"] == ["execution"]
    assert model["learning_rate"] == 2e-5 and model["num_generations"] == 2
    assert data["prompts_per_step"] == 8 and merged["trainer"]["max_steps"] == 90
    assert evaluation["every_n_steps"] == 20 and evaluation["num_questions"] == 5
    assert evaluation["temperature"] == 0.2 and evaluation["timeout"] == 10.0


def test_trainer_precision_decides_the_weight_dtype(capsys):
    # model.precision is linked, not a second knob: it does not even appear in the printed config
    merged = _print_config(capsys, REPO / "configs/quickstart.yaml", extra=("--trainer.precision", "bf16-true"))
    assert "precision" not in merged["model"]
    assert cli._weight_precision(None) == "32-true" and cli._weight_precision("bf16-true") == "bf16-true"


def test_no_slurm_environment_in_configs():
    for config in CONFIGS:
        assert "SLURMEnvironment" not in config.read_text(), config


def test_last_checkpoint_is_the_newest_version(tmp_path):
    run = {"root_dir": str(tmp_path), "experiment": "exp"}
    assert run_dir.find_last_checkpoint(run) == (None, None)  # a first (requeueable) run starts fresh
    for version in (0, 2, 10):
        folder = tmp_path / "exp" / f"version_{version}" / "checkpoints"
        folder.mkdir(parents=True)
        (folder / "last.ckpt").write_bytes(b"")
    (tmp_path / "exp" / "version_11").mkdir()  # a newer run that never saved
    path, version = run_dir.find_last_checkpoint(run)
    assert version == 10 and path.endswith("version_10/checkpoints/last.ckpt")


def test_wandb_online_without_a_key_goes_offline(monkeypatch, capsys):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(Path("/nonexistent/netrc")))
    monkeypatch.setattr(loggers, "_has_netrc_login", lambda host: False)
    monkeypatch.setattr(loggers, "_said", set())
    assert loggers.wandb_mode("online") == "offline"
    assert loggers.wandb_mode("online") == "offline"
    assert capsys.readouterr().err.count("logging offline") == 1  # said once
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert loggers.wandb_mode(None) == "disabled"
    with pytest.raises(ValueError, match="not online, offline or disabled"):
        loggers.wandb_mode("sometimes")


def test_unreachable_hub_switches_to_offline_once(monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(cli, "reachable", lambda host, timeout=2.0: False)
    monkeypatch.setattr(loggers, "_said", set())
    cli._go_offline_if_hub_unreachable()
    cli._go_offline_if_hub_unreachable()
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert capsys.readouterr().err.count("running offline") == 1
