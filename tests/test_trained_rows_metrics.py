"""A step's scalars describe what it trained, on hand-made steps: dynamic sampling's kept rows (not
its first round), tokens/s over every round, multi-turn reward per episode (per turn under its own name)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlcode.callbacks.metrics import step_line, step_metrics
from rlcode.rewards.base import Scored, row_metrics
from rlcode.rewards.mixture import RewardOutcome
from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.training.dynamic_sampling import DynamicSampling, with_signal
from rlcode.training.experience import CompletionGroups
from rlcode.training.step_record import StepRecord
from test_dynamic_sampling import _Known  # rewards already computed, as a future holds them

G = 2


def _groups(tag: str, passed: list[bool], tokens: int) -> CompletionGroups:
    """Groups of G rows, each passing (reward 1, status ok) or not (0, timeout), ``tokens`` long each."""
    rewards = [float(p) for p in passed]
    scored = [Scored(r, "passed" if p else "timeout", "ok" if p else "timeout", p) for r, p in zip(rewards, passed)]
    rollout = batch_from_token_lists([[1, 2]] * len(passed), [[7] * tokens] * len(passed), [True] * len(passed),
                                     [f"{tag}{i}" for i in range(len(passed))], pad_token_id=0)
    metrics = {f"mbpp_tests/{k}": v for k, v in row_metrics(scored).items()}
    outcome = RewardOutcome(rewards, {"mbpp_tests": rewards}, ["d"] * len(passed), metrics, 0.1,
                            {"mbpp_tests": scored})
    prompts = [f"{tag}{p}" for p in range(len(passed) // G)]
    return CompletionGroups(rollout, prompts, prompts, G, _Known(outcome))


def _step_record(groups: CompletionGroups, seconds: float) -> StepRecord:
    rewards = groups.rewards("cpu")
    totals = SimpleNamespace(metrics=lambda: {})
    return groups.record(step=0, advantages=rewards * 0, updated=True, loss={}, totals=totals, frac_zero_std=0.0,
                         timings={"step": seconds}, extra_metrics={})


def test_dynamic_sampling_metrics_and_step_line_describe_the_rows_trained():
    first = _groups("a", [True, True, False, False], tokens=3)  # both groups flat: none kept
    extra = _groups("b", [True, False, True, False], tokens=5)  # both with signal: the rows trained
    step = with_signal(first, lambda round_: extra, DynamicSampling(max_extra_rounds=1), pad_token_id=0)
    record = _step_record(step, seconds=2.0)
    metrics = step_metrics(record)
    assert metrics["reward/mbpp_tests"] == 0.5
    assert metrics["reward/mbpp_tests/successful_predictions_count"] == 2.0
    assert metrics["reward/mbpp_tests/status/ok"] == 2.0 and metrics["reward/mbpp_tests/status/timeout"] == 2.0
    assert "passed=50.0% (2/4)" in step_line(record, {"mbpp_tests": ("passed", "")})


def test_dynamic_sampling_tokens_per_second_counts_every_round():
    first = _groups("a", [True, True, False, False], tokens=3)  # 12 tokens generated, none kept
    extra = _groups("b", [True, False, True, False], tokens=5)  # 20 tokens, all kept
    step = with_signal(first, lambda round_: extra, DynamicSampling(max_extra_rounds=1), pad_token_id=0)
    assert step_metrics(_step_record(step, seconds=4.0))["perf/tokens_per_s"] == 8.0  # 32 tokens in 4 s


def test_a_reward_without_per_row_records_reports_no_first_round_metrics():
    first = _groups("a", [True, True, False, False], tokens=3)
    first.job.outcome.scored.clear()
    step = with_signal(first, lambda round_: _groups("b", [True, False, True, False], 5),
                       DynamicSampling(max_extra_rounds=1), pad_token_id=0)
    assert not any(key.startswith("mbpp_tests/") for key in step.outcome.metrics)


def _episodes_record() -> StepRecord:
    """One episode solved at the first attempt, three unsolved after three attempts (10 turns)."""
    episode_of_row = [0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    rewards = [1.0] + [0.0] * 9
    episodes = [{"success": True}] + [{"success": False}] * 3
    return StepRecord(step=1, group_size=1, task_ids=list(range(10)), prompts=["p"] * 10, completions=["c"] * 10,
                      rewards=rewards, rewards_by_function={"return": rewards}, details=[""] * 10,
                      advantages=[0.0] * 10, completion_lengths=[1] * 10, truncated=[False] * 10,
                      frac_reward_zero_std=0.0, updated=True, episodes=episodes, episode_of_row=episode_of_row,
                      timings={"step": 1.0})


def test_multi_turn_reward_is_a_mean_per_episode_with_the_per_turn_mean_kept_apart():
    metrics = step_metrics(_episodes_record())
    assert metrics["reward/avg_batch_reward"] == pytest.approx(0.25)  # the success rate
    assert metrics["reward/avg_turn_reward"] == pytest.approx(0.1)
    assert "reward=0.250" in step_line(_episodes_record())


def test_single_turn_steps_keep_one_mean_and_no_turn_metric():
    record = _episodes_record()
    record.episode_of_row, record.episodes = [], []
    metrics = step_metrics(record)
    assert metrics["reward/avg_batch_reward"] == pytest.approx(0.1)
    assert "reward/avg_turn_reward" not in metrics
