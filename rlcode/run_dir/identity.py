"""A run's identity: ``run.json`` in its directory, read again by every restart of the run.

It holds the run id (the W&B run id, and the ``run`` tag of the run's sandbox executions) and, under
SLURM, the job id, so that a requeued job (same ``SLURM_JOB_ID``) finds its own run directory even
when other runs of the same experiment started since. Written once, by rank zero, when the run
starts; a resumed run reuses it, which is how W&B continues the same run instead of opening one.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

FILE = "run.json"


def new_run_id() -> str:
    # W&B ids: letters and digits; 12 base-36 characters make collisions within a project negligible.
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(12))


def read_run(folder: str | Path) -> dict:
    path = Path(folder) / FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_identity(folder: str | Path, *, write: bool) -> dict:
    """The run's record, created (and written if ``write``) when the folder has none yet."""
    record = read_run(folder)
    if record.get("run_id"):
        return record
    record = {"run_id": new_run_id()}
    if os.environ.get("SLURM_JOB_ID"):
        record["slurm_job_id"] = slurm_job_id()
    if write:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / FILE).write_text(json.dumps(record) + "\n")
    return record


def slurm_job_id() -> str | None:
    """This job's id as ``scontrol requeue`` wants it (array tasks: ``<array job>_<task>``)."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def shared_run_id(trainer, run_id: str | None) -> str:
    """``run_id`` (or a new one) as rank zero has it: every rank tags executions with the same id."""
    return trainer.strategy.broadcast(run_id or new_run_id(), src=0)
