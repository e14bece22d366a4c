"""Callbacks that observe a run: MBPP eval, game eval (SPIRAL), step metrics, rollout samples, plots,
checkpoints, graceful shutdown and the end-of-run summary. They read what they show from the module's
run history (``module.history``, ``rlcode.training.run_history``) and ``module.run_description()``,
never from each other, so their order does not matter."""

from rlcode.callbacks.checkpointing import StepCheckpoint
from rlcode.callbacks.game_eval import GameEval
from rlcode.callbacks.mbpp_eval import MBPPEval
from rlcode.callbacks.metrics import StepMetrics
from rlcode.callbacks.plots import TrainingPlots
from rlcode.callbacks.progress import StepProgressBar
from rlcode.callbacks.rollout_logging import RolloutLogging
from rlcode.callbacks.shutdown import GracefulShutdown
from rlcode.callbacks.summary import RunSummary

__all__ = ["GameEval", "GracefulShutdown", "MBPPEval", "RolloutLogging", "RunSummary", "StepCheckpoint",
           "StepMetrics", "StepProgressBar", "TrainingPlots"]
