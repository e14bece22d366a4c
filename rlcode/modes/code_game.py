"""The adversarial code game: one policy writes programs and predicts their output.

Each prompt (an MBPP task's text, as a theme) is played as ``num_generations`` games: the policy
writes a program (seat 0), and the policy, or a configured opponent, predicts its output (seat 1)
``predictions_per_program`` (K) times. The rules, the validity guard and the comparison are in
``rlcode.envs.code_game``, what each seat earns in ``rlcode.envs.code_game_rewards``. Advantages are
group-relative per role (``GroupRelativePerRole``): the writer's returns over the G programs of a
prompt, each prediction's own return over the G x K predictions of the prompt's games (an invalid
program leaves the predictor out). Every turn is trained in self-play; with ``opponent: frozen``
(the starting policy) or ``served`` (a model behind an OpenAI-compatible server) predicting, only
the writer learns; with ``opponent: model`` another local model predicts (``opponent_model``, e.g.
the offline ``qwen2.5-coder-0.5b-instruct``), with its own tokenizer and chat template. The
predictor's output budget is its ``max_new_tokens`` (``opponent_max_new_tokens``, else the policy's),
counted in the predictor's tokens: the policy's for self and frozen, the other model's, and for a
served model those of ``opponent_tokenizer`` when named, else bytes (its tokenizer is not known here).
``reward/successful_predictions_count`` counts games most of whose predictions were right.
``rlcode validate`` / ``test``: the greedy MBPP pass rate, as GRPO's.
"""

from __future__ import annotations

from typing import Annotated, Literal

from rlcode.algorithms.advantages import RewardScaling
from rlcode.envs.code_game import CodeGameEnv
from rlcode.envs.code_game_rewards import WRITER_REWARDS, WriterReward
from rlcode.envs.writable_output import check_budget
from rlcode.errors import SettingError
from rlcode.modes.grpo import check_groups, check_mbpp_data
from rlcode.modes.lazy_pool import LazyPool
from rlcode.modes.mbpp_pass_rate import MBPPPassRate
from rlcode.modes.opponents import Opponents, OpponentSampling, play_episodes
from rlcode.rollout.openai.client import OpenAISettings
from rlcode.setting import ANY_NUMBER, COUNT, POSITIVE, TEMPERATURE, check_arguments, fixed, free
from rlcode.training.advantage_estimators import GroupRelativePerRole
from rlcode.training.mode import LearnerView, Mode, ModeDescription
from rlcode.training.run_context import SandboxSettings
from rlcode.training.turn_samples import EpisodeTurns

REWARD_WORDS = {
    "zero_sum": "writer_reward zero_sum: the writer 1 - 2 x (share of its {k} predictions right), each prediction "
                "+1 right / -1 wrong",
    "learnability": "writer_reward learnability: the writer 1 - success share of its {k} predictions when strictly "
                    "between 0 and 1, else 0; each prediction 1 right / 0 wrong"}
EVAL_TIMEOUT = 10.0  # seconds per program in rlcode validate / test (MBPP solutions, not game programs)


