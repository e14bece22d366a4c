"""SLURM's time-limit warning (SIGUSR1) without SLURM: fake ``SLURM_*`` variables and a fake
``scontrol`` on PATH that records how it was called.

SIGUSR1 arrives in the middle of step 1 (sent by the reward function, i.e. before the step's update).
The run gives that step up (``rlcode.training.step_abandon``), saves ``last.ckpt`` with the state step
1 found, calls ``scontrol requeue <job id>`` once and exits 0, with no mid-step checkpoint of
Lightning's auto-requeue. Then the "requeued" job starts the way ``slurm/grpo.sbatch`` does (same
command, ``--ckpt_path last``, same job id) and redoes step 1 in the same run directory, with the prompt order of a run that was never stopped, ignoring a
newer run of another job in the same experiment folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
JOB_ID = "4242"


def length_reward_then_sigusr1(prompts, completions, step=None, **columns) -> list[float]:
    if step == 1 and not os.environ.get("SLURM_RESTART_COUNT"):
        os.kill(os.getpid(), signal.SIGUSR1)  # the time-limit warning, in the middle of step 1
    return [len(text) / 100.0 for text in completions]


def fake_slurm(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "$@" >> "$SCONTROL_LOG"\n')
    scontrol.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SCONTROL_LOG": str(tmp_path / "scontrol.log"),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
           "SLURM_JOB_ID": JOB_ID, "SLURM_JOB_NAME": "rlcode-grpo", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT", "RANK", "SLURM_ARRAY_JOB_ID"):
        env.pop(name, None)
    return env


def sbatch_step(tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    """What slurm/grpo.sbatch runs in each task (srun ... rlcode fit --config ... --ckpt_path last)."""
    command = [sys.executable, "-m", "rlcode.cli", "fit",
               "--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"), "--config", str(REPO / "configs/tiny_grpo.yaml"),
               "--run.root_dir", str(tmp_path / "runs"), "--trainer.max_steps", "4",
               "--model.mode.rewards", "['test_slurm_requeue:length_reward_then_sigusr1']", "--model.learning_rate", "1e-3",
               "--eval.at_start", "false", "--eval.at_end", "false", "--checkpoint.every_n_train_steps", "0",
               "--data.num_train_tasks", "8", "--data.prompts_per_step", "2",  # 4 steps = one epoch
               "--ckpt_path", "last", *extra]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["auto", "fsdp"])
def test_sigusr1_saves_after_the_step_requeues_and_the_requeued_job_resumes(tmp_path, strategy):
    """Before, Lightning's auto-requeue handled SIGUSR1 (a checkpoint saved mid-step,
    hpc_ckpt_*.ckpt, that skips a batch on resume), and the requeued job could pick another run.
    Under FSDP (one SLURM task here) the checkpoint is a sharded folder."""
    from rlcode.run_dir import checkpoint_metadata

    other = tmp_path / "runs/tiny/version_0"  # a run of another job: must not be resumed
    (other / "checkpoints").mkdir(parents=True)
    (other / "checkpoints/last.ckpt").write_text("not a checkpoint of this job")
    (other / "run.json").write_text(json.dumps({"run_id": "otherjob0000", "slurm_job_id": "1111"}))
    env = fake_slurm(tmp_path)

    extra = ["--trainer.strategy", strategy]
    first = sbatch_step(tmp_path, env, *extra)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "starting fresh" in first.stderr
    run = tmp_path / "runs/tiny/version_1"
    assert (tmp_path / "scontrol.log").read_text().split("\n")[:-1] == [f"requeue {JOB_ID}"]
    saved = checkpoint_metadata(run / "checkpoints/last.ckpt")
    assert saved["global_step"] == 1, "step 1, signalled before its update, was given up (redone after the requeue)"
    assert (run / "checkpoints/last.ckpt").is_dir() == (strategy == "fsdp")
    assert not list(tmp_path.rglob("hpc_ckpt_*.ckpt")), "Lightning's mid-step auto-requeue must be off"
    assert "stopped by SIGUSR1 at step 1 of 4" in first.stdout
    record = json.loads((run / "run.json").read_text())
    assert record["slurm_job_id"] == JOB_ID

    requeued = sbatch_step(tmp_path, {**env, "SLURM_RESTART_COUNT": "1"}, *extra)
    assert requeued.returncode == 0, requeued.stderr[-4000:]
    assert f"resuming from {run}/checkpoints/last.ckpt" in requeued.stderr
    assert not (tmp_path / "runs/tiny/version_2").exists(), "the requeued job continues in its run directory"
    assert json.loads((run / "run.json").read_text()) == record, "same run id (and W&B run) after the requeue"
    assert (tmp_path / "scontrol.log").read_text().count("requeue") == 1, "a finished run does not requeue"
    assert "rlcode fit finished: 4 " in requeued.stdout and "Training complete!" in requeued.stdout

    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({row["step"] for row in rows}) == [0, 1, 2, 3], "step 0 before, 1-3 after the requeue"
    assert [sorted({r["task_id"] for r in rows if r["step"] == step}) for step in range(4)] == expected_order()
    with (run / "metrics.csv").open() as handle:
        import csv

        steps = [int(r["step"]) for r in csv.DictReader(handle) if r.get("reward/avg_batch_reward")]
    assert steps == [0, 1, 2, 3], "metrics.csv keeps the first job's steps and adds the requeued job's"


def expected_order() -> list[list[int]]:
    """Task ids of steps 0-3 in a run that is never stopped: the DataModule's seeded order."""
    from rlcode.data.datamodule import rank_batches
    from rlcode.data.mbpp import load_mbpp

    tasks = load_mbpp(os.environ["MBPP_DATASET_PATH"], split="train")[:8]
    batches = rank_batches(len(tasks), 2, seed=0, epoch=0, rank=0, world_size=1)
    return [sorted(tasks[i].task_id for i in batch) for batch in batches[:4]]


def test_the_cli_turns_lightnings_auto_requeue_off_only_under_slurm(monkeypatch):
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from rlcode.cli.command import _slurm_without_auto_requeue

    for name in ("SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)
    assert _slurm_without_auto_requeue({}) is None
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "rlcode-grpo")
    plugin = _slurm_without_auto_requeue({})
    assert isinstance(plugin, SLURMEnvironment) and plugin.auto_requeue is False
    assert _slurm_without_auto_requeue({"plugins": [SLURMEnvironment()]}) is None  # the user's choice stays


def test_sigterm_after_sigusr1_still_saves_and_requeues():
    """SLURM sends SIGTERM at the time limit: if the step outlasts the SIGUSR1 lead time, that SIGTERM
    must not act as a 'second signal' (an immediate stop without the save and the requeue)."""
    from rlcode.callbacks.shutdown import GracefulShutdown

    before = signal.getsignal(signal.SIGTERM)
    shutdown = GracefulShutdown()
    shutdown.on_train_start(None, None)
    try:
        signal.raise_signal(signal.SIGUSR1)
        assert shutdown.token.signal == "SIGUSR1" and shutdown.token.requeue
        assert signal.getsignal(signal.SIGTERM) == shutdown._on_signal, "SIGTERM still only sets the flag"
        signal.raise_signal(signal.SIGTERM)
        assert shutdown.token.signal == "SIGTERM" and shutdown.token.requeue, "the requeue still happens"
    finally:
        shutdown.on_exception(None, None, None)  # puts the handlers back, and no requeue without a trainer
    assert signal.getsignal(signal.SIGTERM) == before
