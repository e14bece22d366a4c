"""Ctrl-C, SIGTERM or SIGUSR1: finish the current step, save ``last.ckpt``, stop cleanly (exit status 0).

A step on CPU can take a minute; killing it halfway loses it and leaves no checkpoint. The handler
only sets a flag; the checkpoint is written between steps, where the state is consistent. A second
signal falls back to the default behaviour (an immediate KeyboardInterrupt / termination). Under
DDP a signal to any one rank stops every rank after the same step.

SIGUSR1 is SLURM's warning before the time limit (``sbatch --signal=SIGUSR1@90``): after the save,
rank zero requeues the job (``rlcode.callbacks.slurm_requeue``), which resumes from that checkpoint. The
handlers replace Lightning's for the training loop, so its auto-requeue never runs mid-step.
"""

from __future__ import annotations

import os
import signal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from rlcode.callbacks.checkpointing import StepCheckpoint
from rlcode.callbacks.slurm_requeue import flush_loggers, requeue_job


class GracefulShutdown(L.Callback):
    def __init__(self) -> None:
        """Save a checkpoint and stop after the running step when SIGINT, SIGTERM or SIGUSR1 arrives;
        after SIGUSR1 also requeue the SLURM job."""
        self.requested: str | None = None
        self.saved: str | None = None  # the checkpoint written on the way out
        self.requeue = False  # SIGUSR1 reached some rank: rank zero requeues after the save
        self._previous: dict[int, object] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            try:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread (e.g. inside a notebook worker): leave signals alone
                return

    def _on_signal(self, signum, frame) -> None:
        self.requested = signal.Signals(signum).name
        self.requeue = self.requeue or signum == signal.SIGUSR1
        then = ", then requeueing the job" if self.requeue else ""
        if signum == signal.SIGUSR1:
            # SLURM's warning: its SIGTERM at the limit (or a repeated warning) must not turn into an
            # immediate stop that skips the save and the requeue, so the handlers stay.
            rank_zero_info(f"\n{self.requested} received: finishing this step, then saving a checkpoint{then}")
            return
        rank_zero_info(f"\n{self.requested} received: finishing this step, then saving a checkpoint{then} "
                       "(send it again to stop at once)")
        # A second signal acts immediately. Not through the handler found at start: under Lightning
        # that is its own SIGTERM handler, which only logs, so a second SIGTERM did not stop the run.
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Under DDP a signal may reach some ranks only, but saving a checkpoint is collective: a
        # rank saving alone would wait forever. So the ranks agree, any request stopping them all
        # (one tiny all-reduce per step; on one device the decision is returned as it is).
        if not trainer.strategy.reduce_boolean_decision(self.requested is not None, all=False):
            return
        self.requeue = trainer.strategy.reduce_boolean_decision(self.requeue, all=False)  # SIGUSR1 anywhere
        self.requested = self.requested or "a signal to another rank"
        self.saved = self._save(trainer)
        pl_module.history.stop(self.requested, self.saved)  # the evals skip their final one; the summary says so
        if self.saved:
            rank_zero_info(f"saved {self.saved} at step {trainer.global_step}; resume with --ckpt_path last")
        else:
            rank_zero_info(f"stopping at step {trainer.global_step}: a dry run changed no weights, nothing to save")
        trainer.should_stop = True

    @staticmethod
    def _save(trainer) -> str | None:
        """The newest state as ``last.ckpt`` (None in a dry run). Through the run's StepCheckpoint,
        the one writer of its ``last.ckpt``: a second writer made it version its own copy."""
        callback = trainer.checkpoint_callback
        if isinstance(callback, StepCheckpoint):
            return callback.save_now(trainer)
        if trainer.lightning_module.run_description().dry_run:
            return None
        folder = callback.dirpath if callback is not None and callback.dirpath else f"{trainer.log_dir}/checkpoints"
        path = f"{folder}/last.ckpt"
        if os.path.islink(path):
            os.unlink(path)  # a link to step-N.ckpt: writing through it would relabel that checkpoint
        trainer.save_checkpoint(path)
        return path

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore()
        self.requeue = False  # no consistent checkpoint to resume from

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # Last of all: `scontrol requeue` ends this job at once, so the checkpoint, the summary and
        # the loggers must be done first. One rank requeues the whole job.
        if self.requeue and trainer.is_global_zero:
            flush_loggers(trainer)
            requeue_job()
        self.requeue = False

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
