"""SPIRAL: one policy plays both seats of two-player zero-sum text games against itself (arXiv
2506.24119) and learns from every turn it played, with Role-conditioned Advantage Estimation.

``collect`` plays a batch of episodes with the episode runner (generation batched across episodes);
each learner turn becomes a training row (``EpisodeTurns``) whose reward is its player's return and
whose advantage is the return minus that (game, role)'s moving-average baseline
(``RoleBaselineAdvantages``). ``rlcode validate`` / ``test`` play against a random legal mover.

Simplifications against SPIRAL, stated: no reasoning-length penalty or intermediate-reward shaping;
the whole turn gets the episode's advantage (SPIRAL puts it on the last token and its loss sums it
back over the turn's tokens, which for a constant advantage is the same surrogate).
"""

from __future__ import annotations

from typing import Annotated

from rlcode.envs.game_evaluation import outcome_rates, play_against_random
from rlcode.envs.moves import MoveFormat
from rlcode.envs.textarena_game import TextArenaGame
from rlcode.errors import SettingError
from rlcode.modes.opponents import OpponentKind, Opponents, play_episodes
from rlcode.rollout.openai.client import OpenAISettings
from rlcode.setting import ANY_NUMBER, COUNT, PROBABILITY, Range, TEMPERATURE, check_arguments, fixed
from rlcode.training.advantage_estimators import RoleBaselineAdvantages
from rlcode.training.mode import LearnerView, Mode, ModeDescription
from rlcode.training.turn_samples import EpisodeTurns


