"""A stop signal during a step's generation or its update's first pass: the decode loop ends at the
next token, or the update at the next micro-batch, the step is given up before its first optimizer step
(``rlcode.training.step_abandon``), ``last.ckpt`` holds the state the step found,
and the resumed run redoes the step and ends with the weights and logged rewards of a run never
stopped, bit for bit (full fine-tune and LoRA). The reward draws from python's, numpy's and torch's
generators (``test_resume_exact.noisy_length_reward``), so putting back any state the abandoned step
touched wrongly shows up as other rewards.

Run as ``python tests/test_stop_mid_step.py ROOT STOP [args]``, STOP ``0``, ``sigterm@K`` (SIGTERM
at the first decode step of step K's generation) or ``sigterm-update@K`` (SIGTERM in the first
micro-batch of step K's update).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_resume_exact import LORA, STEPS, arguments, logged_rewards, weights

pytestmark = pytest.mark.slow  # three tiny fits per case (10-20 s each)

REPO = Path(__file__).resolve().parents[1]
STOP_AT = 2


def _sigterm_inside(outer, inner, step: int, record: Path):
    """Wrappers of ``outer`` (counted: one call per training step) and of ``inner`` (called within it):
    SIGTERM at ``inner``'s first call within the ``step``-th call of ``outer``, then count the calls of
    ``inner`` that still run after it (``record``: ``{"after_signal": n}``)."""
    calls, counts = [0], {"after_signal": None}

    def counted(*args, **kwargs):
        calls[0] += 1
        return outer(*args, **kwargs)

    def sending(*args, **kwargs):
        if counts["after_signal"] is not None:
            counts["after_signal"] += 1
        elif calls[0] == step + 1:
            counts["after_signal"] = 0
            os.kill(os.getpid(), signal.SIGTERM)
        record.write_text(json.dumps(counts))
        return inner(*args, **kwargs)

    return counted, sending


def _sigterm_during_generation(root: Path, step: int) -> None:
    """SIGTERM at the first decode step of the ``step``-th generate call (one per GRPO step, evals
    off); count the decode steps that still run after it."""
    from rlcode.rollout.hf_backend import HFGenerateBackend

    HFGenerateBackend.generate, HFGenerateBackend._decode_step = _sigterm_inside(
        HFGenerateBackend.generate, HFGenerateBackend._decode_step, step, root / "decode.json")


def _sigterm_during_update(root: Path, step: int) -> None:
    """SIGTERM in the first micro-batch's forward of the ``step``-th update (one per step: the noisy
    reward gives every group signal); count the micro-batches that still run after it."""
    import rlcode.training.learner as learner
    from rlcode.training import policy_update

    learner.update_policy, policy_update.completion_logps = _sigterm_inside(
        policy_update.update_policy, policy_update.completion_logps, step, root / "update.json")


def _task_ids(run_dir: Path) -> dict[int, list]:
    rows = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    return {step: sorted(str(row["task_id"]) for row in rows if row["step"] == step) for step in range(STEPS)}


def run(root: Path, *extra: str, stop: str = "0") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(Path(__file__)), str(root), stop, *extra], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


MICRO_BATCHES = ["--model.micro_batch_size", "2"]  # 4 micro-batches of the 8 rows: the update can stop between them


@pytest.mark.parametrize("adapter, phase", [("full", "generation"), ("lora", "generation"),
                                            ("full", "update"), ("lora", "update")])
def test_sigterm_mid_step_gives_the_step_up_and_the_resume_is_exact(tmp_path, adapter, phase):
    from rlcode.run_dir import checkpoint_metadata

    extra = [*(LORA if adapter == "lora" else []), *(MICRO_BATCHES if phase == "update" else [])]
    straight = run(tmp_path / "straight", *extra)
    assert straight.returncode == 0, straight.stderr[-3000:]

    stop = f"sigterm@{STOP_AT}" if phase == "generation" else f"sigterm-update@{STOP_AT}"
    stopped = run(tmp_path / "resumed", *extra, stop=stop)
    assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    run_dir = tmp_path / "resumed/tiny/version_0"
    if phase == "generation":  # no decode step ran after the signal's own: the loop ended at the next token
        assert json.loads((tmp_path / "resumed/decode.json").read_text())["after_signal"] == 0
    else:  # no micro-batch after the signal's own: the update stopped before the next one
        assert json.loads((tmp_path / "resumed/update.json").read_text())["after_signal"] == 0
    assert sorted(logged_rewards(run_dir)) == list(range(STOP_AT)), "step 2 left no trace"
    assert checkpoint_metadata(run_dir / "checkpoints/last.ckpt")["global_step"] == STOP_AT
    assert f"stopped by SIGTERM at step {STOP_AT} of {STEPS}" in stopped.stdout, stopped.stdout[-2000:]

    resumed = run(tmp_path / "resumed", *extra, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference = tmp_path / "straight/tiny/version_0"
    assert logged_rewards(run_dir) == logged_rewards(reference), "every step's logged reward, bit for bit"
    assert _task_ids(run_dir) == _task_ids(reference), "each step's prompts: the given-up step's batch is redone"
    ours, theirs = weights(run_dir), weights(reference)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


if __name__ == "__main__":
    root, stop = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)  # the same arithmetic in every run
    root.mkdir(parents=True, exist_ok=True)
    if stop.startswith("sigterm@"):
        _sigterm_during_generation(root, int(stop.removeprefix("sigterm@")))
    elif stop.startswith("sigterm-update@"):
        _sigterm_during_update(root, int(stop.removeprefix("sigterm-update@")))
    from rlcode.cli.command import main

    main(arguments(root, *sys.argv[3:]))
