"""Where a run's files go: the first logger's directory, ``runs/<experiment>/version_<n>/``."""

from __future__ import annotations

from pathlib import Path


def run_dir(trainer) -> Path:
    """The run directory (the CSV logger's folder when there is one, else the trainer's root).

    What ``trainer.log_dir`` computes, minus its ``strategy.broadcast``: that broadcast is a
    collective, and the callbacks ask on rank zero only (banner, rollouts, plots, eval reports), so
    under DDP rank zero would wait in a collective the other ranks never enter. Only rank zero's
    answer is ever used, so no broadcast is needed.
    """
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    logger = trainer.loggers[0]
    return Path(logger.log_dir if isinstance(logger, (CSVLogger, TensorBoardLogger)) else logger.save_dir)