class SPIRAL(Mode):
    def __init__(self,
                 opponent: Annotated[OpponentKind, fixed()] = "self",
                 trained_seat: Annotated[int, fixed(Range(0, 1, integer=True))] | None = None,
                 move_format: Annotated[MoveFormat, fixed()] = "boxed",
                 max_turns: Annotated[int, fixed(COUNT)] = 50,
                 invalid_move_penalty: Annotated[float, fixed(ANY_NUMBER)] = -1.5,
                 invalid_move_bonus: Annotated[float, fixed(ANY_NUMBER)] = 0.5,
                 rae_decay: Annotated[float, fixed(PROBABILITY)] = 0.95,
                 eval_temperature: Annotated[float, fixed(TEMPERATURE)] = 0.0,
                 opponent_server: Annotated[OpenAISettings, fixed()] | None = None) -> None:
        """Self-play on TextArena games (the games come from ``data.games``: GameDataModule).

        Args:
            opponent: ``"self"`` (the policy holds both seats, both trained), ``"random"`` (a random
                legal mover), ``"frozen"`` (a frozen copy of the starting policy) or ``"served"`` (a
                model behind an OpenAI-compatible server, ``opponent_server``) in the other seat.
            trained_seat: with a fixed opponent, the policy's seat (None: seats alternate by episode).
            move_format: ``"boxed"`` (SPIRAL: the last ``\\boxed{}`` holds the move) or ``"bracket"``
                (lenient: the first legal ``[move]`` in the reply; for small models).
            max_turns: turns after which a game is a draw.
            invalid_move_penalty: return of a player whose move is invalid (the game ends there).
            invalid_move_bonus: return of the other player then.
            rae_decay: decay of each (game, role) baseline's moving average (SPIRAL: 0.95).
            eval_temperature: sampling temperature of the games against a random mover (0: greedy).
            opponent_server: the served opponent's server and model (``OpenAISettings``, api chat;
                None: defaults and ``RLCODE_OPENAI_*``).
        """
        check_arguments(SPIRAL, locals(), prefix="model.mode.")  # Python callers; the CLI checked before building
        if trained_seat not in (None, 0, 1):
            raise ValueError(f"trained_seat={trained_seat}: two-player games have seats 0 and 1 (None: alternate)")
        self.opponent, self.trained_seat, self.move_format = opponent, trained_seat, move_format
        self.max_turns, self.invalid_move_penalty, self.invalid_move_bonus = max_turns, invalid_move_penalty, \
            invalid_move_bonus
        self.rae_decay, self.eval_temperature, self.opponent_server = rae_decay, eval_temperature, opponent_server
        self.estimator = RoleBaselineAdvantages(rae_decay)
        self.opponents = Opponents(opponent, opponent_server)
        self._backend_calls = 0

    @property
    def baselines(self):
        """The per-(game, role) RAE baselines (``RoleBaselines``), logged by the game eval."""
        return self.estimator.baselines

    def check_data(self, datamodule) -> None:
        if not hasattr(datamodule, "games"):
            raise SettingError("SPIRAL plays games: use data.class_path rlcode.data.games.GameDataModule "
                               f"(got {type(datamodule).__name__})")

    def configure(self, learner: LearnerView) -> None:
        self.opponents.configure(learner)

    def setup(self, learner: LearnerView, stage: str) -> None:
        self.estimator.games = list(getattr(learner.datamodule(), "games", None) or [])

    def make_game(self, game: str) -> TextArenaGame:
        return TextArenaGame(game, move_format=self.move_format, max_turns=self.max_turns,
                             invalid_move_penalty=self.invalid_move_penalty, invalid_move_bonus=self.invalid_move_bonus)

    # ---- one step ---------------------------------------------------------------------------------
    def collect(self, learner: LearnerView, batch) -> EpisodeTurns:
        games = [self.make_game(g) for g in batch["game"]]
        seats = [self._learner_seats(i) for i in range(len(batch["game"]))]
        episodes, self._backend_calls = play_episodes(learner, games, batch["seed"], seats, self.opponents)
        return EpisodeTurns.from_episodes(episodes, learner.pad_token_id(), learner.device)

    def _learner_seats(self, episode: int) -> tuple[int, ...]:
        if self.opponents.trains_every_seat:
            return (0, 1)
        return (self.trained_seat,) if self.trained_seat is not None else (episode % 2,)

    def step_metrics(self, experience: EpisodeTurns) -> dict[str, float]:
        episodes = experience.episodes
        metrics = {"spiral/backend_calls": float(self._backend_calls), "spiral/episodes": float(len(episodes))}
        for game in sorted({e.game for e in episodes}):
            played = [e for e in episodes if e.game == game]
            learner_turns = [t for e in played for t in e.turns if t.learner]
            metrics[f"spiral/{game}/train_invalid_move_rate"] = (
                sum(t.info.get("valid") is False for t in learner_turns) / max(len(learner_turns), 1))
            metrics[f"spiral/{game}/mean_turns"] = sum(len(e.turns) for e in played) / len(played)
            metrics[f"spiral/{game}/draw_rate_train"] = sum(all(v == 0 for v in e.returns.values())
                                                            for e in played) / len(played)
        for key, value in self.baselines.values.items():
            metrics[f"spiral/{key.rsplit('/', 1)[0]}/baseline_role{key.rsplit('/', 1)[1]}"] = value
        return metrics

    # ---- rlcode validate / test: games against a random legal mover --------------------------------
    def play_against_random(self, learner: LearnerView, batch, seed: int):
        """``batch``'s games (game, seed, seat per episode) against random legal moves, at ``eval_temperature``."""
        return play_against_random([self.make_game(g) for g in batch["game"]], learner.render,
                                   learner.turn_generator(self.eval_temperature, precision="same"), batch, seed=seed)

    def validation_step(self, learner, batch, batch_idx):
        self._log_game_rates(learner, batch, "spiral")

    def test_step(self, learner, batch, batch_idx):
        self._log_game_rates(learner, batch, "spiral_test")

    def _log_game_rates(self, learner, batch, prefix: str) -> None:
        rates = outcome_rates(self.play_against_random(learner, batch, seed=learner.global_step))
        for game, per_game in rates.items():
            for rate, value in per_game.items():
                learner.log(f"{prefix}/{game}/{rate}", value, batch_size=len(batch["game"]))

    def description(self) -> ModeDescription:
        return ModeDescription(rewards=["each player's game return"], group_size=None, opponent=self.opponent)
