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

Which checkpoint a run resumes from and which directory it goes on in is decided here too:
``find_last_checkpoint`` (``--ckpt_path last``), ``version_of`` and ``resumed_step``.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from rlcode.run_identity import read_run, slurm_job_id


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


def find_last_checkpoint(run: Any) -> tuple[str | None, int | None]:
    """(path of the newest run's last.ckpt, its version number), or (None, None) to start fresh.

    Under SLURM only runs of this job (``run.json``'s job id) count: a requeued job continues its
    own run even if other runs of the experiment started meanwhile, and a new job starts fresh.
    """
    folder = Path(run["root_dir"]) / run["experiment"]
    job = slurm_job_id()
    candidates = []
    for path in folder.glob("version_*/checkpoints/last.ckpt"):
        match = re.fullmatch(r"version_(\d+)", path.parent.parent.name)
        if match and (job is None or read_run(path.parent.parent).get("slurm_job_id") == job):
            candidates.append((int(match.group(1)), path))
    if not candidates:
        whose = f" of SLURM job {job}" if job else ""
        print(f"--ckpt_path last: no checkpoint{whose} under {folder}/version_*/checkpoints/ yet, starting fresh",
              file=sys.stderr)
        return None, None
    version, path = max(candidates)
    print(f"resuming from {path}", file=sys.stderr)
    return str(path), version


def version_of(ckpt_path: str | None, run: Any) -> int | None:
    """N when ``ckpt_path`` lies in ``<root_dir>/<experiment>/version_N/checkpoints/``: that run goes on."""
    if not ckpt_path or ckpt_path in ("best", "last", "hpc", "registry"):
        return None
    path = Path(ckpt_path).resolve()
    match = re.fullmatch(r"version_(\d+)", path.parent.parent.name)
    experiment = (Path(run["root_dir"]) / run["experiment"]).resolve()
    inside = match and path.parent.name == "checkpoints" and path.parent.parent.parent == experiment
    return int(match.group(1)) if inside else None


def resumed_step(ckpt_path: str | None, run: Any, version: int | None) -> int | None:
    """The step a run resumed in its own directory restarts at; its files lose the rows from there on."""
    if version is None or not ckpt_path:
        return None
    step = checkpoint_step(ckpt_path)
    if rank_zero_only.rank == 0:
        trim_rollouts(Path(run["root_dir"]) / run["experiment"] / f"version_{version}", step)
    return step
