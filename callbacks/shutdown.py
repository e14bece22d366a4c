"""Ctrl-C, SIGTERM or SIGUSR1: finish the current step, save ``last.ckpt``, stop cleanly (exit status 0).

A step on CPU can take a minute; killing it halfway loses it and leaves no checkpoint. The handler
only sets a flag; the checkpoint is written between steps, where the state is consistent. A second
signal falls back to the default behaviour (an immediate KeyboardInterrupt / termination). Under
DDP a signal to any one rank stops every rank after the same step.

An eval running when the signal lands (or due after the step) is abandoned between its batches and
the save comes first (``rlcode.callbacks.stop_request``); the eval at that step runs again on
resume. A save running when it lands is finished, then the run stops (the checkpoint callback asks
right after its save). ``rlcode validate`` / ``test`` stop between batches, write nothing, and say so
in one line. The handlers are installed at setup, before the start-of-run eval.

SIGUSR1 is SLURM's warning before the time limit (``sbatch --signal=SIGUSR1@90``): after the save,
rank zero requeues the job (``rlcode.callbacks.slurm_requeue``), which resumes from that checkpoint. The
handlers replace Lightning's for the training loop, so its auto-requeue never runs mid-step.
"""

from __future__ import annotations

import os
import signal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from rlcode.callbacks import stop_request
from rlcode.callbacks.checkpointing import StepCheckpoint
from rlcode.callbacks.slurm_requeue import flush_loggers, requeue_job
from rlcode import stop_signal


class GracefulShutdown(L.Callback):
    def __init__(self) -> None:
        """Save a checkpoint and stop after the running step when SIGINT, SIGTERM or SIGUSR1 arrives;
        after SIGUSR1 also requeue the SLURM job."""
        self.requested: str | None = None
        self.saved: str | None = None  # the checkpoint written on the way out
        self.requeue = False  # SIGUSR1 reached some rank: rank zero requeues after the save
        self._agreed = False  # every rank knows of the request (see ``agreed``)
        self._stopped = False  # the save and the stop are done
        self._scoring_only = False  # rlcode validate / test
        self._previous: dict[int, object] = {}

    def setup(self, trainer, pl_module, stage: str) -> None:
        # Before any eval: the start-of-run eval (an earlier callback's on_train_start) used to run
        # with Lightning's SIGTERM handler, which only logs, so SIGTERM went unheard for minutes.
        self._agreed = self._stopped = False  # a notebook may fit the same trainer again
        self._scoring_only = stage in ("validate", "test")  # nothing to save: the message says so
        _keep_lightning_off_the_signals(trainer)
        self._install()

    def on_train_start(self, trainer, pl_module) -> None:
        self._install()  # a trainer built without setup (tests); a no-op after setup

    def _install(self) -> None:
        if self._previous:
            return
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            try:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread (e.g. inside a notebook worker): leave signals alone
                return
        stop_request.register(self)
        stop_signal.watch(self._asked)  # the decode loop and the training step give up early on it

    def _on_signal(self, signum, frame) -> None:
        self.requested = signal.Signals(signum).name
        self.requeue = self.requeue or signum == signal.SIGUSR1
        then = ", then requeueing the job" if self.requeue else ""
        plan = ("finishing this batch, then stopping" if self._scoring_only
                else f"ending this generation or eval batch (a step not yet updating is redone on resume), "
                     f"then saving a checkpoint{then}")
        if signum == signal.SIGUSR1:
            # SLURM's warning: its SIGTERM at the limit (or a repeated warning) must not turn into an
            # immediate stop that skips the save and the requeue, so the handlers stay.
            rank_zero_info(f"\n{self.requested} received: {plan}")
            return
        rank_zero_info(f"\n{self.requested} received: {plan} (send it again to stop at once)")
        # A second signal acts immediately. Not through the handler found at start: under Lightning
        # that is its own SIGTERM handler, which only logs, so a second SIGTERM did not stop the run.
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)

    def agreed(self, trainer) -> bool:
        """Whether the ranks agreed to stop. Under DDP a signal may reach some ranks only, but saving
        a checkpoint (and generating under FSDP) is collective: a rank leaving alone would leave the
        others waiting forever. So the ranks agree, any request stopping them all: one tiny all-reduce
        per call, every rank calling at the same points (on one device the flag is returned as is)."""
        if self._agreed:
            return True
        if not trainer.strategy.reduce_boolean_decision(self.requested is not None, all=False):
            return False
        self.requeue = trainer.strategy.reduce_boolean_decision(self.requeue, all=False)  # SIGUSR1 anywhere
        self.requested = self.requested or "a signal to another rank"
        self._agreed = True
        return True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.agreed(trainer):
            self.stop(trainer, pl_module)

    def stop(self, trainer, pl_module) -> None:
        """Save ``last.ckpt`` and end the fit loop, once (an eval that gave up and this callback's
        batch end may both ask)."""
        if self._stopped:
            return
        self._stopped = True
        self.saved = self._save(trainer)
        pl_module.history.stop(self.requested, self.saved)  # the evals skip their final one; the summary says so
        if self.saved:
            rank_zero_info(f"saved {self.saved} at step {trainer.global_step}; resume with --ckpt_path last")
        elif trainer.global_step == 0:
            rank_zero_info("stopping at step 0: no step ran, nothing to save (run the command again to start over)")
        else:
            rank_zero_info(f"stopping at step {trainer.global_step}: a dry run changed no weights, nothing to save")
        trainer.should_stop = True

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop_loop(trainer, batch_idx)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop_loop(trainer, batch_idx)

    def _stop_loop(self, trainer, batch_idx: int) -> None:
        """``rlcode validate`` / ``test``: stop before the next batch; the CLI prints the message."""
        command = getattr(trainer.state.fn, "value", trainer.state.fn)  # TrainerFn.VALIDATING: "validate"
        if command in ("validate", "test") and self.agreed(trainer):
            raise stop_request.StopRequested(f"{command} stopped by {self.requested} after {batch_idx} "
                                             "batches; no results written (run it again to score the checkpoint)")

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

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore()
        self.requeue = False  # no consistent checkpoint to resume from

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # Last of all: `scontrol requeue` ends this job at once, so the checkpoint, the summary and
        # the loggers must be done first. One rank requeues the whole job.
        # The handlers stay until here: the final eval (another callback's on_train_end) is abandoned
        # on a signal like any other eval.
        self._restore()
        if self.requeue and trainer.is_global_zero:
            flush_loggers(trainer)
            requeue_job()
        self.requeue = False

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        stop_request.unregister(self)
        stop_signal.unwatch(self._asked)

    def _asked(self) -> bool:
        return self.requested is not None


def _keep_lightning_off_the_signals(trainer) -> None:
    """Lightning installs its SIGTERM handler after the callbacks' setup, around ours: it raises
    SIGTERMException at the next batch (no checkpoint), kills the other ranks and broadcasts from
    inside the handler. Its one other use, SLURM's auto-requeue, the CLI turns off. So the trainer
    does not register its handlers at all (a private hook of Lightning 2.x; without it, nothing)."""
    connector = getattr(trainer, "_signal_connector", None)
    if connector is not None and hasattr(connector, "register_signal_handlers"):
        connector.register_signal_handlers = lambda: None
