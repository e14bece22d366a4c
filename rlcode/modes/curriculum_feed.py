"""Feeding the DataModule's curriculum (``rlcode.data.curriculum``) from the groups a step scored.

Every rank must hold the same estimates, so each rank's (task id, success share) pairs are gathered
over the ranks in rank order and every rank folds in all of them. The gather needs one shape on
every rank: pairs are padded to ``capacity`` (a bound every rank knows: its prompts per step, times
the generation rounds dynamic sampling may run) with NaN task ids, dropped after the gather.

A no-op (and no collective) without a curriculum: every rank has the same data settings, so either
all ranks gather or none does.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rlcode.data.curriculum import Curriculum
from rlcode.training.mode import LearnerView


def curriculum_of(learner: LearnerView) -> Curriculum | None:
    datamodule = learner.datamodule()
    return getattr(datamodule, "curriculum", None) if datamodule is not None else None


def pool_metrics(learner: LearnerView, batch) -> dict[str, float]:
    """``curriculum/<bucket>``: the pool sizes this step's prompts were drawn from ({} without a curriculum)."""
    curriculum = curriculum_of(learner)
    return curriculum.metrics(curriculum_draw(batch)) if curriculum is not None else {}


def curriculum_draw(batch) -> int:
    """The draw index of a curriculum batch (its stream position)."""
    return int(batch["position"][1])


def feed(learner: LearnerView, draw: int, task_ids: list[Any], shares: list[float], capacity: int) -> None:
    """Gather every rank's (task id, success share) pairs in rank order and record them in the curriculum."""
    if curriculum_of(learner) is None:
        return
    if len(task_ids) > capacity:
        raise ValueError(f"{len(task_ids)} scored groups exceed the curriculum feed's capacity {capacity}")
    # float64 holds MBPP's integer task ids exactly; NaN marks padding
    local = torch.full((capacity, 2), math.nan, dtype=torch.float64)
    for row, (task_id, share) in enumerate(zip(task_ids, shares)):
        local[row, 0], local[row, 1] = float(int(task_id)), float(share)
    gathered = learner.ranks().gather(local.to(learner.device)).reshape(-1, 2).cpu().tolist()
    pairs = [(int(task_id), share) for task_id, share in gathered if not math.isnan(task_id)]
    learner.datamodule().record_outcomes(draw, [t for t, _ in pairs], [s for _, s in pairs])


class FeedOnResult:
    """A reward job that, once its outcome is known, feeds the curriculum (``on_outcome``) exactly once.

    It sits where the Learner already waits for the rewards (after the reference log-probs), so the
    curriculum adds no wait of its own.
    """

    def __init__(self, job, on_outcome) -> None:
        self.job, self.outcome, self.on_outcome, self.fed = job, None, on_outcome, False

    def result(self):
        if self.outcome is None:
            self.outcome = self.job.result()
        if not self.fed:
            self.fed = True
            self.on_outcome(self.outcome)
        return self.outcome
