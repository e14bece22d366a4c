"""What a training step learns from: the rows to train (a ``RolloutBatch``), their rewards, and the
step's record for the callbacks.

Training modes differ here (``Mode.collect``) and in their advantage estimator: single-turn GRPO samples G completions per
prompt and scores them in the sandbox (``CompletionGroups``); multi-turn modes play episodes and
train on each model turn with its player's return (``rlcode.training.turn_samples.EpisodeTurns``). The
loss, the update and the callbacks see the same shapes either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from rlcode.training.step_record import StepRecord

if TYPE_CHECKING:
    from torch import Tensor

    from rlcode.training.all_ranks_totals import AllRanksTotals
    from rlcode.rewards.mixture import MixtureJob, RewardOutcome
    from rlcode.rollout.base import RolloutBatch


class Experience(Protocol):
    rollout: RolloutBatch
    """[N] trainable rows: context tokens, the model's own sampled tokens."""

    def rewards(self, device) -> Tensor:
        """[N] float32 rewards (NaN: unscored), waiting for any still being computed."""
        ...

    def record(self, *, step: int, advantages: Tensor, updated: bool, loss: dict[str, float],
               totals: AllRanksTotals, frac_zero_std: float, timings: dict[str, float],
               extra_metrics: dict[str, float]) -> StepRecord:
        """The step as plain data, for metrics, rollout logs and plots."""
        ...


def repeat_each(values: list, times: int) -> list:
    """[a, b] -> [a, a, b, b] for times=2: one entry per completion, prompt-major."""
    return [value for value in values for _ in range(times)]


@dataclass
class CompletionGroups:
    """G completions of each prompt, rewarded by functions running (in the sandbox) since ``start``."""

    rollout: RolloutBatch
    prompts: list[str]
    task_ids: list[Any]
    group_size: int
    job: MixtureJob | None
    """The rewards being computed (None: ``outcome`` was known when the groups were made)."""
    outcome: RewardOutcome | None = None
    generated_tokens: int | None = None
    """Tokens generated for the step, every round's (dynamic sampling); None: the rollout's own."""

    def rewards(self, device) -> Tensor:
        if self.outcome is None:  # known already when dynamic sampling awaited it: a job is asked once
            self.outcome = self.job.result()
        return torch.tensor(self.outcome.total, dtype=torch.float32, device=device)

    def record(self, *, step, advantages, updated, loss, totals, frac_zero_std, timings, extra_metrics) -> StepRecord:
        outcome, rollout = self.outcome, self.rollout
        timings["rewards"] = outcome.seconds
        return StepRecord(
            step=step, group_size=self.group_size, task_ids=list(self.task_ids), prompts=self.prompts,
            completions=list(rollout.completion_texts), rewards=outcome.total,
            rewards_by_function=outcome.by_function, details=outcome.details, advantages=advantages.tolist(),
            completion_lengths=rollout.completion_mask.sum(1).long().tolist(), truncated=rollout.truncated.tolist(),
            frac_reward_zero_std=frac_zero_std, updated=updated, loss=loss,
            reward_metrics={**outcome.metrics, **totals.metrics()}, timings=timings, extra_metrics=extra_metrics,
            all_rounds_tokens=self.generated_tokens, hardcoded=hardcoded_rows(outcome.scored))


def hardcoded_rows(scored: dict[str, list]) -> list[bool]:
    """Per row: some reward with hidden tests flagged it ``hardcoded``; empty when none judges it."""
    judging = [rows for rows in scored.values() if any(getattr(row, "hardcoded", None) is not None for row in rows)]
    if not judging:
        return []
    return [any(bool(rows[i].hardcoded) for rows in judging) for i in range(len(judging[0]))]
