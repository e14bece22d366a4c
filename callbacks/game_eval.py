"""Games against a random legal mover before, during and after SPIRAL training.

Each evaluation plays every game of ``data.games`` with the policy in seat 0 and in seat 1
(``data.eval_episodes`` deals each, the same deals every time) and logs ``spiral/<game>/win_rate``,
``draw_rate``, ``loss_rate``, ``invalid_move_rate`` and the per-role RAE baselines
(``spiral/<game>/baseline_role<r>``) at the trainer's step. It does nothing for modes without games.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info


class GameEval(L.Callback):
    def __init__(self, every_n_steps: int = 20, at_start: bool = True, at_end: bool = True) -> None:
        """Evaluate game play against a random legal mover.

        Args:
            every_n_steps: evaluate every N optimizer steps (0: only at start and end).
            at_start: evaluate before the first step (the baseline).
            at_end: evaluate after the last step.
        """
        self.every_n_steps = every_n_steps
        self.at_start = at_start
        self.at_end = at_end
        self.history: list[dict] = []  # {"step", "spiral/<game>/<rate>": value, ...}

    def on_train_start(self, trainer, pl_module) -> None:
        if self.at_start and not any(entry["step"] == trainer.global_step for entry in self.history):
            self.evaluate(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0 and not self._done_at(step):
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        from rlcode.callbacks.mbpp_eval import _interrupted

        if self.at_end and not self._done_at(trainer.global_step) and not _interrupted(trainer):
            self.evaluate(trainer, pl_module)

    def evaluate(self, trainer, pl_module) -> dict[str, float] | None:
        mode = getattr(pl_module, "mode", None)
        if not callable(getattr(mode, "play_against_random", None)) or not hasattr(trainer.datamodule, "eval_batches"):
            return None  # not a game mode
        from rlcode.envs.game_evaluation import outcome_rates, rate_metrics

        episodes = [e for batch in trainer.datamodule.eval_batches()
                    for e in mode.play_against_random(pl_module, batch, seed=trainer.global_step)]
        metrics = rate_metrics(outcome_rates(episodes))
        for key, value in mode.baselines.values.items():
            game, role = key.rsplit("/", 1)
            metrics[f"spiral/{game}/baseline_role{role}"] = value
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
                logger.save()
        self.history.append({"step": trainer.global_step, **metrics})
        for game in trainer.datamodule.games:
            rates = {rate: metrics.get(f"spiral/{game}/{rate}", float("nan"))
                     for rate in ("win_rate", "draw_rate", "loss_rate", "invalid_move_rate")}
            rank_zero_info(f"  Games vs random at step {trainer.global_step} ({game}): "
                           + ", ".join(f"{k.removesuffix('_rate')} {v:.2f}" for k, v in rates.items()))
        return metrics

    def _done_at(self, step: int) -> bool:
        return any(entry["step"] == step for entry in self.history)

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict.get("history", []))