class CodeGame(Mode):
    def __init__(self,
                 opponent: Annotated[Literal["self", "frozen", "served", "model"], fixed()] = "self",
                 invalid_program_penalty: Annotated[float, fixed(ANY_NUMBER)] = -1.0,
                 program_timeout: Annotated[float, fixed(POSITIVE)] = 5.0,
                 opponent_server: Annotated[OpenAISettings, fixed()] | None = None,
                 num_generations: Annotated[int, fixed(COUNT)] = 8,
                 scale_rewards: Annotated[RewardScaling, fixed()] = "group",
                 sandbox: Annotated[SandboxSettings, free()] | None = None,
                 writer_reward: Annotated[WriterReward, fixed()] = "zero_sum",
                 predictions_per_program: Annotated[int, fixed(COUNT)] = 1,
                 opponent_model: Annotated[str, fixed()] | None = None,
                 opponent_temperature: Annotated[float, fixed(TEMPERATURE)] | None = None,
                 opponent_max_new_tokens: Annotated[int, fixed(COUNT)] | None = None,
                 opponent_tokenizer: Annotated[str, fixed()] | None = None) -> None:
        """The writer/predictor game, ``num_generations`` games per prompt.

        Args:
            opponent: ``"self"`` (the policy predicts too, both roles trained), ``"frozen"`` (the
                starting policy predicts), ``"served"`` (a model behind an OpenAI-compatible server
                predicts, ``opponent_server``) or ``"model"`` (another local model predicts,
                ``opponent_model``); with a fixed predictor only the writer learns.
            invalid_program_penalty: the writer's return for an invalid program: one whose output is
                not a function of its source alone or that the predictor cannot write within its
                ``max_new_tokens`` (the rule: ``rlcode.envs.code_game``, ``check_program``).
            program_timeout: seconds each of the program's two runs may take.
            opponent_server: the served predictor's server and model (``OpenAISettings``, api chat).
            num_generations: G, games per prompt (the group of each role's baseline).
            scale_rewards: divide advantages by the "group" std, the "batch" std (every rank's
                returns of the role), or "none".
            sandbox: how the sandbox runs the programs (``SandboxSettings``); None: the defaults.
            writer_reward: ``"zero_sum"`` (the writer +1 per wrong prediction, -1 per right one:
                the game as first stated, which pays most for programs nobody can predict) or
                ``"learnability"`` (1 - the predictor's success share when it is strictly between 0
                and 1, else 0: paid for programs at the edge of the predictor's skill; needs K >= 2).
            predictions_per_program: K, how many times the predictor answers each valid program
                (independent samples of the same prompt). More predictions measure a program's
                difficulty better and give the predictor K rows per game, at K times its generation.
            opponent_model: the predictor of ``opponent: model``: any name ``model_name`` takes (an
                alias such as ``qwen2.5-coder-0.5b-instruct``, a hub id, a folder); loaded frozen on
                the policy's device in the policy's dtype.
            opponent_temperature: a served or other model's sampling temperature (None: the policy's;
                0: greedy, which makes its K predictions identical).
            opponent_max_new_tokens: a served or other model's answer length, also the programs'
                output budget (None: the policy's ``max_new_tokens``).
            opponent_tokenizer: ``opponent: served``: the served model's tokenizer (a name as above),
                so the output budget is counted in its tokens; None counts bytes.
        """
        check_arguments(CodeGame, locals(), prefix="model.mode.")  # Python callers; the CLI checked before building
        check_groups(num_generations, scale_rewards)
        if writer_reward not in WRITER_REWARDS:
            raise SettingError(f"writer_reward={writer_reward!r} is not one of {', '.join(WRITER_REWARDS)}")
        if predictions_per_program < 1:
            raise SettingError(f"predictions_per_program={predictions_per_program}: give at least 1")
        if writer_reward == "learnability" and predictions_per_program < 2:
            raise SettingError("writer_reward=learnability never pays with predictions_per_program < 2 (one "
                               "prediction is all right or all wrong): set predictions_per_program to 2 or more")
        self.writer_reward, self.predictions_per_program = writer_reward, predictions_per_program
        self.opponent, self.invalid_program_penalty, self.program_timeout = opponent, invalid_program_penalty, \
            program_timeout
        self.opponent_server, self.num_generations, self.scale_rewards = opponent_server, num_generations, \
            scale_rewards
        self.sandbox = sandbox or SandboxSettings()
        self.estimator = GroupRelativePerRole(num_generations, scale_rewards,
                                              turns_per_seat=(1, predictions_per_program))
        if opponent_temperature is not None and opponent_temperature < 0:
            raise SettingError(f"opponent_temperature={opponent_temperature}: give a temperature >= 0 or null (the policy's)")
        if opponent_max_new_tokens is not None and opponent_max_new_tokens < 1:
            raise SettingError(f"opponent_max_new_tokens={opponent_max_new_tokens}: give a positive number or null "
                               "(the policy's)")
        self.opponent_model, self.opponent_temperature = opponent_model, opponent_temperature
        self.opponent_max_new_tokens, self.opponent_tokenizer = opponent_max_new_tokens, opponent_tokenizer
        self.opponents = Opponents(opponent, opponent_server, opponent_model,
                                   OpponentSampling(opponent_temperature, opponent_max_new_tokens), opponent_tokenizer)
        self.evaluation = MBPPPassRate(EVAL_TIMEOUT)
        self._sandbox = LazyPool(2 * program_timeout + 5)  # each check runs the program twice

    def check_data(self, datamodule) -> None:
        check_mbpp_data(self, datamodule)

    def configure(self, learner: LearnerView) -> None:
        check_budget(self._max_output_tokens(learner))  # at startup: a budget too small for any output
        self.opponents.configure(learner)

    def _max_output_tokens(self, learner: LearnerView) -> int:
        """The predictor's max_new_tokens (its own where set, else the policy's)."""
        return self.opponents.sampling_params(learner).max_new_tokens

    def _predictor_tokenizer(self, learner: LearnerView):
        """The predictor's tokenizer; None (a byte bound) for a served model whose tokenizer is not named."""
        return self.opponents.tokenizer(learner)

    def setup(self, learner: LearnerView, stage: str) -> None:
        if stage == "fit":
            self._sandbox.get(learner)

    def teardown(self) -> None:
        self._sandbox.close()
        self.evaluation.close()

    def collect(self, learner: LearnerView, batch) -> EpisodeTurns:
        pool = self._sandbox.get(learner)
        tokenizer, budget = self._predictor_tokenizer(learner), self._max_output_tokens(learner)
        envs = [CodeGameEnv(pool, theme=text, timeout=self.program_timeout,
                            invalid_program_penalty=self.invalid_program_penalty, tokenizer=tokenizer,
                            max_output_tokens=budget, writer_reward=self.writer_reward,
                            predictions_per_program=self.predictions_per_program)
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
            rewards=[REWARD_WORDS[self.writer_reward].format(k=self.predictions_per_program)],
            group_size=self.num_generations, success_label="predicted",
            success_meaning="games whose program's output most of its predictions got right", opponent=self.opponent)


def game_metrics(episodes) -> dict[str, float]:
    """Valid programs (share of the step's games), correct predictions (share of all predictions),
    learnable programs (share of valid programs some but not all of whose predictions were right; with
    K = 1 always 0), and the writer's mean return over every game."""
    count = max(len(episodes), 1)
    valid = [e for e in episodes if e.turns and e.turns[0].info.get("valid")]
    verdicts = [[bool(t.info.get("correct")) for t in e.turns[1:]] for e in valid]
    predictions = sum(len(v) for v in verdicts)
    learnable = sum(0 < sum(v) < len(v) for v in verdicts)
    return {"code_game/valid_program_rate": len(valid) / count,
            "code_game/correct_prediction_rate": sum(sum(v) for v in verdicts) / max(predictions, 1),
            "code_game/learnable_program_rate": learnable / max(len(valid), 1),
            "code_game/writer_mean_return": sum(e.returns.get(0, 0.0) for e in episodes) / count,
            "code_game/mean_output_chars": sum(len(e.turns[0].info.get("output") or "") for e in valid)
            / max(len(valid), 1)}
