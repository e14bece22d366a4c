"""``<run dir>/plots/training.png``: mean reward per step and what the mode's evals measure: MBPP pass
rate per eval, or, for game modes (SPIRAL), per game the win, draw, loss and invalid-move rates against
the random mover and the invalid-move rate in training against the training opponent.

Refreshed after every eval (MBPP or games) and at the end of training, so a long run's picture is never more
than one eval old. Both series come from the module's run history. An eval that runs in the same hook
as a refresh (batch end, train end) may come after it: it is drawn at the next batch end, or at fit
end, whatever the order of the callbacks.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L

from rlcode.envs.game_evaluation import RATES
from rlcode.run_dir import run_directory


def draw(reward_history: list[tuple[int, float]], eval_history: list[dict], path: Path) -> Path:
    """Two panels (reward, pass rate) over optimizer steps, written to ``path``."""
    plt = _pyplot()
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    _reward_panel(top, reward_history)
    if eval_history:
        bottom.plot([e["step"] for e in eval_history], [e["pass_rate"] for e in eval_history], marker="s",
                    label="greedy pass rate")
        bottom.set_ylim(-0.02, 1.02)
        bottom.legend()
    bottom.set_ylabel("MBPP pass rate")
    return _save(plt, figure, bottom, path)


def game_panels(games: list[str], game_evals: list[dict], steps: list, training_opponent: str | None) -> dict:
    """Per game, the series its panel draws: label -> (steps, values). Win, draw, loss and invalid-move
    rates against the random mover at each game eval, and the invalid-move rate of the training
    episodes against the training opponent at each step."""
    panels = {}
    for game in games:
        series = {}
        for rate in RATES:
            key = f"spiral/{game}/{rate}"
            points = [(entry["step"], entry[key]) for entry in game_evals if key in entry]
            if points:
                series[f"{rate.removesuffix('_rate').replace('_', ' ')} vs random"] = tuple(zip(*points))
        key = f"spiral/{game}/train_invalid_move_rate"
        points = [(s.step, s.metrics[key]) for s in steps if key in s.metrics]
        if points:
            series[f"invalid move in training vs {training_opponent or 'its opponent'}"] = tuple(zip(*points))
        panels[game] = series
    return panels


def draw_games(reward_history: list[tuple[int, float]], panels: dict, path: Path) -> Path:
    """The reward panel, then one panel of rates per game (``game_panels``), written to ``path``."""
    plt = _pyplot()
    figure, axes = plt.subplots(1 + len(panels), 1, figsize=(7, 3 + 2.5 * len(panels)), sharex=True, squeeze=False)
    _reward_panel(axes[0][0], reward_history)
    for (game, series), (axis,) in zip(panels.items(), axes[1:]):
        for label, (steps, values) in series.items():
            axis.plot(steps, values, marker="s" if "vs random" in label else None, markersize=3, label=label,
                      linestyle="--" if "training" in label else "-")
        axis.set_ylim(-0.02, 1.02)
        axis.set_ylabel(f"{game} rate")
        if series:
            axis.legend(fontsize="small")
    return _save(plt, figure, axes[-1][0], path)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters
    import matplotlib.pyplot as plt

    return plt


def _reward_panel(top, reward_history: list[tuple[int, float]]) -> None:
    if reward_history:
        steps, rewards = zip(*reward_history)
        top.plot(steps, rewards, marker="o", markersize=3, label="mean reward")
        window = max(1, len(rewards) // 10)
        if window > 1:
            smooth = [sum(rewards[max(0, i - window + 1):i + 1]) / len(rewards[max(0, i - window + 1):i + 1])
                      for i in range(len(rewards))]
            top.plot(steps, smooth, label=f"moving mean ({window})")
        top.legend()
    top.set_ylabel("reward")
    top.grid(alpha=0.3)


def _save(plt, figure, bottom, path: Path) -> Path:
    for axis in figure.axes[1:]:
        axis.grid(alpha=0.3)
    bottom.set_xlabel("optimizer step")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


class TrainingPlots(L.Callback):
    def __init__(self, filename: str = "training.png") -> None:
        """Plot reward and the evals' measures (MBPP pass rate, or game rates) over steps into ``<run dir>/plots/``.

        Args:
            filename: name of the PNG inside ``plots/``.
        """
        self.filename = filename
        self.path: Path | None = None
        self._drawn: tuple[int, int] | None = None  # (steps, evals) in the picture

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if _evals(pl_module.history) != (self._drawn[1] if self._drawn else 0):  # a new eval
            self.refresh(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self.refresh(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module) -> None:
        history = pl_module.history  # the final eval, when it ran after this callback's train end
        if self._drawn != (len(history.steps), _evals(history)):
            self.refresh(trainer, pl_module)

    def refresh(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        history = pl_module.history
        path = run_directory(trainer) / "plots" / self.filename
        games = list(getattr(trainer.datamodule, "games", None) or [])  # a game mode's data names its games
        if games:
            opponent = getattr(getattr(pl_module, "mode", None), "opponent", None)
            self.path = draw_games(history.rewards(), game_panels(games, history.game_evals, history.steps,
                                                                  opponent), path)
        else:
            self.path = draw(history.rewards(), list(history.evals), path)
        self._drawn = (len(history.steps), _evals(history))
        history.plot = str(self.path)


def _evals(history) -> int:
    return len(history.evals) + len(history.game_evals)
