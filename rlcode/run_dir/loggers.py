"""The run's loggers: metrics.csv in the run directory (kept across a resume), and W&B when asked.

Lightning's CSV logger deletes ``metrics.csv`` when its folder already has files, so resuming in the
same directory used to lose the history of every step before the checkpoint. ``ResumableCSVLogger``
keeps the file and drops only the rows of steps at or after the checkpoint's step: those steps run
again (a run killed after logging step k+1 but before saving it would otherwise log k+1 twice).

The W&B run id is the run's id from ``run.json`` (``rlcode.run_dir.identity``), so a resumed run
logs into the same W&B run. ``WANDB_MODE`` / ``run.wandb`` online without an API key or a reachable
server falls back to offline, said once.
"""

from __future__ import annotations

import csv
import netrc
import os
import socket
import sys
from pathlib import Path
from typing import Protocol

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from rlcode.run_dir.quiet_output import without_wandb_anonymous
from rlcode.run_dir.identity import run_identity

_said: set[str] = set()


class RunPlace(Protocol):
    """What the loggers need of the CLI's ``run:`` settings."""

    experiment: str
    root_dir: str
    wandb: str | None
    wandb_project: str


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


def run_loggers(run: RunPlace, version: int | None, resume_step: int | None = None) -> tuple[list, str]:
    """(the run's loggers, its run id). The id comes from the run directory's run.json, written by
    rank zero when the run starts, so a resumed run logs into the same W&B run."""
    # Flushed every step: a step takes seconds to minutes, and metrics.csv is what people tail.
    csv_logger = ResumableCSVLogger(save_dir=run.root_dir, name=run.experiment, version=version,
                                    flush_logs_every_n_steps=1, resume_step=resume_step)
    loggers = [csv_logger]  # first: its folder is the run directory
    run_id = run_identity(csv_logger.log_dir, write=rank_zero_only.rank == 0)["run_id"]  # other ranks: broadcast
    mode = wandb_mode(run.wandb)
    if mode != "disabled":
        from lightning.pytorch.loggers import WandbLogger  # imports wandb: only when it logs

        loggers.append(without_wandb_anonymous(WandbLogger(
            project=run.wandb_project, group=run.experiment, save_dir=csv_logger.log_dir, mode=mode, id=run_id,
            resume="allow", name=f"{run.experiment}/{Path(csv_logger.log_dir).name}")))
    return loggers, run_id


def wandb_mode(requested: str | None) -> str:
    """"online", "offline" or "disabled": ``requested`` (``run.wandb``), else ``WANDB_MODE``, else
    disabled; online without an API key or a reachable server is offline."""
    mode = requested or os.environ.get("WANDB_MODE") or "disabled"
    if mode == "dryrun":
        mode = "offline"
    if mode not in ("online", "offline", "disabled"):
        raise ValueError(f"W&B mode {mode!r} (run.wandb or WANDB_MODE) is not online, offline or disabled")
    if mode == "online":
        if not os.environ.get("WANDB_API_KEY") and not _has_netrc_login("api.wandb.ai"):
            say_once("wandb", "W&B: no WANDB_API_KEY (environment or .env): logging offline; "
                              "`wandb sync` the run folder later")
            return "offline"
        if not reachable("api.wandb.ai"):
            say_once("wandb", "W&B: api.wandb.ai unreachable: logging offline; `wandb sync` the run folder later")
            return "offline"
    return mode


def finish_wandb() -> None:
    """End the W&B run with the command (Lightning leaves it open): its files are complete, and a
    next fit in the same process (a notebook, a test) opens its own run instead of reusing this one."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.run.finish()


def reachable(host: str, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def say_once(key: str, message: str) -> None:
    """Print ``message`` to stderr the first time ``key`` comes up in this process."""
    if key not in _said:
        _said.add(key)
        print(message, file=sys.stderr)


def _has_netrc_login(host: str) -> bool:
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False
