"""A resumed run keeps writing the files of its run directory instead of starting them over.

Lightning's CSV logger deletes ``metrics.csv`` when its folder already has files, so resuming in the
same directory used to lose the history of every step before the checkpoint. Here the file is kept
and only the rows of steps at or after the checkpoint's step are dropped: those steps run again
(a run killed after logging step k+1 but before saving it would otherwise log k+1 twice).
``rollouts.jsonl`` is trimmed the same way.

A command that fails before its run wrote anything of its own (a missing checkpoint, an unknown
model, data that is not there) would leave a ``version_N`` holding only what every command writes
first; ``discard_unstarted`` deletes such a directory, so the next run does not skip a number and
``--ckpt_path last`` has no empty runs to look through.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


def checkpoint_step(path: str | Path) -> int:
    """The checkpoint's global step, without reading its tensors (memory-mapped)."""
    import torch

    return int(torch.load(path, map_location="cpu", mmap=True, weights_only=False).get("global_step", 0))


class _KeepingWriter(ExperimentWriter):
    resume_step: int | None = None

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return  # (Lightning warns about any file in the folder; run.json is always there first)
        if self.resume_step is None:
            return path.unlink()  # a fresh run in a used folder: as Lightning does
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            keys, rows = list(reader.fieldnames or []), list(reader)
        kept = [row for row in rows if not row.get("step") or int(float(row["step"])) < self.resume_step]
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=keys)
            writer.writeheader()
            writer.writerows(kept)
        self.metrics_keys = keys  # new columns make the writer rewrite the header, keeping these rows


class ResumableCSVLogger(CSVLogger):
    def __init__(self, *args, resume_step: int | None = None, **kwargs) -> None:
        """Lightning's CSVLogger; with ``resume_step`` it keeps metrics.csv rows of earlier steps."""
        super().__init__(*args, **kwargs)
        self.resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self):
        if self._experiment is None:
            writer = type("Writer", (_KeepingWriter,), {"resume_step": self.resume_step})
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = writer(log_dir=self.log_dir)
        return self._experiment


def trim_rollouts(run_dir: str | Path, resume_step: int) -> None:
    """Drop ``rollouts.jsonl`` lines of steps that will run again."""
    path = Path(run_dir) / "rollouts.jsonl"
    if path.is_file():
        lines = path.read_text().splitlines()
        path.write_text("".join(line + "\n" for line in lines if json.loads(line).get("step", 0) < resume_step))


# Written by every command before its run does anything (the run id, the merged config, Lightning's
# hparams on the way out), and the W&B folder of a run that logged nothing.
_WRITTEN_FIRST = {"run.json", "config.yaml", "hparams.yaml"}


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
