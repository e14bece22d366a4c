"""Exact resume: a run SIGKILLed right after its step-k checkpoint and resumed with ``--ckpt_path last``
reaches step n with the same weights and the same logged rewards as a run never interrupted.

The reward draws from python's, numpy's and torch's generators on top of a length reward, so a resume
that re-seeds them (Lightning's checkpoints hold no RNG state) logs other rewards from step k on and
trains on other advantages. The kill is a real SIGKILL of a separate process (no handler, no
teardown): this file run as ``python tests/test_resume_exact.py RUN_ROOT STOP [extra args]``, STOP being
``0`` (run to the end), ``kill@K`` (SIGKILL after step K's checkpoint) or ``sigint@K`` (Ctrl-C during
step K+1's end: the graceful stop saves the state after step K and exits).
"""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
STEPS, KILL_AT = 4, 2
LORA = ["--model.lora", "{r: 4, alpha: 8, dropout: 0.0}"]


def noisy_length_reward(prompts, completions, **columns) -> list[float]:
    """Length plus noise from the three generators a user's reward might use."""
    import numpy as np

    return [len(text) / 100.0 + random.random() / 10 + float(np.random.rand()) / 10 + float(torch.rand(())) / 10
            for text in completions]


def arguments(root: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"), "--config", str(REPO / "configs/tiny_grpo.yaml"),
            "--run.root_dir", str(root), "--trainer.max_steps", str(STEPS),
            "--model.mode.rewards", "['test_resume_exact:noisy_length_reward']", "--model.learning_rate", "1e-3",
            "--model.mode.sandbox.workers", "1", "--eval.at_start", "false", "--eval.at_end", "false", *extra]


def _kill_after_checkpoint(kill_at: int) -> None:
    """SIGKILL this process as soon as the checkpoint of step ``kill_at`` is on disk."""
    import signal

    from rlcode.callbacks.checkpointing import StepCheckpoint

    original = StepCheckpoint.on_train_batch_end

    def on_train_batch_end(self, trainer, *args):
        original(self, trainer, *args)
        if trainer.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    StepCheckpoint.on_train_batch_end = on_train_batch_end


def _interrupt_at(step: int, signal_name: str = "SIGINT") -> None:
    """Ctrl-C (a real SIGINT to this process; or another signal) as step ``step`` ends, before the
    graceful stop looks."""
    import signal

    from rlcode.callbacks.shutdown import GracefulShutdown

    original = GracefulShutdown.on_train_batch_end

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == step:
            signal.raise_signal(getattr(signal, signal_name))
        original(self, trainer, *args)

    GracefulShutdown.on_train_batch_end = on_train_batch_end


