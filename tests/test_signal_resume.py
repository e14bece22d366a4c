"""Exact resume with the curriculum and dynamic sampling on: a run SIGKILLed after its step-2
checkpoint and resumed with ``--ckpt_path last`` logs the same rewards, curriculum pools and
dynamic-sampling rounds as an uninterrupted run, and ends with the same weights and curriculum state.

The reward is a coin from python's generator (so about a quarter of the groups of 4 come back flat
and dynamic sampling draws extra rounds, and some problems land in each curriculum bucket): a resume
that lost the curriculum's estimates, the generators' states or the extra rounds' seeds would draw
other prompts or log other rewards. Runs go through ``tests/test_resume_exact.py``'s process driver.
"""

from __future__ import annotations

import csv
import random

import pytest
import torch

from test_resume_exact import KILL_AT, run_in_process, weights

SIGNAL = ["--model.mode.rewards", "['test_signal_resume:coin_reward']", "--data.num_train_tasks", "12",
          "--data.curriculum", "{explore_share: 0.5, stale_after: 3}",
          "--model.mode.dynamic_sampling", "{max_extra_rounds: 2}"]
WATCHED = ("reward/avg_batch_reward", "reward/frac_reward_zero_std", "reward/dynamic_sampling/rounds",
           "reward/dynamic_sampling/prompts", "curriculum/learnable", "curriculum/unseen", "curriculum/too_hard",
           "curriculum/solved", "curriculum/stale")


def coin_reward(prompts, completions, **columns) -> list[float]:
    """1 with probability 0.3, else 0, from python's generator (whose state a checkpoint must carry)."""
    return [float(random.random() < 0.3) for _ in completions]


def logged(run) -> dict[int, tuple]:
    with (run / "metrics.csv").open() as handle:
        return {int(r["step"]): tuple(r.get(k) for k in WATCHED) for r in csv.DictReader(handle)
                if r.get("reward/avg_batch_reward")}


def curriculum_state(run) -> dict:
    checkpoint = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    return checkpoint["MBPPDataModule"]["curriculum"]


@pytest.mark.slow
def test_sigkill_then_resume_with_curriculum_and_dynamic_sampling_matches_an_uninterrupted_run(tmp_path):
    straight = run_in_process(tmp_path / "straight", *SIGNAL)
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = run_in_process(tmp_path / "resumed", *SIGNAL, kill_at=KILL_AT)
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = run_in_process(tmp_path / "resumed", *SIGNAL, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    run, reference = tmp_path / "resumed/tiny/version_0", tmp_path / "straight/tiny/version_0"
    ours, theirs = logged(run), logged(reference)
    assert sorted(theirs) == [0, 1, 2, 3] and ours == theirs, "every step's rewards, pools and rounds, bit for bit"
    rounds = [float(row[2]) for row in theirs.values()]
    assert max(rounds) > 1, f"dynamic sampling never drew an extra round, the test shows nothing: {rounds}"
    state = curriculum_state(reference)
    assert state["estimates"] and curriculum_state(run) == state, "the curriculum's estimates after step 4"
    assert any(0 < share < 1 for _, share in state["estimates"]), "some problem is learnable"
    ours_w, theirs_w = weights(run), weights(reference)
    assert all(torch.equal(ours_w[k], theirs_w[k]) for k in theirs_w), "same parameters at step n"
