"""The adversarial code game: the validity guard against every way to print the unpredictable, the
comparison of predictions, the game's returns, and `rlcode fit` with configs/code_game.yaml."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rlcode.envs.code_game import CodeGameEnv, check_program, extract_prediction, normalise_output

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pool():
    from rlcode.sandbox import SandboxPool

    with SandboxPool(workers=2, timeout=20.0) as built:
        yield built


INVALID = {
    "time": ("import time\nprint(time.time())", "uses time (not a pure-computation module)"),
    "random without a seed": ("import random\nprint(random.random())", "uses random"),
    "process id": ("import os\nprint(os.getpid())", "uses os"),
    "object address": ("print(id(object()))", "calls id"),
    "object address in a repr": ("print(object())", "not deterministic"),
    "hash order of a str set": ("print({'apple', 'banana', 'cherry', 'date', 'elder', 'fig', 'grape', 'kiwi'})",
                                "not deterministic"),
    "uuid": ("import uuid\nprint(uuid.uuid4())", "uses uuid"),
    "os.urandom": ("import os\nprint(os.urandom(8).hex())", "uses os"),
    "the environment": ("import os\nprint(sorted(os.environ))\nprint(os.environ.get('RLCODE_GAME_RUN'))", "uses os"),
    "the local time zone": ("import time\nprint(time.localtime(0).tm_hour)", "uses time"),
    "input()": ("print(input())", "calls input"),
    "reads stdin without input()": ("print(len(open(0).read()))", "calls open"),
    "prints nothing": ("x = 2 + 2", "printed nothing"),
    "prints too much": ("print('x' * 10000)", "output too long for the predictor: more than 4096 bytes"),
    "never stops": ("while True:\n    pass", "did not finish in time"),
    "exits non-zero": ("print(1)\nraise SystemExit(3)", "failed"),
}


@pytest.mark.parametrize("name", list(INVALID))
def test_the_guard_refuses_what_cannot_be_predicted(pool, name):
    code, reason = INVALID[name]
    check = check_program(code, timeout=1.5, pool=pool)
    assert not check.valid and check.output is None and reason in check.reason, (name, check)


@pytest.mark.parametrize("code, output", [
    ("print(sum(i * i for i in range(5)))", "30"),
    ("import math\nprint(math.factorial(10), math.isqrt(99))", "3628800 9"),
    ("print(sorted({'b', 'a', 'c'}))\nprint('trailing   ')", "['a', 'b', 'c']\ntrailing"),
    ("d = {'x': 1, 'y': 2}\nfor k in d:\n    print(k, d[k])", "x 1\ny 2"),
])
def test_deterministic_programs_are_valid(pool, code, output):
    check = check_program(code, timeout=2.0, pool=pool)
    assert check.valid and check.reason == "", check
    if output is not None:
        assert check.output == output


def test_check_program_without_a_pool():
    """The documented entry point works on its own (it starts and closes a one-worker pool)."""
    check = check_program("print(6 * 7)")
    assert (check.valid, check.output) == (True, "42")


def test_predictions_compare_after_stripping_trailing_whitespace():
    assert normalise_output("3 \n4\t\n\n") == "3\n4"
    assert extract_prediction("The output is:\n```\n3   \n4\n```\nbecause ...") == "3\n4"
    assert extract_prediction("```python\nprint(3)\n```\nprints\n```\n3\n```") == "3"  # the last block
    assert extract_prediction("3") == "3" and extract_prediction("3.0") != "3"


def test_returns_of_the_game(pool):
    program = "```python\nprint(2 ** 10)\n```"
    game = CodeGameEnv(pool, theme="powers", timeout=2.0)
    game.reset(0)
    turn = game.step(program)
    assert turn.next_turn.player == 1 and "print(2 ** 10)" in turn.next_turn.messages[0]["content"]
    right = game.step("```\n1024\n```")
    assert right.returns == {0: -1.0, 1: 1.0} and right.info["correct"]

    game.reset(0)
    game.step(program)
    assert game.step("1000").returns == {0: 1.0, 1: -1.0}

    game.reset(0)
    invalid = game.step("```python\nimport time\nprint(time.time())\n```")
    assert invalid.done and invalid.returns == {0: -1.0}, "the predictor does not play an invalid program"


def test_fit_counts_successful_predictions(tmp_path):
    from rlcode.cli.command import main

    main(["fit", "--config", str(REPO / "configs/code_game.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
          "--run.root_dir", str(tmp_path), "--eval.at_start", "false", "--eval.at_end", "false"])
    run = next(tmp_path.glob("tiny/version_*"))
    with (run / "metrics.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("reward/avg_batch_reward")]
    assert len(rows) == 2
    # the random model writes no valid program: no prediction is ever made, so none is correct
    assert all(float(r["code_game/valid_program_rate"]) == 0.0 for r in rows)
    assert all(float(r["reward/successful_predictions_count"]) == 0.0 for r in rows)
    assert (run / "rollouts.jsonl").is_file() and (run / "checkpoints/last.ckpt").is_file()


def test_successful_predictions_count_counts_correct_predictions():
    """In episode modes `reward/successful_predictions_count` counts episodes that succeeded (here:
    correct predictions) among all episodes; an episode that cannot say (success None) counts as one without."""
    from rlcode.modes import CodeGame
    from grpo_harness import learner
    from rlcode.training.step_record import StepRecord
    from rlcode.callbacks.metrics import step_line, step_metrics, success_labels

    record = StepRecord(step=0, group_size=1, task_ids=["a", "b", "c"], prompts=["p"] * 3, completions=["c"] * 3,
                        rewards=[1.0, -1.0, -1.0], rewards_by_function={"return": [1.0, -1.0, -1.0]},
                        details=["", "", ""], advantages=[0.0] * 3, completion_lengths=[1] * 3,
                        truncated=[False] * 3, frac_reward_zero_std=0.0, updated=True,
                        episodes=[{"success": True}, {"success": False}, {"success": None}])
    assert step_metrics(record)["reward/successful_predictions_count"] == 1.0
    assert "predicted=33.3% (1/3)" in step_line(record, success_labels(learner(CodeGame, model_name="tiny-random")))


def test_a_served_model_can_be_the_predictor():
    """opponent: served puts a model behind an OpenAI-compatible server in the predictor's seat (the
    end-to-end run against a real server is tests/test_openai_served.py's SPIRAL case; same opponent)."""
    from rlcode.modes import CodeGame
    from grpo_harness import learner
    from rlcode.envs.opponents import ServedOpponent

    module = learner(CodeGame, model_name="tiny-random", opponent="served",
                      opponent_server={"base_url": "http://127.0.0.1:9/v1", "model": "predictor", "api": "chat"})
    opponent = module.mode.opponents.actor(module)
    assert isinstance(opponent, ServedOpponent) and opponent.backend.client.base_url.startswith("http://127.0.0.1:9")
