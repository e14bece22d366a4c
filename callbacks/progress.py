"""The progress bar of a step-based RL run: ``steps 3/90 [...] reward=0.41, ran=0.75, passed=0.125, tok/s=830``.

Lightning's bar counts batches per epoch, and an endless prompt stream has one epoch of unknown
length, so a max_steps run read "Epoch 0" with a batch count and no total. Here the bar is the run's
optimizer steps out of ``max_steps`` (a resumed run starts at its step), followed by the step's mean
reward, per reward the share of completions it counts as a success (``ran``: the program ran without
an error, execution reward; ``passed``: every MBPP test passed, MBPP test rewards) and tokens/s, and
after an MBPP eval its greedy pass rate (``eval_pass_rate``), all read from the module's run history
(the step's scalars are there before any batch-end hook; an eval of this batch shows at the next).

Only in a terminal: written to a file or a pipe, a bar is its redraws joined by ``\r`` with padding,
and each step already prints a plain line of its own (``callbacks/metrics.py``), so there the bars
(this one and Lightning's validate/test bars) stay off.
"""

from __future__ import annotations

import sys

from lightning.pytorch.callbacks import TQDMProgressBar

from rlcode.run_dir.quiet_output import interactive
from rlcode.training.step_scalars import named


class StepProgressBar(TQDMProgressBar):
    def __init__(self, refresh_rate: int = 1) -> None:
        """Steps done / max_steps, reward, share of successes per reward, tokens/s, eval pass rate.

        Args:
            refresh_rate: redraw every N steps (a step takes seconds to minutes: every one).
        """
        super().__init__(refresh_rate=refresh_rate)
        if not interactive(sys.stdout):  # the bars write to stdout
            self.disable()

    def on_train_epoch_start(self, trainer, *_) -> None:
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None)
        bar.initial = 0
        bar.n = trainer.global_step  # a resumed run continues where it stopped
        bar.set_description("steps")
        bar.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bar = self.train_progress_bar
        if bar is not None and not bar.disable and trainer.global_step % self.refresh_rate == 0:
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # also redraws

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the run directory's version: noise next to the step's numbers
        return {**metrics, **history_metrics(pl_module)} if trainer.training else metrics


def history_metrics(pl_module) -> dict[str, float]:
    """The last step's reward, share of successes per reward and tokens/s; the last eval's pass rate."""
    history = pl_module.history
    shown: dict[str, float] = {}
    if history.steps:
        last = history.steps[-1]
        shown["reward"] = last.mean_reward
        labels = pl_module.run_description().success_labels
        shown.update((c.label, c.count / max(c.total, 1)) for c in named(last.successes, labels))
        shown["tok/s"] = last.metrics["perf/tokens_per_s"]
    if history.evals and history.evals[-1].get("pass_rate") is not None:
        shown["eval_pass_rate"] = history.evals[-1]["pass_rate"]  # the last eval's, not this step's
    return shown
