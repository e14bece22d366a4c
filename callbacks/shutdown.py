"""Ctrl-C, SIGTERM or SIGUSR1: finish the current step, save ``last.ckpt``, stop cleanly (exit status 0).

A step on CPU can take a minute; killing it halfway loses it and leaves no checkpoint. The handler
only sets a flag; the checkpoint is written between steps, where the state is consistent. A second
signal falls back to the default behaviour (an immediate KeyboardInterrupt / termination). Under
DDP a signal to any one rank stops every rank after the same step.

An eval running when the signal lands (or due after the step) is abandoned between its batches and
the save comes first (``save_and_stop``); the eval at that step runs again on
resume. A save running when it lands is finished, then the run stops (the checkpoint callback asks
right after its save). ``rlcode validate`` / ``test`` stop between batches, write nothing, and say so
in one line. The handlers are installed at setup, before the start-of-run eval.

SIGUSR1 is SLURM's warning before the time limit (``sbatch --signal=SIGUSR1@90``): after the save,
rank zero requeues the job (``rlcode.callbacks.slurm_requeue``), which resumes from that checkpoint. The
handlers replace Lightning's for the training loop, so its auto-requeue never runs mid-step.

The handlers only tell the run's ``StopToken`` (``rlcode.stopping``: the module's ``stop_token``),
which every other reader asks; this callback asks it at each batch end and before each validate /
test batch.
"""

from __future__ import annotations

import signal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from rlcode.callbacks.checkpointing import save_and_stop
from rlcode.callbacks.slurm_requeue import flush_loggers, requeue_job
from rlcode.stopping import StopPoint, Stopped, StopToken


class GracefulShutdown(L.Callback):
    def __init__(self) -> None:
        """Save a checkpoint and stop after the running step when SIGINT, SIGTERM or SIGUSR1 arrives;
        after SIGUSR1 also requeue the SLURM job."""
        # The module's token once set up (``Learner.stop_token``); this one until then: a trainer
        # built without setup, or the handlers tested alone.
        self.token = StopToken()
        self._scoring_only = False  # rlcode validate / test
        self._previous: dict[int, object] = {}

    def setup(self, trainer, pl_module, stage: str) -> None:
        # Before any eval: the start-of-run eval (an earlier callback's on_train_start) used to run
        # with Lightning's SIGTERM handler, which only logs, so SIGTERM went unheard for minutes.
        self.token = pl_module.stop_token
        self.token.new_fit()  # a notebook may fit the same trainer again
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

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        self.token.request(name, requeue=signum == signal.SIGUSR1)
        then = ", then requeueing the job" if self.token.requeue else ""
        plan = ("finishing this batch, then stopping" if self._scoring_only
                else f"ending this generation or eval batch (a step not yet updating is redone on resume), "
                     f"then saving a checkpoint{then}")
        if signum == signal.SIGUSR1:
            # SLURM's warning: its SIGTERM at the limit (or a repeated warning) must not turn into an
            # immediate stop that skips the save and the requeue, so the handlers stay.
            rank_zero_info(f"\n{name} received: {plan}")
            return
        rank_zero_info(f"\n{name} received: {plan} (send it again to stop at once)")
        # A second signal acts immediately. Not through the handler found at start: under Lightning
        # that is its own SIGTERM handler, which only logs, so a second SIGTERM did not stop the run.
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.token.agreed(pl_module.ranks(), StopPoint.STEP_END):
            save_and_stop(trainer, pl_module)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop_loop(trainer, pl_module, batch_idx)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop_loop(trainer, pl_module, batch_idx)

    def _stop_loop(self, trainer, pl_module, batch_idx: int) -> None:
        """``rlcode validate`` / ``test``: stop before the next batch; the CLI prints the message."""
        command = getattr(trainer.state.fn, "value", trainer.state.fn)  # TrainerFn.VALIDATING: "validate"
        if command in ("validate", "test") and self.token.agreed(pl_module.ranks(), StopPoint.SCORING_BATCH):
            raise Stopped(f"{command} stopped by {self.token.signal} after {batch_idx} "
                          "batches; no results written (run it again to score the checkpoint)")

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore()
        self.token.requeue = False  # no consistent checkpoint to resume from

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # Last of all: `scontrol requeue` ends this job at once, so the checkpoint, the summary and
        # the loggers must be done first. One rank requeues the whole job.
        # The handlers stay until here: the final eval (another callback's on_train_end) is abandoned
        # on a signal like any other eval.
        self._restore()
        if self.token.requeue and trainer.is_global_zero:
            flush_loggers(trainer)
            requeue_job()
        self.token.requeue = False

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


def _keep_lightning_off_the_signals(trainer) -> None:
    """Lightning installs its SIGTERM handler after the callbacks' setup, around ours: it raises
    SIGTERMException at the next batch (no checkpoint), kills the other ranks and broadcasts from
    inside the handler. Its one other use, SLURM's auto-requeue, the CLI turns off. So the trainer
    does not register its handlers at all (a private hook of Lightning 2.x; without it, nothing)."""
    connector = getattr(trainer, "_signal_connector", None)
    if connector is not None and hasattr(connector, "register_signal_handlers"):
        connector.register_signal_handlers = lambda: None
