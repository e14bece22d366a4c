"""Which checkpoint a run resumes from and which directory it goes on in.

``--ckpt_path last`` resumes the newest run of the experiment that has a ``last.ckpt``
(``find_last_checkpoint``), in the same directory; under SLURM only a run of this job counts, so a
requeued job picks up where it stopped and a new job starts fresh. A checkpoint path inside a run
directory also continues that run's directory (``version_of``). A resumed run keeps writing its
files instead of starting them over: the steps from the checkpoint's on run again, so their rows
are dropped from ``rollouts.jsonl`` here (``resumed_step``) and from ``metrics.csv`` by
``rlcode.run_dir.loggers.ResumableCSVLogger``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_only

from rlcode.run_dir.checkpoint_file import checkpoint_metadata
from rlcode.run_dir.identity import read_run, slurm_job_id


def checkpoint_step(path: str | Path) -> int:
    """The checkpoint's global step, without reading its tensors (a file or a sharded folder)."""
    return int(checkpoint_metadata(path).get("global_step", 0))


def trim_rollouts(run_dir: str | Path, resume_step: int) -> None:
    """Drop ``rollouts.jsonl`` lines of steps that will run again."""
    path = Path(run_dir) / "rollouts.jsonl"
    if path.is_file():
        lines = path.read_text().splitlines()
        path.write_text("".join(line + "\n" for line in lines if json.loads(line).get("step", 0) < resume_step))


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
