"""Training scalars of each step, from the module's run history, to every logger; one line per step.

The scalars are ``rlcode.training.step_scalars.step_metrics`` of the step's record, which the
module's ``RunHistory`` computes as the step ends, keyed as the original GRPO-on-MBPP scripts'
W&B panels (``reward/avg_batch_reward``, ``reward/successful_predictions_count``, ...). Each step
also prints one line in the ART toolkit's format, every success count named by what it counts
(``Step 3: reward=0.250, ran=75.0% (6/8), passed=12.5% (1/8), time=41.2s``: ``ran`` = programs
that ran without an error, under the execution reward; ``passed`` = programs that passed every MBPP
test, under the MBPP test rewards). The progress bar reads the same history itself.
"""

from __future__ import annotations

import math
import sys

import lightning as L
from lightning.pytorch.utilities import rank_zero_only
from tqdm import tqdm

# Re-exported: the step's scalars are what this callback logs.
from rlcode.training.step_scalars import (Successes, step_line, step_metrics, success_counts,  # noqa: F401
                                          success_labels, successes, trials)


class StepMetrics(L.Callback):
    def __init__(self, print_steps: bool = True) -> None:
        """Log each step's scalars (every mode's) and print its line.

        Args:
            print_steps: print one line per step (reward, what succeeded per reward, time).
        """
        self.print_steps = print_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        history = pl_module.history
        record = history.last_step  # this batch's: the module adds it before any batch-end hook
        if record is None:
            return
        metrics = history.steps[-1].metrics
        # Straight to the loggers, keyed by the step the batch started at: Lightning's own logging
        # would repeat a stale value in steps that do not log it (loss and grad norm of a step
        # without an update). Under DDP these are rank zero's numbers.
        for logger in trainer.loggers:
            logger.log_metrics({k: v for k, v in metrics.items() if not math.isnan(v)}, step=record.step)
        if self.print_steps:
            _write(step_line(record, pl_module.run_description().success_labels, history.steps[-1]))


@rank_zero_only
def _write(line: str) -> None:
    tqdm.write(line)  # cooperates with the progress bar instead of breaking its line
    sys.stdout.flush()  # a redirected log (SLURM, nohup) shows each step as it ends
