"""Callbacks that observe a run: MBPP eval, game eval (SPIRAL), step metrics, rollout samples, plots,
checkpoints, graceful shutdown and the end-of-run summary. They read the module's ``last_step`` record."""

from rlcode.callbacks.checkpointing import StepCheckpoint
from rlcode.callbacks.game_eval import GameEval
from rlcode.callbacks.mbpp_eval import MBPPEval
from rlcode.callbacks.metrics import GRPOMetrics
from rlcode.callbacks.plots import TrainingPlots
from rlcode.callbacks.progress import StepProgressBar
from rlcode.callbacks.rollout_logging import RolloutLogging
from rlcode.callbacks.shutdown import GracefulShutdown
from rlcode.callbacks.summary import RunSummary

__all__ = ["GameEval", "GRPOMetrics", "GracefulShutdown", "MBPPEval", "RolloutLogging", "RunSummary", "StepCheckpoint",
           "StepProgressBar", "TrainingPlots"]
