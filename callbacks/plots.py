"""``<run dir>/plots/training.png``: mean reward per step and MBPP pass rate per eval.

Refreshed after every MBPP eval and at the end of training, so a long run's picture is never more
than one eval old. Both series come from the module's run history. An eval that runs in the same hook
as a refresh (batch end, train end) may come after it: it is drawn at the next batch end, or at fit
end, whatever the order of the callbacks.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L

from rlcode.run_dir import run_directory


def draw(reward_history: list[tuple[int, float]], eval_history: list[dict], path: Path) -> Path:
    """Two panels (reward, pass rate) over optimizer steps, written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
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
    if eval_history:
        bottom.plot([e["step"] for e in eval_history], [e["pass_rate"] for e in eval_history], marker="s",
                    label="greedy pass rate")
        bottom.set_ylim(-0.02, 1.02)
        bottom.legend()
    bottom.set_ylabel("MBPP pass rate")
    bottom.set_xlabel("optimizer step")
    bottom.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


class TrainingPlots(L.Callback):
    def __init__(self, filename: str = "training.png") -> None:
        """Plot reward and MBPP pass rate over steps into ``<run dir>/plots/``.

        Args:
            filename: name of the PNG inside ``plots/``.
        """
        self.filename = filename
        self.path: Path | None = None
        self._drawn: tuple[int, int] | None = None  # (steps, evals) in the picture

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if len(pl_module.history.evals) != (self._drawn[1] if self._drawn else 0):  # a new eval
            self.refresh(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self.refresh(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module) -> None:
        history = pl_module.history  # the final eval, when it ran after this callback's train end
        if self._drawn != (len(history.steps), len(history.evals)):
            self.refresh(trainer, pl_module)

    def refresh(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        history = pl_module.history
        self.path = draw(history.rewards(), list(history.evals), run_directory(trainer) / "plots" / self.filename)
        self._drawn = (len(history.steps), len(history.evals))
        history.plot = str(self.path)
