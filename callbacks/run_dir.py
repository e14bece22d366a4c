"""Where a run's files go: the first logger's directory, ``runs/<experiment>/version_<n>/``."""

from __future__ import annotations

from pathlib import Path


def run_dir(trainer) -> Path:
    """The run directory (the CSV logger's folder when there is one, else the trainer's root)."""
    return Path(trainer.log_dir or trainer.default_root_dir)