def run_in_process(root: Path, *extra: str, kill_at: int | None = None,
                   interrupt_at: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    stop = f"kill@{kill_at}" if kill_at else f"sigint@{interrupt_at}" if interrupt_at else "0"
    command = [sys.executable, str(Path(__file__)), str(root), stop, *extra]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def logged_rewards(run: Path) -> dict[int, str]:
    with (run / "metrics.csv").open() as handle:
        return {int(r["step"]): r["reward/avg_batch_reward"] for r in csv.DictReader(handle)
                if r.get("reward/avg_batch_reward")}


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.slow
@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_sigkill_after_a_checkpoint_then_resume_matches_an_uninterrupted_run(tmp_path, adapter):
    """RNG states (python, numpy, torch) travel in the checkpoint and come back at
    the first step after the restore; before, the resumed run re-seeded them and its step-2 rewards
    (and so its weights) differed from the uninterrupted run's."""
    extra = LORA if adapter == "lora" else []
    straight = run_in_process(tmp_path / "straight", *extra)
    assert straight.returncode == 0, straight.stderr[-3000:]

    killed = run_in_process(tmp_path / "resumed", *extra, kill_at=KILL_AT)
    assert killed.returncode == -9, f"the run was meant to die by SIGKILL: {killed.returncode}\n{killed.stderr[-2000:]}"
    run = tmp_path / "resumed/tiny/version_0"
    assert sorted(logged_rewards(run)) == [0, 1], "killed right after step 2's checkpoint, before step 2 ran"

    resumed = run_in_process(tmp_path / "resumed", *extra, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (tmp_path / "resumed/tiny/version_1").exists(), "the resumed run continues in its own directory"

    reference = tmp_path / "straight/tiny/version_0"
    assert logged_rewards(run) == logged_rewards(reference), "every step's logged reward, bit for bit"
    ours, theirs = weights(run), weights(reference)
    assert ours.keys() == theirs.keys() and ours
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "same parameters at step n"
    if adapter == "lora":
        assert all("lora_" in key for key in ours)
    rollouts = [json.loads(line)["completion"] for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts == [json.loads(line)["completion"]
                        for line in (reference / "rollouts.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_interrupts_and_two_resumes_match_an_uninterrupted_run_with_only_last_checkpoints(tmp_path):
    """The CPU configs' setting (``checkpoint.every_n_train_steps: 0``: ``last.ckpt`` only). Ctrl-C used
    to leave ``last-v1.ckpt`` beside ``last.ckpt`` (Lightning versioned the file another hand had
    written), the summary named it, and a later save went to a ``last-vN`` while ``--ckpt_path last``
    read the older ``last.ckpt``: steps ran again on a stale state."""
    setting = ["--checkpoint.every_n_train_steps", "0"]
    straight = run_in_process(tmp_path / "straight", *setting)
    assert straight.returncode == 0, straight.stderr[-3000:]

    run = tmp_path / "resumed/tiny/version_0"
    for stop_at, resume in ((1, []), (3, ["--ckpt_path", "last"])):
        stopped = run_in_process(tmp_path / "resumed", *setting, *resume, interrupt_at=stop_at)
        assert stopped.returncode == 0, stopped.stderr[-3000:]
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"], "one last.ckpt, no last-vN"
        saved = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
        assert saved["global_step"] == stop_at, "last.ckpt holds the newest state"
        assert f"checkpoint: {run / 'checkpoints/last.ckpt'}" in stopped.stdout
        assert f"stopped by SIGINT at step {stop_at} of {STEPS}" in stopped.stdout, stopped.stdout[-2000:]

    resumed = run_in_process(tmp_path / "resumed", *setting, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]
    reference = tmp_path / "straight/tiny/version_0"
    assert logged_rewards(run) == logged_rewards(reference) and sorted(logged_rewards(run)) == list(range(STEPS))
    ours, theirs = weights(run), weights(reference)
    assert ours.keys() == theirs.keys() and ours
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "same parameters at step n, bit for bit"


def test_the_mode_state_round_trips_through_a_checkpoint():
    """The mode's state (its stateful reward functions, its estimator's baselines) is saved with every
    checkpoint and loaded with it; the RNG states come back at the first batch."""
    from rlcode.training.resume_state import ExactResume

    class Mode:
        def __init__(self):
            self.values = {}

        def state_dict(self):
            return {"values": dict(self.values)}

        def load_state_dict(self, state):
            self.values = dict(state["values"])

    class Module(ExactResume):
        def __init__(self):
            self.mode = Mode()

    saved = Module()
    saved.mode.values = {"player_0": 0.25}
    checkpoint: dict = {}
    random.seed(5)
    saved.save_resume_state(checkpoint)
    expected = random.random(), float(torch.rand(()))

    loaded = Module()
    loaded.on_load_checkpoint(checkpoint)
    assert loaded.mode.values == {"player_0": 0.25}
    random.seed(99), torch.manual_seed(99)  # what a restart does before the first batch
    loaded.on_train_batch_start(None, 0)
    assert (random.random(), float(torch.rand(()))) == expected


def test_each_rank_takes_back_its_own_generator_states():
    """Under DDP the checkpoint holds every rank's RNG states (gathered when saving); rank r restores
    entry r, and a checkpoint of fewer ranks falls back to rank zero's."""
    from rlcode.training.resume_state import own_rng_states

    entry = {"rng_by_rank": [{"rank": 0}, {"rank": 1}]}
    assert own_rng_states(entry, 1) == {"rank": 1}
    assert own_rng_states(entry, 3) == {"rank": 0}


if __name__ == "__main__":
    root, stop = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)  # the same arithmetic in every run (and room for the sandbox worker)
    if stop.startswith("kill@"):
        _kill_after_checkpoint(int(stop.removeprefix("kill@")))
    elif stop.startswith("sigint@"):
        _interrupt_at(int(stop.removeprefix("sigint@")))
    from rlcode.cli.command import main

    main(arguments(root, *sys.argv[3:]))
