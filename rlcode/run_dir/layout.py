"""Where a run's files go, and the directory of a run that never started.

``<run.root_dir>/<run.experiment>/version_<n>/``: the first logger's folder (the CSV logger's), else
the trainer's root. A command that fails before its run wrote anything of its own (a missing
checkpoint, an unknown model, data that is not there) would leave a ``version_N`` holding only what
every command writes first; ``discard_unstarted`` deletes such a directory, so the next run does not
skip a number and ``--ckpt_path last`` has no empty runs to look through.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from rlcode.run_dir.loggers import ResumableCSVLogger

# Written by every command before its run does anything (the run id, the merged config, what it
# printed, Lightning's hparams on the way out), and the W&B folder of a run that logged nothing.
_WRITTEN_FIRST = {"run.json", "config.yaml", "hparams.yaml", "console.log"}


def run_directory(trainer) -> Path:
    """The run directory (the CSV logger's folder when there is one, else the trainer's root).

    What ``trainer.log_dir`` computes, minus its ``strategy.broadcast``: that broadcast is a
    collective, and the callbacks ask on rank zero only (banner, rollouts, plots, eval reports), so
    under DDP rank zero would wait in a collective the other ranks never enter. Only rank zero's
    answer is ever used, so no broadcast is needed.
    """
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    logger = trainer.loggers[0]
    return Path(logger.log_dir if isinstance(logger, (CSVLogger, TensorBoardLogger)) else logger.save_dir)


def discard_unstarted(loggers) -> Path | None:
    """Delete the run directory (the ``ResumableCSVLogger``'s) when it holds nothing but what every
    command writes first; returns it if deleted. Rank zero only; a directory with any checkpoint,
    metric, eval or rollout is left alone."""
    logger = next((logger for logger in loggers if isinstance(logger, ResumableCSVLogger)), None)
    if logger is None or rank_zero_only.rank != 0:
        return None
    folder = Path(logger.log_dir)
    if not folder.is_dir() or not unstarted(folder):
        return None
    shutil.rmtree(folder, ignore_errors=True)
    return folder


def unstarted(folder: Path) -> bool:
    """True when ``folder`` holds no file beyond ``_WRITTEN_FIRST`` and the W&B folder."""
    for path in folder.rglob("*"):
        if path.is_dir() and not path.is_symlink():
            continue
        parts = path.relative_to(folder).parts
        if parts[0] == "wandb" or (len(parts) == 1 and parts[0] in _WRITTEN_FIRST):
            continue
        return False
    return True
