"""The curriculum under DDP (2 CPU ranks over gloo): every rank folds in every rank's groups in rank
order, so both hold the same estimates, and both draw the same global batch and take their own slice.

With dynamic sampling on and a reward that leaves rank 1's groups all flat, rank 1 runs its extra
rounds while rank 0 does not need them: the ranks feed different numbers of groups, which the
padded gather must still line up. The run is a separate script (Lightning's ddp strategy re-runs the
command line for rank 1): this file run as ``python tests/test_signal_ddp.py OUT_DIR``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STEPS, TASKS = 3, 12


def coin_on_rank_zero(prompts, completions, **columns) -> list[float]:
    """Rank 0: a coin (some groups with signal, some problems solved); rank 1: always 0 (every group flat)."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        return [float(random.random() < 0.5) for _ in completions]
    return [0.0 for _ in completions]


def _run_one_rank(out_dir: Path) -> None:
    import torch

    from rlcode.cli.command import main
    from rlcode.training.learner import Learner

    from rlcode.data.datamodule import MBPPDataModule

    seen: dict = {"task_ids": [], "scored": [], "fed": [], "rounds": []}
    original_step, original_extra, original_record = (Learner.training_step, MBPPDataModule.extra_batch,
                                                      MBPPDataModule.record_outcomes)

    def training_step(self, batch, batch_idx):
        seen["task_ids"].append(list(batch["task_id"]))
        seen["scored"].append(list(batch["task_id"]))
        original_step(self, batch, batch_idx)
        seen["rounds"].append(self.last_step.reward_metrics.get("dynamic_sampling/rounds"))

    def extra_batch(self, *args, **kwargs):
        batch = original_extra(self, *args, **kwargs)
        seen["scored"][-1].extend(batch["task_id"])
        return batch

    def record_outcomes(self, draw, task_ids, shares):
        seen["fed"].append([list(task_ids), list(shares)])
        return original_record(self, draw, task_ids, shares)

    MBPPDataModule.extra_batch, MBPPDataModule.record_outcomes = extra_batch, record_outcomes

    def on_train_end(self):
        curriculum = self.trainer.datamodule.curriculum
        record = {**seen, "curriculum": curriculum.state_dict(), "global_step": self.trainer.global_step}
        (out_dir / f"rank{self.trainer.global_rank}.json").write_text(json.dumps(record))

    Learner.training_step, Learner.on_train_end = training_step, on_train_end
    torch.set_num_threads(1)
    strategy = {"class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": {"process_group_backend": "gloo"}}
    main(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
          "--config", str(REPO / "configs/tiny_grpo.yaml"), "--run.root_dir", str(out_dir / "runs"),
          "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", json.dumps(strategy),
          "--trainer.max_steps", str(STEPS), "--model.mode.rewards", "['test_signal_ddp:coin_on_rank_zero']",
          "--data.num_train_tasks", str(TASKS), "--data.curriculum", "{explore_share: 0.5}",
          "--model.mode.dynamic_sampling", "{max_extra_rounds: 2}", "--model.mode.sandbox.workers", "1",
          "--eval.at_start", "false", "--eval.at_end", "false", "--checkpoint.every_n_train_steps", "0"])


@pytest.mark.slow
def test_both_ranks_hold_the_same_curriculum_after_uneven_dynamic_sampling(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, str(Path(__file__)), str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["global_step"] for r in ranks] == [STEPS, STEPS]
    assert ranks[1]["rounds"] == [3.0] * STEPS, "rank 1's groups are all flat: it runs every extra round"
    assert ranks[0]["curriculum"] == ranks[1]["curriculum"], "every rank folds in every rank's groups"

    # Each rank fed every rank's scored groups (first round and extra rounds), rank 0's first.
    assert ranks[0]["fed"] == ranks[1]["fed"] and len(ranks[0]["fed"]) == STEPS
    for step, (task_ids, shares) in enumerate(ranks[0]["fed"]):
        assert task_ids == ranks[0]["scored"][step] + ranks[1]["scored"][step]
        assert shares[len(ranks[0]["scored"][step]):] == [0.0] * 6, "rank 1: 2 prompts x 3 rounds, never a success"
    steps = [set(a) | set(b) for a, b in zip(ranks[0]["task_ids"], ranks[1]["task_ids"])]
    assert all(len(s) == 4 for s in steps), f"the ranks' slices of one draw never overlap: {steps}"


if __name__ == "__main__":
    _run_one_rank(Path(sys.argv[1]))
