"""Checkpoints of a run: ``checkpoints/step-<N>.ckpt`` every N optimizer steps, plus ``last.ckpt``.

There is one ``last.ckpt`` and it always holds the newest state. Lightning's ModelCheckpoint, when
``last.ckpt`` already exists and is not the file it wrote itself, writes ``last-v1.ckpt`` beside it
(its version counter). An interrupted run has exactly that: the interrupt's checkpoint was written
by another hand, so the run ended with two full copies, the summary named ``last-v1.ckpt``, and a
later save could go to a ``last-vN`` while ``--ckpt_path last`` kept reading the older
``last.ckpt``. Here the counter is off, the interrupt saves through this callback
(``save_now``), and each file is written beside its name and renamed over it, so a run killed while
writing keeps its previous ``last.ckpt`` whole, and a ``last.ckpt`` that links to a numbered
checkpoint is replaced instead of written through.

A dry run changes no weights: it writes no checkpoint at all.
"""

from __future__ import annotations

import os
import shutil
import warnings
from typing import Annotated
from weakref import proxy

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

from rlcode.setting import COUNT_OR_ZERO, Range, free
from rlcode.stopping import StopPoint

# GRPO steps the optimizer inside training_step by design, so a checkpoint holds the state after
# the step it is named after; Lightning's warning about exactly that is noise here.
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")


class StepCheckpoint(ModelCheckpoint):
    def __init__(self, every_n_train_steps: Annotated[int, free(COUNT_OR_ZERO)] = 50,
                 keep: Annotated[int, free(Range(1, integer=True, also=(-1,), also_meaning="all"))] = 3,
                 save_weights_only: Annotated[bool, free()] = False) -> None:
        """Save every ``every_n_train_steps`` optimizer steps and at the end (``last.ckpt``).

        Args:
            every_n_train_steps: steps between numbered checkpoints (0: only ``last.ckpt``, at the end).
            keep: numbered checkpoints to keep, the newest (-1: all). A full fine-tune's checkpoint is
                ~12 bytes per parameter (fp32 weights and AdamW's two moments): every one of a 4B
                model's 25 checkpoints would be ~1.2 TB (docs/training.md).
            save_weights_only: leave out the optimizer state (smaller files; resuming then restarts
                AdamW's moments).
        """
        numbered = bool(every_n_train_steps) and keep != 0
        super().__init__(filename="step-{step}", auto_insert_metric_name=False, monitor="step", mode="max",
                         save_top_k=keep if numbered else 0,
                         # With numbered checkpoints last.ckpt is a link to the newest: a 135M model with
                         # AdamW state is 1.6 GB per file, twice the same file is waste.
                         save_last="link" if numbered else True,
                         every_n_train_steps=every_n_train_steps or None, save_weights_only=save_weights_only,
                         enable_version_counter=False)  # one last.ckpt, overwritten (see the module doc)

    def on_fit_start(self, trainer, pl_module) -> None:
        super().on_fit_start(trainer, pl_module)
        if pl_module.run_description().dry_run:  # asked once the module is built, before any save
            self.save_last, self.save_top_k = False, 0  # nothing changed: nothing to save

    @property
    def saves(self) -> bool:
        """False in a dry run."""
        return bool(self.save_last) or self.save_top_k != 0

    def save_now(self, trainer) -> str | None:
        """Save the current state between steps (a graceful stop): ``last.ckpt``, and with numbered
        checkpoints also ``step-<N>.ckpt`` for ``last.ckpt`` to link to. Returns ``last.ckpt``'s
        path, or None when nothing is saved (a dry run). Every rank calls it."""
        if not self.saves:
            return None
        if self._last_global_step_saved != trainer.global_step:  # not saved at this step already
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
        return self.last_model_path or None

    def on_train_batch_end(self, trainer, pl_module, *args, **kwargs) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        # A signal that landed during this save (or after the shutdown looked at this batch end) stops
        # the run now, not a whole step later. Lightning runs checkpoint callbacks after all others, so
        # this is the last look before the next step.
        if pl_module.stop_token.agreed(pl_module.ranks(), StopPoint.AFTER_SAVE):
            save_and_stop(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        # Lightning's would leave last.ckpt linked to the last numbered checkpoint when max_steps is
        # not a multiple of every_n_train_steps: the steps after it saved nowhere.
        self.save_now(trainer)

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        # Lightning's, but written to a side file first and renamed over the name (see the module doc).
        partial = f"{filepath}.partial"
        trainer.save_checkpoint(partial, self.save_weights_only)  # ends with a barrier: complete on disk
        if trainer.is_global_zero:
            if os.path.isdir(filepath) and not os.path.islink(filepath):
                shutil.rmtree(filepath)  # a sharded checkpoint (a folder) of an earlier save
            os.replace(partial, filepath)  # a link at filepath is replaced, its target left alone
        trainer.strategy.barrier("StepCheckpoint._save_checkpoint")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))


def save_and_stop(trainer, pl_module) -> None:
    """Save what the run has (``last.ckpt``) and end the fit loop, once per stop (an eval that gave up
    and the batch end after it may both ask). Call it only after the ranks agreed to stop
    (``StopToken.agreed``), from a hook every rank runs: the save is collective."""
    token = pl_module.stop_token
    if token.acted:
        return
    token.acted = True
    saved = _save_last(trainer)
    pl_module.history.stop(token.signal, saved)  # the evals skip their final one; the summary says so
    if saved:
        rank_zero_info(f"saved {saved} at step {trainer.global_step}; resume with --ckpt_path last")
    elif trainer.global_step == 0:
        rank_zero_info("stopping at step 0: no step ran, nothing to save (run the command again to start over)")
    else:
        rank_zero_info(f"stopping at step {trainer.global_step}: a dry run changed no weights, nothing to save")
    trainer.should_stop = True


def _save_last(trainer) -> str | None:
    """The newest state as ``last.ckpt`` (None in a dry run). Through the run's StepCheckpoint, the
    one writer of its ``last.ckpt``: a second writer made it version its own copy."""
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
