"""Exact resume under FSDP (2 CPU ranks, gloo, ``--trainer.strategy fsdp``): a run SIGKILLed right
after its step-k sharded checkpoint, or stopped by SIGUSR1 (SLURM's time-limit warning) during a
step, and resumed with ``--ckpt_path last`` ends with the same weights, bit for bit, and the same
logged rewards as a run never interrupted; ``rlcode export`` of the final sharded checkpoint loads in
transformers and decodes the same greedy tokens as the trained (sharded) policy did.

Each run is this file as a script (Lightning re-runs the command line for rank 1, which applies the
same stop): ``python tests/test_fsdp_resume.py RUN_ROOT STOP [extra args]``, STOP being ``0``,
``kill@K`` (every rank SIGKILLs itself once step K's checkpoint is on disk) or ``usr1@K`` (every
rank gets SIGUSR1 as step K ends; the graceful stop saves the state after step K).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_resume_exact import STEPS, _interrupt_at, _kill_after_checkpoint, arguments, logged_rewards  # STEPS: arguments()'s

pytestmark = pytest.mark.slow  # each run starts 2 ranks (20-40 s)

REPO = Path(__file__).resolve().parents[1]
STOP_AT = 2
FSDP = ["--trainer.strategy", "fsdp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
PROMPT = "def add(a, b):"


def _stop_every_rank(how: str, step: int) -> None:
    """Every rank runs this script, so each applies the stop to itself: a SIGKILL once step ``step``'s
    checkpoint is on disk, or SIGUSR1 as that step ends (test_resume_exact's patches)."""
    if how == "kill":
        _kill_after_checkpoint(step)
    else:
        _interrupt_at(step, "SIGUSR1")


def _record_greedy_tokens(root: Path) -> None:
    """At the end of fit every rank decodes PROMPT greedily (generation gathers the shards: all ranks
    take part); rank 0 writes the token ids."""
    from rlcode.rollout import SamplingParams
    from rlcode.training.learner import Learner

    def on_train_end(self) -> None:
        rollout = self.backend.generate([PROMPT], 1, SamplingParams(temperature=0.0, max_new_tokens=8))
        if self.global_rank == 0:
            ids = rollout.completion_ids[0][rollout.completion_mask[0].bool()].tolist()
            (root / "greedy.json").write_text(json.dumps(ids))
    Learner.on_train_end = on_train_end


def run(root: Path, *extra: str, stop: str = "0") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, str(Path(__file__)), str(root), stop, *extra]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def sharded_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from rlcode.run_dir import is_sharded_checkpoint, load_whole_checkpoint

    path = run_dir / "checkpoints/last.ckpt"
    assert is_sharded_checkpoint(path), "FSDP writes sharded checkpoints (a folder of shards)"
    return load_whole_checkpoint(path)["state_dict"]


@pytest.mark.parametrize("stop", ["kill", "usr1"])
def test_a_stopped_sharded_run_resumes_to_the_uninterrupted_weights(tmp_path, stop):
    straight = run(tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    stopped = run(tmp_path / "resumed", stop=f"{stop}@{STOP_AT}")
    if stop == "kill":
        assert stopped.returncode == -9, f"meant to die by SIGKILL: {stopped.returncode}\n{stopped.stderr[-2000:]}"
    else:
        assert stopped.returncode == 0 and f"stopped by SIGUSR1 at step {STOP_AT} of {STEPS}" in stopped.stdout, \
            stopped.stdout[-2000:] + stopped.stderr[-2000:]
    run_dir, reference = tmp_path / "resumed/tiny/version_0", tmp_path / "straight/tiny/version_0"
    assert sorted(logged_rewards(run_dir)) == list(range(STOP_AT))
    resumed = run(tmp_path / "resumed", "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (tmp_path / "resumed/tiny/version_1").exists(), "the resumed run continues in its own directory"
    assert logged_rewards(run_dir) == logged_rewards(reference), "every step's logged reward, bit for bit"
    ours, theirs = sharded_weights(run_dir), sharded_weights(reference)
    assert ours.keys() == theirs.keys() and ours
    assert all(torch.equal(ours[key], theirs[key]) for key in ours), "same parameters at step n, bit for bit"


def test_a_sharded_checkpoint_exports_validates_and_refuses_a_resume_without_fsdp(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trained = run(tmp_path / "run")
    assert trained.returncode == 0, trained.stderr[-3000:]
    out = tmp_path / "exported"
    exported = subprocess.run([sys.executable, "-m", "rlcode.cli", "export", "--ckpt",
                               str(tmp_path / "run/tiny/version_0/checkpoints/last.ckpt"), "--out", str(out)],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
    assert exported.returncode == 0, exported.stderr[-3000:]
    tokenizer, model = AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)
    inputs = tokenizer([PROMPT], return_tensors="pt")
    output = model.generate(**inputs, do_sample=False, max_new_tokens=8, pad_token_id=tokenizer.pad_token_id)
    decoded = output[0, inputs["input_ids"].size(1):].tolist()
    trained_ids = json.loads((tmp_path / "run" / "greedy.json").read_text())
    assert decoded[:len(trained_ids)] == trained_ids and trained_ids

    # rlcode validate without FSDP reads the shards joined; fit refuses to resume them without FSDP
    ckpt = str(tmp_path / "run/tiny/version_0/checkpoints/last.ckpt")
    common = [sys.executable, "-m", "rlcode.cli", "validate", *arguments(tmp_path / "run")[1:], "--ckpt_path", ckpt]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}  # the test's reward
    validated = subprocess.run(common, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert validated.returncode == 0 and "is sharded (FSDP): joining its shards" in validated.stdout, \
        validated.stdout[-2000:] + validated.stderr[-2000:]
    refused = subprocess.run([*common[:3], "fit", *common[4:]], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode != 0 and "is a sharded (FSDP) checkpoint" in refused.stderr, refused.stderr[-2000:]
    assert len(refused.stderr.strip().splitlines()) <= 3, refused.stderr


if __name__ == "__main__":
    root, stop = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)  # the same arithmetic in every run
    if stop != "0":
        how, _, at = stop.partition("@")
        _stop_every_rank(how, int(at))
    _record_greedy_tokens(root)
    from rlcode.cli.command import main

    main(arguments(root, *FSDP, *sys.argv[3:]))
