"""SPIRAL: one policy plays both seats of two-player zero-sum text games against itself (arXiv
2506.24119) and learns from every turn it played, with Role-conditioned Advantage Estimation.

The training step is GRPO's (``rlcode.algorithms.grpo``): only the stages that define a mode differ.
``collect`` plays a batch of episodes with the episode runner (generation batched across episodes),
each learner turn becomes a training row (``EpisodeTurns``); its reward is its player's return, its
advantage the return minus that (game, role)'s moving-average baseline (``RoleBaselines``). Loss,
micro-batching, DDP sync, checkpoints and callbacks are shared.

Simplifications against SPIRAL, stated: no reasoning-length penalty or intermediate-reward shaping;
the whole turn gets the episode's advantage (SPIRAL puts it on the last token and its loss sums it
back over the turn's tokens, which for a constant advantage is the same surrogate).
"""

from __future__ import annotations

from typing import Literal

import torch

from rlcode.training.frozen_policy import frozen_copy, frozen_generator
from rlcode.algorithms.grpo import GRPO
from rlcode.algorithms.role_baselines import RoleBaselines
from rlcode.envs.moves import MoveFormat
from rlcode.rollout.openai.client import OpenAISettings

Opponent = Literal["self", "random", "frozen", "served"]


class SPIRAL(GRPO):
    def __init__(self, opponent: Opponent = "self", trained_seat: int | None = None, move_format: MoveFormat = "boxed",
                 max_turns: int = 50, invalid_move_penalty: float = -1.5, invalid_move_bonus: float = 0.5,
                 rae_decay: float = 0.95, drop_zero_advantage_turns: bool = False, eval_temperature: float = 0.0,
                 opponent_server: OpenAISettings | None = None, **grpo_settings) -> None:
        """Self-play on TextArena games (the games come from ``data.games``).

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
            drop_zero_advantage_turns: skip the backward pass of turns whose advantage is exactly 0
                (a pure speed-up: their gradient is 0; the loss normalisers still count them).
            eval_temperature: sampling temperature of the games against a random mover (0: greedy).
            opponent_server: the served opponent's server and model (``OpenAISettings``, api chat;
                None: defaults and ``RLCODE_OPENAI_*``); it samples with the policy's temperature,
                max_new_tokens and stop strings.
            grpo_settings: the shared settings (model, sampling, loss, optimizer): see ``GRPO``.
        """
        super().__init__(**grpo_settings)
        if trained_seat not in (None, 0, 1):
            raise ValueError(f"trained_seat={trained_seat}: two-player games have seats 0 and 1 (None: alternate)")
        self.baselines = RoleBaselines(rae_decay)
        self._opponent_policy = None  # a frozen copy, kept off the module tree (not saved)
        self._opponent_actor = None

    # ---- building ----------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        super().configure_model()
        if self.hparams.opponent == "frozen":  # kept off the module tree: not saved, not optimized
            object.__setattr__(self, "_opponent_policy", frozen_copy(self.policy))

    def _build_rewards(self):
        return None  # games score themselves: no sandbox

    def make_game(self, game: str):
        from rlcode.envs.textarena_game import TextArenaGame

        hp = self.hparams
        return TextArenaGame(game, move_format=hp.move_format, max_turns=hp.max_turns,
                             invalid_move_penalty=hp.invalid_move_penalty, invalid_move_bonus=hp.invalid_move_bonus)

    # ---- the stages of a step --------------------------------------------------------------------
    def collect(self, batch):
        from rlcode.envs.runner import EpisodeRunner
        from rlcode.training.turn_samples import EpisodeTurns

        hp = self.hparams
        runner = EpisodeRunner(self.render, self.turn_generator(hp.temperature), opponent=self._opponent())
        episodes = runner.play([self.make_game(g) for g in batch["game"]], batch["seed"],
                               [self._learner_seats(i) for i in range(len(batch["game"]))],
                               sampling_seed=self._sampling_seed())
        pad = getattr(self.tokenizer, "pad_token_id", None) or 0  # a served dry run has no tokenizer
        return EpisodeTurns.from_episodes(episodes, pad, self.device,
                                          extra_metrics=self._game_metrics(episodes, runner.backend_calls))

    def flat_rows(self, experience, rewards):
        return torch.zeros_like(rewards, dtype=torch.bool)  # no groups: every turn may carry signal

    def advantages(self, experience, rewards, totals):
        """RAE: each trained (episode, role) gets return - baseline, folded in over every rank in order."""
        games = self._game_ids()
        local = [(games[episode.game], seat, episode.returns.get(seat, 0.0))
                 for episode in experience.episodes for seat in episode.learner_seats]
        ordered, mine = self._over_ranks(local)
        values = self.baselines.advantages((list(games)[g], seat, value) for g, seat, value in ordered)
        per_role = dict(zip([(e, seat) for e, episode in enumerate(experience.episodes)
                             for seat in episode.learner_seats], values[mine]))
        turns = [(e, experience.episodes[e].turns[t].player) for e, t in experience.rows]
        return torch.tensor([per_role[key] for key in turns], dtype=torch.float32, device=rewards.device)

    def _skips_zero_advantage(self) -> bool:
        return self.hparams.drop_zero_advantage_turns

    # ---- rlcode validate / test: games against a random legal mover ------------------------------
    def validation_step(self, batch, batch_idx: int) -> None:
        self._log_game_rates(batch, "spiral")

    def test_step(self, batch, batch_idx: int) -> None:
        self._log_game_rates(batch, "spiral_test")

    def _log_game_rates(self, batch, prefix: str) -> None:
        from rlcode.envs.game_evaluation import outcome_rates, play_against_random

        rates = outcome_rates(play_against_random(self, batch, seed=self.global_step))
        for game, per_game in rates.items():
            for rate, value in per_game.items():
                self.log(f"{prefix}/{game}/{rate}", value, batch_size=len(batch["game"]))

    # ---- checkpoints: the baselines resume exactly -----------------------------------------------
    def on_save_checkpoint(self, checkpoint) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["role_baselines"] = self.baselines.state_dict()

    def on_load_checkpoint(self, checkpoint) -> None:
        super().on_load_checkpoint(checkpoint)
        if "role_baselines" in checkpoint:
            self.baselines.load_state_dict(checkpoint["role_baselines"])

    # ---- helpers -----------------------------------------------------------------------------------
    def _learner_seats(self, episode: int) -> tuple[int, ...]:
        hp = self.hparams
        if hp.opponent == "self":
            return (0, 1)
        return (hp.trained_seat,) if hp.trained_seat is not None else (episode % 2,)

    def _opponent(self):
        """The player of the seats the policy does not hold (None in self-play), built once."""
        from rlcode.envs.opponents import PolicyOpponent, RandomLegalMover

        if self._opponent_actor is None and self.hparams.opponent == "served":
            from rlcode.envs.opponents import ServedOpponent

            self._opponent_actor = ServedOpponent(self.hparams.opponent_server, self.sampling_params(None))
        if self._opponent_actor is None and self.hparams.opponent != "self":
            self._opponent_actor = (RandomLegalMover() if self.hparams.opponent == "random"
                                    else PolicyOpponent(self.render, frozen_generator(self, self._opponent_policy)))
        return self._opponent_actor

    def _game_ids(self) -> dict[str, int]:
        datamodule = getattr(self.trainer, "datamodule", None)
        return {game: index for index, game in enumerate(getattr(datamodule, "games", None) or [])}

    def _over_ranks(self, local: list[tuple[int, int, float]]):
        """Every rank's (game, seat, return) in rank order, and the slice that is this rank's."""
        if self.trainer.world_size == 1:
            return local, slice(0, len(local))
        # n (episodes x learner seats) is the same on every rank, so the shapes agree
        gathered = self.all_gather(torch.tensor(local, dtype=torch.float64, device=self.device).reshape(-1, 3))
        ordered = [(int(g), int(s), float(r)) for rank in gathered.cpu().tolist() for g, s, r in rank]
        start = self.global_rank * len(local)
        return ordered, slice(start, start + len(local))

    def _game_metrics(self, episodes, backend_calls: int) -> dict[str, float]:
        metrics = {"spiral/backend_calls": float(backend_calls), "spiral/episodes": float(len(episodes))}
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
