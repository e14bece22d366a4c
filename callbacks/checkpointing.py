"""Checkpoints of a run: ``checkpoints/step-<N>.ckpt`` every N optimizer steps, plus ``last.ckpt``."""

from __future__ import annotations

import warnings

from lightning.pytorch.callbacks import ModelCheckpoint

# GRPO steps the optimizer inside training_step by design, so a checkpoint holds the state after
# the step it is named after; Lightning's warning about exactly that is noise here.
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")


class StepCheckpoint(ModelCheckpoint):
    def __init__(self, every_n_train_steps: int = 50, keep: int = -1, save_weights_only: bool = False) -> None:
        """Save every ``every_n_train_steps`` optimizer steps and at the end (``last.ckpt``).

        Args:
            every_n_train_steps: steps between numbered checkpoints (0: only ``last.ckpt``, at the end).
            keep: numbered checkpoints to keep, newest first (-1: all).
            save_weights_only: leave out the optimizer state (smaller files; resuming then restarts
                AdamW's moments).
        """
        numbered = bool(every_n_train_steps) and keep != 0
        super().__init__(filename="step-{step}", auto_insert_metric_name=False, monitor="step", mode="max",
                         save_top_k=keep if numbered else 0,
                         # With numbered checkpoints last.ckpt is a link to the newest: a 135M model with
                         # AdamW state is 1.6 GB per file, twice the same file is waste.
                         save_last="link" if numbered else True,
                         every_n_train_steps=every_n_train_steps or None, save_weights_only=save_weights_only)
