"""Callbacks that observe a run: MBPP eval, game eval (SPIRAL), step metrics, rollout samples, plots,
checkpoints, graceful shutdown and the end-of-run summary. They read the module's ``last_step`` record."""

from callbacks.checkpointing import StepCheckpoint
from callbacks.game_eval import GameEval
from callbacks.mbpp_eval import MBPPEval
from callbacks.metrics import GRPOMetrics
from callbacks.plots import TrainingPlots
from callbacks.progress import StepProgressBar
from callbacks.rollout_logging import RolloutLogging
from callbacks.shutdown import GracefulShutdown
from callbacks.summary import RunSummary

__all__ = ["GameEval", "GRPOMetrics", "GracefulShutdown", "MBPPEval", "RolloutLogging", "RunSummary", "StepCheckpoint",
           "StepProgressBar", "TrainingPlots"]
