"""Requeueing a SLURM job from inside it: ``scontrol requeue <job id>``, once, from global rank zero.

Asked for by ``GracefulShutdown`` after SIGUSR1 (``sbatch --signal=SIGUSR1@90``), once the step is
finished, every rank has agreed to stop and ``last.ckpt`` is written. It runs in the callback's
``teardown``, after the summary and after the W&B run is flushed, because ``scontrol requeue`` ends
this job right away (SIGTERM, then SIGKILL). The requeued job starts the same sbatch script, whose
``--ckpt_path last`` finds this job's run directory (``run.json`` records the job id).

Lightning's own auto-requeue (its SLURMEnvironment's SIGUSR1 handler) is turned off by the CLI: it
saves in the middle of a step, where the data stream has moved past the batch and global_step
has not, and runs a collective inside a signal handler.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from rlcode.run_dir.identity import slurm_job_id


def requeue_job() -> bool:
    """``scontrol requeue`` this job; False (with a warning saying why) when that is impossible."""
    job_id = slurm_job_id()
    if not job_id or not re.fullmatch(r"[0-9_]+", job_id):
        rank_zero_warn(f"SIGUSR1 asked for a requeue, but SLURM_JOB_ID is {job_id!r}: not requeueing "
                       "(resume by hand with --ckpt_path last)")
        return False
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        rank_zero_warn("SIGUSR1 asked for a requeue, but scontrol is not on PATH: resume by hand with --ckpt_path last")
        return False
    done = subprocess.run([scontrol, "requeue", job_id], capture_output=True, text=True)
    if done.returncode != 0:
        rank_zero_warn(f"scontrol requeue {job_id} failed ({done.returncode}: {done.stderr.strip()[:200]}); "
                       "did sbatch get --requeue? Resume by hand with --ckpt_path last")
        return False
    rank_zero_info(f"requeued SLURM job {job_id}: it resumes from last.ckpt in the same run directory")
    return True


def flush_loggers(trainer) -> None:
    """Finish W&B before the requeue ends the process (its files would lose their tail otherwise)."""
    for logger in trainer.loggers:
        experiment = getattr(logger, "_experiment", None)
        if experiment is not None and callable(getattr(experiment, "finish", None)):
            experiment.finish()
        else:
            logger.save()
