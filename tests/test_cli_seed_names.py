"""Keys of the training scripts rlcode replaces get rlcode's key in the "did you mean" (not the
closest spelling: ``model.id`` used to suggest ``model.mode``), or what to do for one with no setting."""

from pathlib import Path

import pytest

from rlcode.cli.command import main
from rlcode.cli.seed_names import SEED_NAMES, markdown_table, seed_hint

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml")]

FLAGS = {  # what the user typed -> what the report must say
    ("--model.id", "Qwen/Qwen2.5-1.5B"): "did you mean --model.model_name?",
    ("--model.cache_dir", "./model_cache"): "set HF_HOME to move the cache",
    ("--eval.eval_interval_steps", "20"): "did you mean --eval.every_n_steps?",
    ("--num-steps", "3"): "did you mean --trainer.max_steps?",
    ("--batch-size", "4"): "did you mean --data.prompts_per_step?",
    ("--eval.timeout_seconds", "3"): "did you mean --eval.timeout?",
    ("--dataset-limit", "10"): "did you mean --data.num_train_tasks?",
    ("--use-openai", "true"): "did you mean --model.rollout_backend openai?",
}


def _report(args) -> str:
    with pytest.raises(SystemExit) as stop:
        main(args)
    return str(stop.value.code)


@pytest.mark.parametrize("typed", FLAGS)
def test_a_key_of_the_old_scripts_on_the_command_line_gets_rlcodes_key(typed, tmp_path):
    report = _report(["fit", *TINY, "--run.root_dir", str(tmp_path), *typed])
    assert FLAGS[typed] in report, report
    assert "model.mode?" not in report and len(report.splitlines()) <= 3, report


@pytest.mark.parametrize("text, expected", [
    ("model:\n  id: Qwen/Qwen2.5-1.5B\n", "did you mean model.model_name?"),
    ("evaluation:\n  eval_interval_steps: 20\n", "did you mean eval.every_n_steps?"),
    ("model:\n  cache_dir: ./model_cache\n", "set HF_HOME"),
])
def test_a_key_of_the_old_scripts_in_a_config_gets_rlcodes_key(text, expected, tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text(text)
    report = _report(["fit", *TINY, "--run.root_dir", str(tmp_path), "--config", str(old)])
    assert expected in report and f"{old}, line 2" in report, report


def test_the_models_name_given_as_the_old_scripts_did_says_model_name(tmp_path):
    report = _report(["fit", *TINY, "--run.root_dir", str(tmp_path), "--model", "Qwen/Qwen2.5-3B-Instruct"])
    assert "--model.model_name Qwen/Qwen2.5-3B-Instruct" in report, report


def test_the_table_and_its_doc_text_agree():
    assert seed_hint("model.id", flag=False) == "did you mean model.model_name? "
    assert seed_hint("training_args.learning_rate", flag=False) == "did you mean model.learning_rate? "
    assert seed_hint("model.learnig_rate", flag=False) == ""  # a misspelling: difflib's job
    table = markdown_table()
    assert len(table.splitlines()) == len(SEED_NAMES) + 2 and "| `model.id` | `model.model_name` |" in table
