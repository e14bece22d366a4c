"""The run directory and the resume policy, in one place.

``<run.root_dir>/<run.experiment>/version_<n>/`` holds run.json (the run id, which is the W&B run
id, and the SLURM job id), config.yaml, console.log (what the run printed), metrics.csv, checkpoints/, eval/,
rollouts.jsonl and plots/.

- ``layout``: where a run's files go (``run_directory``) and the cleanup of a run that never started;
- ``identity``: ``run.json``, which a restart of the run reads again;
- ``checkpoint_file``: a checkpoint file or sharded folder (FSDP), read alike;
- ``resume``: which checkpoint ``--ckpt_path`` resumes and in which directory the run goes on;
- ``loggers``: metrics.csv kept across a resume, and W&B in the same run;
- ``console_log``: console.log, what the run printed, appended on resume.

It sits below the callbacks and the CLI: it knows Lightning's trainer and loggers, not them.
"""

from rlcode.run_dir.checkpoint_file import checkpoint_metadata, is_sharded_checkpoint, load_whole_checkpoint
from rlcode.run_dir.identity import read_run, run_identity, shared_run_id, slurm_job_id
from rlcode.run_dir.layout import discard_unstarted, run_directory, unstarted
from rlcode.run_dir.loggers import ResumableCSVLogger, finish_wandb, run_loggers, wandb_mode
from rlcode.run_dir.resume import checkpoint_step, find_last_checkpoint, resumed_step, trim_rollouts, version_of

__all__ = ["ResumableCSVLogger", "checkpoint_metadata", "checkpoint_step", "discard_unstarted", "find_last_checkpoint", "finish_wandb",
           "is_sharded_checkpoint", "load_whole_checkpoint", "read_run", "resumed_step", "run_directory", "run_identity", "run_loggers", "shared_run_id",
           "slurm_job_id", "trim_rollouts", "unstarted", "version_of", "wandb_mode"]
