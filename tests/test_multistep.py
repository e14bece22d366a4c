"""Multi-step MBPP with execution feedback: feedback per failure kind, attempts, discounting, hidden
tests, masks (feedback is context, never trained), metrics, and `rlcode fit` on the tiny model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from rlcode.envs.mbpp_feedback import MBPPFeedbackEnv

REPO = Path(__file__).resolve().parents[1]
TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"]
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"


@pytest.fixture(scope="module")
def pool():
    from rlcode.sandbox import SandboxPool

    with SandboxPool(workers=1, timeout=2.0) as built:
        yield built


def env(pool, **settings):
    return MBPPFeedbackEnv(pool, task_id=1, text="Write a function to add two numbers.", tests=TESTS,
                           entry_point="add", timeout=1.0, **settings)


@pytest.mark.parametrize("answer, expected", [
    ("```python\ndef add(a, b):\n    return a - b\n```",
     "This test failed: `assert add(1, 2) == 3` (got -1, expected 3)."),
    ("```python\ndef add(a, b):\n    return a / 0\n```", "ZeroDivisionError"),
    ("```python\ndef add(a, b)\n    return a + b\n```", "SyntaxError"),
    ("```python\ndef add(a, b):\n    while True:\n        pass\n```", "did not finish within 1 seconds"),
])
def test_feedback_names_what_went_wrong(pool, answer, expected):
    game = env(pool)
    game.reset(0)
    result = game.step(answer)
    assert not result.done
    feedback = result.next_turn.messages[-1]["content"]
    assert expected in feedback and "```python" in feedback
    assert result.next_turn.messages[-2] == {"role": "assistant", "content": answer}  # the history it saw


def test_attempts_end_on_success_or_at_the_limit_with_discount(pool):
    wrong = "```python\ndef add(a, b):\n    return 0\n```"
    game = env(pool, max_attempts=3, attempt_discount=0.5)
    game.reset(0)
    assert not game.step(wrong).done and not game.step(wrong).done
    last = game.step(RIGHT)
    assert last.done and last.returns == {0: 0.25} and last.info["attempt"] == 3 and last.info["success"]

    game = env(pool, max_attempts=2, reward="fraction")
    game.reset(0)
    game.step(wrong)
    last = game.step(wrong)  # add(0, 0) == 0 and add(-1, 1) == 0 pass: 2 of 3
    assert last.done and last.returns[0] == pytest.approx(2 / 3) and not last.info["success"]

    game = env(pool)
    game.reset(0)
    first = game.step(RIGHT)
    assert first.done and first.returns == {0: 1.0} and first.info["attempt"] == 1


def test_held_out_test_decides_the_return_but_is_never_shown(pool):
    """Passing the shown tests ends the episode, but the return needs the hidden one too; the prompt
    and the feedback never show it."""
    special = "```python\ndef add(a, b):\n    return a + b if a >= 0 else 5\n```"
    game = env(pool, hidden_tests="held_out")
    first = game.reset(0)
    assert TESTS[-1] not in first.messages[0]["content"] and TESTS[0] in first.messages[0]["content"]
    result = game.step(special)
    assert result.done and result.returns == {0: 0.0} and not result.info["success"]


def test_feedback_is_context_and_answers_are_the_trained_tokens(pool):
    from rlcode.modes.multistep import attempt_metrics
    from rlcode.modes import SPIRAL
    from grpo_harness import learner
    from rlcode.envs.runner import EpisodeRunner
    from rlcode.training.turn_samples import EpisodeTurns

    module = learner(SPIRAL, model_name="tiny-random", max_new_tokens=6)  # any module with a tiny policy
    module.configure_model()
    generate = lambda prompts, seed: module.generate(prompts, 1, temperature=1.0, seed=seed)  # noqa: E731
    runner = EpisodeRunner(module.render, generate)
    episodes = runner.play([env(pool), env(pool)], [0, 1], [(0,), (0,)])
    assert runner.backend_calls == 3 and all(len(e.turns) == 3 for e in episodes)  # random text never passes
    samples = EpisodeTurns.from_episodes(episodes, module.tokenizer.pad_token_id, "cpu")
    batch = samples.rollout
    for row, (e, t) in enumerate(samples.rows):
        turn = episodes[e].turns[t]
        context = module.tokenizer.decode(batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist())
        trained = module.tokenizer.decode(batch.completion_ids[row][batch.completion_mask[row].bool()].tolist())
        assert context == module.render(turn.messages)
        if t > 0:
            feedback = episodes[e].turns[t - 1].info["feedback"]
            assert feedback in context and feedback not in trained
    metrics = attempt_metrics(episodes, 3)
    assert metrics["multistep/success_at_3"] == 0.0 and metrics["multistep/mean_attempts"] == 3.0


def test_attempt_metrics_by_hand():
    from types import SimpleNamespace

    from rlcode.modes.multistep import attempt_metrics

    def episode(attempts, success, first_passed):
        turns = [SimpleNamespace(info={"passed_shown": first_passed})] + [SimpleNamespace(info={})] * (attempts - 1)
        return SimpleNamespace(turns=turns, success=success)

    metrics = attempt_metrics([episode(1, True, True), episode(2, True, False), episode(3, False, False),
                               episode(3, True, False)], 3)
    assert metrics["multistep/success_at_1"] == 0.25 and metrics["multistep/success_at_2"] == 0.5
    assert metrics["multistep/success_at_3"] == 0.75 and metrics["multistep/mean_attempts"] == 2.25
    assert metrics["multistep/fixed_rate"] == pytest.approx(2 / 3)


def test_fit_leaves_a_run_directory_with_conversations(tmp_path, capsys):
    from rlcode.cli.command import main

    main(["fit", "--config", str(REPO / "configs/multistep_mbpp.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
          "--run.root_dir", str(tmp_path), "--eval.at_start", "false"])
    run = next(tmp_path.glob("tiny/version_*"))
    for name in ("metrics.csv", "rollouts.jsonl", "plots/training.png", "checkpoints/last.ckpt"):
        assert (run / name).is_file(), name
    with (run / "metrics.csv").open() as handle:
        columns = set(next(csv.DictReader(handle)))
    assert {"multistep/success_at_1", "multistep/success_at_3", "multistep/mean_attempts",
            "multistep/fixed_rate"} <= columns
    conversation = json.loads((run / "rollouts.jsonl").read_text().splitlines()[0])
    assert len(conversation["turns"]) == 3 and conversation["turns"][1]["observation"].startswith("Running your code")
    out = capsys.readouterr().out
    assert "Step 0: reward=" in out and "solved=" in out
    assert ("Training complete!\n  Total trajectories: 16\n  Episodes solved (every test passed) within the attempts: "
            "0 (0.0%)\n  Steps completed: 2") in out


def test_fit_with_challenge_hidden_tests_on_the_train_split_refuses_in_one_line(tmp_path):
    """No train task has challenge tests: the run stops at setup with one line, before any step."""
    from rlcode.cli.command import main

    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(REPO / "configs/multistep_mbpp.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
              "--run.root_dir", str(tmp_path), "--model.mode.hidden_tests", "challenge", "--eval.at_start", "false"])
    message = str(stop.value.code)
    assert message.startswith("rlcode: model.mode.init_args.hidden_tests: challenge, but 374 of the 374 train tasks "
                              "have no challenge_test_list asserts") and "use hidden_tests: held_out" in message
    assert "\n" not in message


def test_the_curriculum_hears_each_problems_share_of_solved_episodes(tmp_path):
    """Multi-step feeds the curriculum its episodes' successes per problem (2 problems x 4 episodes)."""
    from rlcode.cli.command import main
    from rlcode.data.datamodule import MBPPDataModule

    fed = []
    original = MBPPDataModule.record_outcomes

    def record_outcomes(self, draw, task_ids, shares):
        fed.append((draw, list(task_ids), list(shares)))
        return original(self, draw, task_ids, shares)

    MBPPDataModule.record_outcomes = record_outcomes
    try:
        main(["fit", "--config", str(REPO / "configs/multistep_mbpp.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
              "--run.root_dir", str(tmp_path), "--eval.at_start", "false", "--eval.at_end", "false"])
    finally:
        MBPPDataModule.record_outcomes = original
    assert [draw for draw, _, _ in fed] == [0, 1] and all(len(ids) == 2 for _, ids, _ in fed)
    assert all(share == 0.0 for _, _, shares in fed for share in shares), "the random model solves nothing"
    with (next(tmp_path.glob("tiny/version_*")) / "metrics.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("curriculum/unseen")]
    assert [float(r["curriculum/unseen"]) for r in rows] == [374.0, 372.0], "pools of each step's draw"
    assert [float(r["curriculum/too_hard"]) for r in rows] == [0.0, 2.0]


SECOND_CALL_DIES = {
    "exit": "raise SystemExit(1)",
    "os._exit": "import os; os._exit(3)",
    "memory": "x = bytearray(1 << 40)",  # a MemoryError inside a probe ends only that probe
    "kill": "import os, signal; os.kill(os.getppid(), 0); os.abort()",
}


@pytest.mark.parametrize("death", list(SECOND_CALL_DIES))
def test_feedback_never_describes_a_hidden_test_when_the_process_dies_in_it(pool, death):
    """A function that prints its arguments and dies on its second call: the first (shown) test fails,
    the second call is the hidden test's. The feedback describes the shown failure, never the hidden
    test's input, whatever ended the process."""
    answer = ("```python\nimport sys\ncalls = []\ndef add(a, b):\n    calls.append(1)\n"
              "    print('seen input:', a, b, file=sys.stderr)\n    print('seen input:', a, b)\n"
              f"    if len(calls) == 2:\n        {SECOND_CALL_DIES[death]}\n    return a - b\n```")
    game = MBPPFeedbackEnv(pool, task_id=1, text="Add two numbers.", entry_point="add", timeout=1.0,
                           tests=["assert add(1, 2) == 3", "assert add(40, 2) == 42"], hidden_tests="held_out",
                           max_attempts=2)
    first = game.reset(0)
    assert "40" not in first.messages[0]["content"]
    result = game.step(answer)
    feedback = result.next_turn.messages[-1]["content"]
    assert "40" not in feedback
    assert feedback.startswith("This test failed: `assert add(1, 2) == 3` (got -1, expected 3)")
    assert not result.info["success"] and "40" not in result.info["verdict"]
    last = game.step(answer)
    assert last.done and last.returns == {0: 0.0} and "40" not in last.info["verdict"]


def test_challenge_hidden_tests_refuse_a_task_without_them(pool):
    """MBPP's challenge_test_list is empty on every train and validation task (and on 489 of the 500
    test tasks): hidden_tests: challenge refuses such a task in one line instead of running without
    hidden tests."""
    from rlcode.envs.mbpp_feedback import require_challenge_tests

    with pytest.raises(ValueError, match="MBPP task 1 has no challenge_test_list asserts .*use hidden_tests: held_out"):
        env(pool, hidden_tests="challenge")
    with pytest.raises(ValueError, match="hidden_tests='hiden': choose one of none, challenge, held_out"):
        env(pool, hidden_tests="hiden")
    rows = [{"challenge_test_list": []}, {"challenge_test_list": ["assert add(2, 2) == 4"]}]
    with pytest.raises(ValueError, match="1 of the 2 train tasks have no challenge_test_list"):
        require_challenge_tests(rows, "train")
    require_challenge_tests(rows[1:], "test")

    game = env(pool, hidden_tests="challenge", challenge_tests=["assert add(10, -3) == 7"])
    game.reset(0)
    cheat = "```python\ndef add(a, b):\n    return {(1, 2): 3, (0, 0): 0, (-1, 1): 0}[(a, b)]\n```"
    result = game.step(cheat)  # passes every shown test, fails the challenge test
    assert result.done and result.returns == {0: 0.0} and result.info["passed_shown"] and not result.info["success"]
    assert "KeyError" in result.info["hidden_verdict"]


def test_mbpp_has_challenge_tests_only_on_the_test_split():
    """The facts the refusal states, read from the data."""
    from rlcode.data.mbpp import load_mbpp

    from rlcode.envs.mbpp_feedback import require_challenge_tests

    tasks = {split: load_mbpp(split=split) for split in ("train", "validation", "test")}
    assert {split: sum(bool(t.challenge_test_list) for t in rows) for split, rows in tasks.items()} == \
        {"train": 0, "validation": 0, "test": 11}
    with pytest.raises(ValueError, match="374 of the 374 train tasks have no challenge_test_list"):
        require_challenge_tests(tasks["train"], "train")
    require_challenge_tests([t for t in tasks["test"] if t.challenge_test_list], "test")
