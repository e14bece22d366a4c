"""The code game with K predictions per program: each prediction's own return, the writer's return over
all K, advantages over the prompt's G x K predictions, the step's metrics, and `rlcode fit` with
``writer_reward: learnability`` and K = 2."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from rlcode.envs.code_game import CodeGameEnv
from rlcode.errors import SettingError
from rlcode.modes import CodeGame
from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.rollout.base import SamplingParams
from rlcode.stopping import StopToken
from rlcode.training.all_ranks_totals import Ranks, sum_over_ranks

REPO = Path(__file__).resolve().parents[1]
PROGRAM = "```python\nprint(6 * 7)\n```"


@pytest.fixture(scope="module")
def pool():
    from rlcode.sandbox import SandboxPool

    with SandboxPool(workers=2, timeout=20.0) as built:
        yield built


@pytest.mark.parametrize("kind, writer, predictions", [
    ("zero_sum", 0.0, [1.0, -1.0]),  # one of two right: 1 - 2 x 1/2
    ("learnability", 0.5, [1.0, 0.0]),  # 0 < 1/2 < 1: paid 1 - 1/2
])
def test_k_predictions_of_one_program(pool, kind, writer, predictions):
    game = CodeGameEnv(pool, theme="products", timeout=2.0, writer_reward=kind, predictions_per_program=2)
    game.reset(0)
    first = game.step(PROGRAM)
    assert first.next_turn.player == 1
    right = game.step("```\n42\n```")
    assert not right.done and right.next_turn.messages == first.next_turn.messages, "the same prompt, afresh"
    assert right.info["correct"] and right.info["return"] == predictions[0]
    wrong = game.step("```\n41\n```")
    assert wrong.done and not wrong.info["correct"] and wrong.info["return"] == predictions[1]
    assert wrong.returns == {0: writer, 1: sum(predictions) / 2}


def test_learnability_does_not_pay_for_all_right_or_invalid(pool):
    game = CodeGameEnv(pool, theme="products", timeout=2.0, writer_reward="learnability", predictions_per_program=2)
    game.reset(0)
    game.step(PROGRAM)
    game.step("42")
    assert game.step("42").returns == {0: 0.0, 1: 1.0}
    game.reset(0)
    invalid = game.step("```python\nimport os\nprint(os.getcwd())\n```")
    assert invalid.returns == {0: -1.0}
    assert invalid.info["success"] is False  # a game, unsuccessful: a step of only these still counts games


def test_learnability_needs_two_predictions():
    with pytest.raises(SettingError, match="predictions_per_program to 2 or more"):
        CodeGame(writer_reward="learnability", predictions_per_program=1)
    with pytest.raises(SettingError, match="writer_reward"):
        CodeGame(writer_reward="surprise")


class ScriptedLearner:
    """Stands in for the Learner in ``CodeGame.collect``: the writer's turns print the number of their
    game; predictor turns answer from ``answers`` in order (one batched call per round)."""

    device, tokenizer, global_step = torch.device("cpu"), None, 0

    def __init__(self, pool, writers: list[str], answers: list[str], max_new_tokens: int = 64) -> None:
        self.pool, self.writers, self.answers = pool, list(writers), list(answers)
        self.max_new_tokens, self.policy = max_new_tokens, None
        self.stop_token = StopToken()  # the Learner's: a local-model opponent ends its rows on it

    def render(self, messages):
        return messages[-1]["content"]

    def turn_generator(self, temperature=None):
        def generate(prompts, seed):
            texts = [(self.answers if "predictor" in p else self.writers).pop(0) for p in prompts]
            return batch_from_token_lists([[1, 2]] * len(texts), [[3, 4, 5]] * len(texts), [True] * len(texts),
                                          texts, pad_token_id=0)
        return generate

    def sampling_params(self, seed, temperature=None, max_new_tokens=None):
        return SamplingParams(temperature=1.0 if temperature is None else temperature,
                              max_new_tokens=max_new_tokens or self.max_new_tokens)

    def sampling_seed(self):
        return 0

    def sandbox_pool(self, timeout, workers=None):
        return self.pool

    def pad_token_id(self):
        return 0


def test_advantages_group_the_prompts_predictions(pool):
    """G = 2 games of one prompt, K = 2: game 0's program is predicted right then wrong, game 1's right
    twice. The writer's group is its 2 returns (0.5, 0), the predictions' group all 4 own returns."""
    mode = CodeGame(writer_reward="learnability", predictions_per_program=2, num_generations=2, program_timeout=2.0)
    learner = ScriptedLearner(pool, ["```python\nprint(1)\n```", "```python\nprint(2)\n```"], ["1", "2", "0", "2"])  # by round
    mode.configure(learner)
    experience = mode.collect(learner, {"text": ["numbers"]})
    rewards = experience.rewards("cpu")
    players = [experience.episodes[e].turns[t].player for e, t in experience.rows]
    assert players == [0, 1, 1, 0, 1, 1]
    assert rewards.tolist() == [0.5, 1.0, 0.0, 0.0, 1.0, 1.0]
    totals = sum_over_ranks(Ranks(), rewards, torch.ones(len(rewards), 2), torch.tensor(0.0))
    advantages = mode.estimator.advantages(Ranks(), experience, rewards, totals)
    # float64 reference of group_advantages' "group" scaling: (x - mean) / (Bessel std + 1e-4)
    writer = torch.tensor([0.5, 0.0], dtype=torch.float64)
    predictions = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    expected_w = (writer - writer.mean()) / (writer.std() + 1e-4)
    expected_p = (predictions - predictions.mean()) / (predictions.std() + 1e-4)
    expected = torch.stack([expected_w[0], expected_p[0], expected_p[1], expected_w[1], expected_p[2], expected_p[3]])
    # float32 arithmetic on values below 2 in magnitude: within a few float32 ulps (2**-23 each)
    torch.testing.assert_close(advantages.double(), expected, rtol=0, atol=4 * 2**-23 * 2)
    assert mode.step_metrics(experience) == pytest.approx({
        "code_game/valid_program_rate": 1.0, "code_game/correct_prediction_rate": 0.75,
        "code_game/learnable_program_rate": 0.5, "code_game/writer_mean_return": 0.25,
        "code_game/mean_output_chars": 1.0})


@pytest.mark.parametrize("opponent, tokenizer", [("self", "the policy's"), ("frozen", "the policy's"),
                                                ("served", None)])
def test_the_predictors_tokenizer_and_budget_reach_the_rule(pool, monkeypatch, opponent, tokenizer):
    """The policy's tokenizer when the policy or its frozen copy predicts, none (a byte bound) for a
    served model; the budget is the policy's max_new_tokens, which a served predictor samples with too."""
    import rlcode.modes.code_game as mode_module

    class Played(Exception):
        pass

    def play(learner, envs, *args):
        raise Played(envs)

    monkeypatch.setattr(mode_module, "play_episodes", play)
    server = {"base_url": "http://127.0.0.1:9/v1", "model": "predictor", "api": "chat"}
    mode = CodeGame(opponent=opponent, opponent_server=server if opponent == "served" else None, num_generations=2)
    learner = ScriptedLearner(pool, [], [], max_new_tokens=48)
    learner.tokenizer = object()  # stands for the policy's tokenizer: only its identity is checked
    with pytest.raises(Played) as played:
        mode.collect(learner, {"text": ["numbers"]})
    envs = played.value.args[0]
    assert len(envs) == 2 and all(env.max_output_tokens == 48 for env in envs)
    assert all(env.tokenizer is (learner.tokenizer if tokenizer else None) for env in envs)


def test_a_budget_without_room_for_an_output_stops_the_run_at_startup(pool):
    with pytest.raises(ValueError, match="leaves no room for an output"):
        CodeGame().configure(ScriptedLearner(pool, [], [], max_new_tokens=1))


def test_fit_with_learnability_and_two_predictions(tmp_path):
    from rlcode.cli.command import main

    main(["fit", "--config", str(REPO / "configs/code_game.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
          "--model.mode.init_args.writer_reward", "learnability",
          "--model.mode.init_args.predictions_per_program", "2",
          "--run.root_dir", str(tmp_path), "--eval.at_start", "false", "--eval.at_end", "false"])
    run = next(tmp_path.glob("tiny/version_*"))
    with (run / "metrics.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("reward/avg_batch_reward")]
    assert len(rows) == 2
    # the random model writes no valid program: every game is the invalid-program penalty
    assert all(float(r["code_game/writer_mean_return"]) == -1.0 for r in rows)
    assert all(float(r["code_game/learnable_program_rate"]) == 0.0 for r in rows)
    assert (run / "checkpoints/last.ckpt").is_file()
