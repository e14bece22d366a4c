"""`rlcode validate` scores as many problems as the eval callback would and writes the per-problem
results; a command that fails before its run starts leaves no empty run directory behind."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from rlcode.callbacks.mbpp_eval import NUM_QUESTIONS_ENV
from rlcode.cli.command import main
from rlcode.run_dir import unstarted
from rlcode.run_dir.checkpoint_file import _JOINED_FROM, checkpoint_run_directory

REPO = Path(__file__).resolve().parents[1]
BASE = ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"), "--config", str(REPO / "configs/tiny_grpo.yaml"),
        "--data.eval_batch_size", "2"]


def validate(root: Path, *extra: str) -> dict:
    main(["validate", *BASE, "--run.root_dir", str(root), *extra])
    (report,) = root.glob("tiny/version_*/eval/validate_step_0.json")
    return json.loads(report.read_text())


def test_validate_takes_its_size_from_the_eval_settings_and_writes_every_problem(tmp_path, monkeypatch, capsys):
    """It scored the whole split (90 problems) whatever ``eval.num_questions`` or
    ``MBPP_EVAL_NUM_QUESTIONS`` said, and wrote no per-problem file."""
    monkeypatch.delenv(NUM_QUESTIONS_ENV, raising=False)
    report = validate(tmp_path / "config", "--eval.num_questions", "3")
    assert report["num_questions"] == 3 and report["split"] == "validation" and report["step"] == 0
    assert [p["task_id"] for p in report["problems"]] == [511, 512, 513]  # the first 3 of the split
    assert {"task_id", "passed", "verdict", "completion"} <= set(report["problems"][0])
    assert "  MBPP validate: 3/3 problems" in capsys.readouterr().out

    monkeypatch.setenv(NUM_QUESTIONS_ENV, "1")  # overrides the config, as it does for the callback
    assert validate(tmp_path / "environment", "--eval.num_questions", "3")["num_questions"] == 1

    monkeypatch.delenv(NUM_QUESTIONS_ENV)
    assert validate(tmp_path / "data", "--data.num_eval_tasks", "2")["num_questions"] == 2  # said for validate


def test_a_checkpoints_verdicts_name_its_step_and_lie_beside_its_run(tmp_path, monkeypatch):
    """validate and test of a step-2 checkpoint write ``<its run>/eval/{validate,test}_step_2.json`` saying
    step 2, whatever run.root_dir the command has; Lightning's warning about the checkpoint's callback
    states (written under other checkpoint settings here) is not shown."""
    monkeypatch.setenv(NUM_QUESTIONS_ENV, "1")
    main(["fit", *BASE, "--run.root_dir", str(tmp_path / "trained"), "--eval.at_start", "false",
          "--eval.at_end", "false", "--trainer.max_steps", "2"])
    (run,) = (tmp_path / "trained/tiny").glob("version_*")
    checkpoint = run / "checkpoints" / "last.ckpt"
    for command in ("validate", "test"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            main([command, *BASE, "--run.root_dir", str(tmp_path / "elsewhere"), "--ckpt_path", str(checkpoint),
                  "--checkpoint.every_n_train_steps", "5"])
        assert not [w for w in caught if "callbacks used to create the checkpoint" in str(w.message)]
        report = json.loads((run / "eval" / f"{command}_step_2.json").read_text())
        assert report["step"] == 2 and report["ckpt_path"] == str(checkpoint) and len(report["problems"]) == 1
    assert not list((tmp_path / "elsewhere").rglob("eval/*.json"))
    # nothing else: a stray version_N (config.yaml, metrics.csv, run.json) was left per call
    assert not (tmp_path / "elsewhere").exists() and len(list((tmp_path / "trained/tiny").iterdir())) == 1


def test_a_joined_sharded_checkpoint_reports_for_its_folders_run(tmp_path, monkeypatch):
    folder = tmp_path / "runs/x/version_3/checkpoints/last.ckpt"  # FSDP: a folder of shards
    joined = tmp_path / "tmp/last.ckpt.joined"
    monkeypatch.setitem(_JOINED_FROM, joined.resolve(), folder)
    assert checkpoint_run_directory(joined) == checkpoint_run_directory(folder) == tmp_path / "runs/x/version_3"
    assert checkpoint_run_directory(tmp_path / "model.ckpt") is None  # outside a run: the command's own


def test_a_command_that_fails_before_it_starts_leaves_no_run_directory(tmp_path):
    with pytest.raises((FileNotFoundError, SystemExit)):
        main(["fit", *BASE, "--run.root_dir", str(tmp_path), "--ckpt_path", str(tmp_path / "missing.ckpt")])
    assert not list(tmp_path.glob("tiny/version_*")), "an empty version_0 was left behind"


def test_only_directories_without_run_output_count_as_unstarted(tmp_path):
    (tmp_path / "wandb/offline-run-x").mkdir(parents=True)
    (tmp_path / "checkpoints").mkdir()
    for name in ("run.json", "config.yaml", "hparams.yaml", "wandb/offline-run-x/run.wandb"):
        (tmp_path / name).write_text("")
    assert unstarted(tmp_path)
    (tmp_path / "checkpoints/last.ckpt").write_text("")
    assert not unstarted(tmp_path)


def test_validate_and_test_score_a_checkpoint_exactly_as_the_fit_eval_did(tmp_path, monkeypatch):
    """One checkpoint, one set of eval settings: the fit's end-of-run eval, ``rlcode validate`` and
    ``rlcode test`` write the same completions, verdicts and generation settings. ``eval.max_new_tokens``
    (8) differs from ``model.max_new_tokens`` (16) so that taking the model's limit would show; the
    environment sizes all three alike (``rlcode test`` otherwise scores the whole split)."""
    monkeypatch.setenv(NUM_QUESTIONS_ENV, "2")
    settings = ["--data.eval_split", "test", "--eval.max_new_tokens", "8", "--eval.timeout", "4"]
    main(["fit", *BASE, *settings, "--run.root_dir", str(tmp_path / "trained"), "--eval.at_start", "false"])
    (run,) = (tmp_path / "trained/tiny").glob("version_*")
    fitted = json.loads((run / "eval" / "step_2.json").read_text())
    assert fitted["generation"]["max_new_tokens"] == 8 and fitted["generation"]["timeout"] == 4.0
    for command in ("validate", "test"):
        main([command, *BASE, *settings, "--run.root_dir", str(tmp_path / command),
              "--ckpt_path", str(run / "checkpoints" / "last.ckpt")])
        scored = json.loads((run / "eval" / f"{command}_step_2.json").read_text())
        assert scored["generation"] == fitted["generation"]
        assert scored["problems"] == fitted["problems"]
