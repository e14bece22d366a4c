"""Every numeric setting a user can get wrong is refused before anything is built: one line naming
the key, the value and the allowed range, a non-zero exit, and no run directory left behind."""

from pathlib import Path

import pytest

from rlcode.cli.command import main
from rlcode.setting import Range, ranges_of
from rlcode.training.learner import Learner

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml")]

BAD = {  # arguments -> what the line must name
    "--model.learning_rate=-1e-5": "model.learning_rate=-1e-05 is out of range: use a number > 0",
    "--trainer.max_steps=-3": "trainer.max_steps=-3 is out of range: use an integer >= 1, or -1 (no limit)",
    "--model.temperature=-1": "model.temperature=-1.0 is out of range: use a number > 0",
    "--model.max_new_tokens=0": "model.max_new_tokens=0 is out of range: use an integer >= 1",
    "--model.top_p=1.5": "model.top_p=1.5 is out of range: use a number in (0, 1]",
    "--model.micro_batch_size=0": "model.micro_batch_size=0 is out of range",
    "--model.mode.num_generations=0": "model.mode.num_generations=0 is out of range: use an integer >= 1",
    "--model.mode.reward_timeout=0": "model.mode.reward_timeout=0.0 is out of range: use a number > 0",
    "--data.prompts_per_step=0": "data.prompts_per_step=0 is out of range",
    "--eval.num_questions=0": "eval.num_questions=0 is out of range",
    "--eval.k=[1,0]": "eval.k=0 is out of range",
    "--checkpoint.keep=-2": "checkpoint.keep=-2 is out of range: use an integer >= 1, or -1 (all)",
}


def _refusal(args, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code not in (0, None)
    return str(stop.value.code)


@pytest.mark.parametrize("flag", BAD)
def test_a_bad_value_is_one_line_and_leaves_no_run_directory(flag, tmp_path, capsys):
    message = _refusal(["fit", *TINY, "--run.root_dir", str(tmp_path / "runs"), flag], capsys)
    assert message.startswith("rlcode: ") and len(message.splitlines()) == 1, message
    assert BAD[flag] in message and "(on the command line)" in message, message
    assert not (tmp_path / "runs").exists()


def test_a_bad_value_in_a_config_names_its_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  mode:\n    init_args:\n      max_attempts: 0\n")
    args = ["fit", "--config", str(REPO / "configs/multistep_mbpp.yaml"), *TINY[2:], "--config", str(bad),
            "--run.root_dir", str(tmp_path / "runs")]
    message = _refusal(args, capsys)
    assert f"model.mode.max_attempts=0 is out of range: use an integer >= 1 ({bad}, line 4)" in message
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flag, named", [
    ("--model.mode.opponent_max_new_tokens=0", "model.mode.opponent_max_new_tokens=0 is out of range: use an integer >= 1"),
    ("--model.mode.opponent_temperature=-1", "model.mode.opponent_temperature=-1.0 is out of range: use a number >= 0"),
])
def test_the_code_game_predictors_sampling_is_checked_before_anything_is_built(flag, named, tmp_path, capsys):
    args = ["fit", "--config", str(REPO / "configs/code_game.yaml"), *TINY[2:], "--run.root_dir", str(tmp_path / "runs"),
            "--model.mode.opponent", "model", "--model.mode.opponent_model", "tiny-random", flag]
    message = _refusal(args, capsys)
    assert named in message and len(message.splitlines()) == 1, message
    assert not (tmp_path / "runs").exists()


def test_a_negative_number_without_equals_sign_says_to_write_it_with_one(tmp_path, capsys):
    message = _refusal(["fit", *TINY, "--run.root_dir", str(tmp_path), "--model.learning_rate", "-1e-5"], capsys)
    assert "'-1e-5' starts with '-'" in message and "--model.learning_rate=-1e-5" in message, message


def test_the_ranges_say_what_they_allow():
    ranges = ranges_of(Learner, "model")
    assert ranges["model.epsilon_low"].describe() == "a number in [0, 1)"
    assert Range(1, integer=True, also=(-1,)).allows(-1) and not Range(1).allows(0.5)
    assert not ranges["model.learning_rate"].allows(float("nan"))
