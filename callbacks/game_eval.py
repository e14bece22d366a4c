"""Games against a random legal mover before, during and after SPIRAL training.

Each evaluation plays every game of ``data.games`` with the policy in seat 0 and in seat 1
(``data.eval_episodes`` deals each, the same deals every time) and logs ``spiral/<game>/win_rate``,
``draw_rate``, ``loss_rate``, ``invalid_move_rate`` and the per-role RAE baselines
(``spiral/<game>/baseline_role<r>``) at the trainer's step, and writes ``<run dir>/eval/games_step_<n>.json``:
per game and opponent those rates and the episode count, then every episode with its turns. It does
nothing for modes without games.

A stop signal is acted on between games (``rlcode.stopping``: ``StopPoint.GAME``): the eval is abandoned
unrecorded, the run saves and stops, and a resumed run plays the eval due at its step first.
"""

from __future__ import annotations

import json
from typing import Annotated

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from rlcode.callbacks.checkpointing import save_and_stop
from rlcode.envs.game_evaluation import eval_report, outcome_rates, rate_metrics
from rlcode.run_dir import run_directory
from rlcode.setting import COUNT_OR_ZERO, free
from rlcode.stopping import StopPoint


class GameEval(L.Callback):
    def __init__(self, every_n_steps: Annotated[int, free(COUNT_OR_ZERO)] = 20, at_start: Annotated[bool, free()] = True,
                 at_end: Annotated[bool, free()] = True) -> None:
        """Evaluate game play against a random legal mover.

        Args:
            every_n_steps: evaluate every N optimizer steps (0: only at start and end).
            at_start: evaluate before the first step (the baseline): at the run's first start only, not
                when a resume or a requeue starts it again at a later step.
            at_end: evaluate after the last step.
        """
        self.every_n_steps = every_n_steps
        self.at_start = at_start
        self.at_end = at_end

    def on_train_start(self, trainer, pl_module) -> None:
        # A run stopped before (or during) the eval due at its step plays it first on resume
        step = trainer.global_step
        if ((self.at_start and step == 0) or self._due(step)) and not pl_module.history.evaluated_at(step, games=True):
            self.evaluate(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, history = trainer.global_step, pl_module.history
        if self._due(step) and not history.evaluated_at(step, games=True):
            self.evaluate(trainer, pl_module)

    def _due(self, step: int) -> bool:
        return bool(self.every_n_steps) and step > 0 and step % self.every_n_steps == 0

    def on_train_end(self, trainer, pl_module) -> None:
        history = pl_module.history  # stopped by a signal (set at a batch end, an earlier hook): no final eval
        if self.at_end and not history.evaluated_at(trainer.global_step, games=True) and history.stopped_by is None:
            self.evaluate(trainer, pl_module)

    def evaluate(self, trainer, pl_module) -> dict[str, float] | None:
        mode = getattr(pl_module, "mode", None)
        if not callable(getattr(mode, "play_against_random", None)) or not hasattr(trainer.datamodule, "eval_batches"):
            return None  # not a game mode

        episodes = self._play(trainer, pl_module, mode)
        if episodes is None:  # a stop: the save comes first, this eval runs again on resume
            save_and_stop(trainer, pl_module)
            return None
        metrics = rate_metrics(outcome_rates(episodes))
        for key, value in mode.baselines.values.items():
            game, role = key.rsplit("/", 1)
            metrics[f"spiral/{game}/baseline_role{role}"] = value
        if trainer.is_global_zero:
            self._write_report(trainer, episodes)
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
                logger.save()
        pl_module.history.add_game_eval({"step": trainer.global_step, **metrics})
        for game in trainer.datamodule.games:
            rates = {rate: metrics.get(f"spiral/{game}/{rate}", float("nan"))
                     for rate in ("win_rate", "draw_rate", "loss_rate", "invalid_move_rate")}
            rank_zero_info(f"  Games vs random at step {trainer.global_step} ({game}): "
                           + ", ".join(f"{k.removesuffix('_rate')} {v:.2f}" for k, v in rates.items()))
        return metrics

    @staticmethod
    def _play(trainer, pl_module, mode) -> list | None:
        """Every game's episodes, or None when the ranks agreed to stop before one of the games (asked
        before each: a stop waits for one game's batch of episodes at most)."""
        episodes: list = []
        for number, batch in enumerate(trainer.datamodule.eval_batches()):
            if pl_module.stop_token.agreed(pl_module.ranks(), StopPoint.GAME):
                if number:
                    rank_zero_info(f"  Games vs random at step {trainer.global_step} abandoned after {number} "
                                   "game(s); they run again on resume")
                return None
            episodes.extend(mode.play_against_random(pl_module, batch, seed=trainer.global_step))
        return episodes

    @staticmethod
    def _write_report(trainer, episodes) -> None:
        """``eval/games_step_<n>.json``: what the metrics summarize, episode by episode."""
        path = run_directory(trainer) / "eval" / f"games_step_{trainer.global_step}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(eval_report(trainer.global_step, episodes), indent=2, default=str))
