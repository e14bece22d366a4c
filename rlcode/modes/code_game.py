"""The adversarial code game: one policy writes programs and predicts their output.

Each prompt (an MBPP task's text, as a theme) is played as ``num_generations`` games: the policy
writes a program (seat 0), and the policy, or a configured opponent, predicts its output (seat 1). The
rules, the validity guard and the comparison are in ``rlcode.envs.code_game``. Advantages are
group-relative per role (``GroupRelativePerRole``): the writer's returns over the G programs of a
prompt, the predictor's over its G predictions (an invalid program leaves the predictor out). Every
turn is trained in self-play; with ``opponent: frozen`` (the starting policy) or ``served`` (a model
behind an OpenAI-compatible server) predicting, only the writer learns.
``reward/successful_predictions_count`` counts correct predictions in this mode.
``rlcode validate`` / ``test``: the greedy MBPP pass rate, as GRPO's.
"""

from __future__ import annotations

from typing import Literal

from rlcode.algorithms.advantages import RewardScaling
from rlcode.envs.code_game import CodeGameEnv
from rlcode.modes.grpo import check_groups, check_mbpp_data
from rlcode.modes.mbpp_pass_rate import MBPPPassRate
from rlcode.modes.opponents import Opponents, play_episodes
from rlcode.rollout.openai.client import OpenAISettings
from rlcode.training.advantage_estimators import GroupRelativePerRole
from rlcode.training.mode import LearnerView, Mode, ModeDescription
from rlcode.training.run_context import SandboxSettings
from rlcode.training.turn_samples import EpisodeTurns

EVAL_TIMEOUT = 10.0  # seconds per program in rlcode validate / test (MBPP solutions, not game programs)


class CodeGame(Mode):
    def __init__(self, opponent: Literal["self", "frozen", "served"] = "self", invalid_program_penalty: float = -1.0,
                 program_timeout: float = 5.0, opponent_server: OpenAISettings | None = None,
                 num_generations: int = 8, scale_rewards: RewardScaling = "group",
                 sandbox: SandboxSettings | None = None) -> None:
        """The writer/predictor game, ``num_generations`` games per prompt.

        Args:
            opponent: ``"self"`` (the policy predicts too, both roles trained), ``"frozen"`` (the
                starting policy predicts) or ``"served"`` (a model behind an OpenAI-compatible server
                predicts, ``opponent_server``); with a fixed predictor only the writer learns.
            invalid_program_penalty: the writer's return for a program that is not deterministic
                and bounded (see ``rlcode.envs.code_game.check_program``).
            program_timeout: seconds each of the program's two runs may take.
            opponent_server: the served predictor's server and model (``OpenAISettings``, api chat).
            num_generations: G, games per prompt (the group of each role's baseline).
            scale_rewards: divide advantages by the "group" std, the "batch" std (every rank's
                returns of the role), or "none".
            sandbox: how the sandbox runs the programs (``SandboxSettings``); None: the defaults.
        """
        check_groups(num_generations, scale_rewards)
        self.opponent, self.invalid_program_penalty, self.program_timeout = opponent, invalid_program_penalty, \
            program_timeout
        self.opponent_server, self.num_generations, self.scale_rewards = opponent_server, num_generations, \
            scale_rewards
        self.sandbox = sandbox or SandboxSettings()
        self.estimator = GroupRelativePerRole(num_generations, scale_rewards)
        self.opponents = Opponents(opponent, opponent_server)
        self.evaluation = MBPPPassRate(EVAL_TIMEOUT)
        self._sandbox = None

    def check_data(self, datamodule) -> None:
        check_mbpp_data(self, datamodule)

    def configure(self, learner: LearnerView) -> None:
        self.opponents.configure(learner)

    def setup(self, learner: LearnerView, stage: str) -> None:
        if stage == "fit" and self._sandbox is None:
            self._sandbox = learner.sandbox_pool(2 * self.program_timeout + 5)

    def teardown(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
        self.evaluation.close()

    def collect(self, learner: LearnerView, batch) -> EpisodeTurns:
        self.setup(learner, "fit")
        envs = [CodeGameEnv(self._sandbox, theme=text, timeout=self.program_timeout,
                            invalid_program_penalty=self.invalid_program_penalty)
                for text in batch["text"] for _ in range(self.num_generations)]
        seats = (0, 1) if self.opponents.trains_every_seat else (0,)
        episodes, _ = play_episodes(learner, envs, list(range(len(envs))), [seats] * len(envs), self.opponents)
        return EpisodeTurns.from_episodes(episodes, learner.pad_token_id(), learner.device)

    def step_metrics(self, experience: EpisodeTurns) -> dict[str, float]:
        return game_metrics(experience.episodes)

    def validation_step(self, learner, batch, batch_idx):
        return self.evaluation.step(learner, batch, batch_idx, testing=False)

    def test_step(self, learner, batch, batch_idx):
        return self.evaluation.step(learner, batch, batch_idx, testing=True)

    def description(self) -> ModeDescription:
        return ModeDescription(
            rewards=["writer +1 / predictor -1 when the prediction is wrong, the opposite when right"],
            group_size=self.num_generations, success_label="predicted",
            success_meaning="games whose program's output was predicted correctly", opponent=self.opponent)


def game_metrics(episodes) -> dict[str, float]:
    """Valid programs and correct predictions, as shares of the step's games."""
    count = max(len(episodes), 1)
    valid = [e for e in episodes if e.turns and e.turns[0].info.get("valid")]
    correct = sum(bool(e.success) for e in valid)
    return {"code_game/valid_program_rate": len(valid) / count,
            "code_game/correct_prediction_rate": correct / max(len(valid), 1),
            "code_game/mean_output_chars": sum(len(e.turns[0].info.get("output") or "") for e in valid)
            / max(len(valid), 1)}
