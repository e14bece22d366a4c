"""Ctrl-C or SIGTERM: finish the current step, save ``last.ckpt``, stop cleanly (exit status 0).

A step on CPU can take a minute; killing it halfway loses it and leaves no checkpoint. The handler
only sets a flag; the checkpoint is written between steps, where the state is consistent. A second
signal falls back to the default behaviour (an immediate KeyboardInterrupt / termination). Under
DDP a signal to any one rank stops every rank after the same step.
"""

from __future__ import annotations

import os
import signal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info


class GracefulShutdown(L.Callback):
    def __init__(self) -> None:
        """Save a checkpoint and stop after the running step when SIGINT or SIGTERM arrives."""
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread (e.g. inside a notebook worker): leave signals alone
                return

    def _on_signal(self, signum, frame) -> None:
        self.requested = signal.Signals(signum).name
        rank_zero_info(f"\n{self.requested} received: finishing this step, then saving a checkpoint "
                       "(send it again to stop at once)")
        for other, previous in self._previous.items():
            signal.signal(other, previous)  # a second signal acts immediately
        self._previous = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Under DDP a signal may reach some ranks only, but saving a checkpoint is collective: a
        # rank saving alone would wait forever. So the ranks agree, any request stopping them all
        # (one tiny all-reduce per step; on one device the decision is returned as it is).
        if not trainer.strategy.reduce_boolean_decision(self.requested is not None, all=False):
            return
        self.requested = self.requested or "a signal to another rank"
        callback = trainer.checkpoint_callback
        folder = callback.dirpath if callback is not None and callback.dirpath else f"{trainer.log_dir}/checkpoints"
        path = f"{folder}/last.ckpt"
        if os.path.islink(path):
            os.unlink(path)  # a link to step-N.ckpt: writing through it would relabel that checkpoint
        trainer.save_checkpoint(path)
        rank_zero_info(f"saved {path} at step {trainer.global_step}; resume with --ckpt_path last")
        trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
