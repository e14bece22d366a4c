"""How the modes feed the curriculum: once per step, where the rewards are awaited, every group scored."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlcode.data.curriculum import Curriculum, CurriculumSettings
from rlcode.modes.curriculum_feed import FeedOnResult, feed, pool_metrics
from rlcode.modes.grpo import extra_round_seed
from rlcode.rewards.mixture import RewardOutcome
from rlcode.training.all_ranks_totals import Ranks
from rlcode.training.experience import CompletionGroups


class _Job:
    def __init__(self):
        self.asked = 0

    def result(self):
        self.asked += 1
        return f"outcome {self.asked}"


def test_the_job_is_asked_once_and_the_feed_runs_once():
    fed, job = [], _Job()
    wrapped = FeedOnResult(job, fed.append)
    assert [wrapped.result(), wrapped.result()] == ["outcome 1", "outcome 1"]
    assert job.asked == 1 and fed == ["outcome 1"]
    # An outcome dynamic sampling awaited already is not asked of the job again.
    known = RewardOutcome([1.0, 0.0], {"r": [1.0, 0.0]}, ["", ""])
    groups = CompletionGroups(None, ["p"], [1], 2, job, known)
    assert groups.rewards("cpu").tolist() == [1.0, 0.0] and job.asked == 1 and groups.outcome is known


class _DataModule:
    def __init__(self, curriculum):
        self.curriculum, self.recorded = curriculum, []

    def record_outcomes(self, draw, task_ids, shares):
        self.recorded.append((draw, task_ids, shares))


def _learner(datamodule):
    return SimpleNamespace(datamodule=lambda: datamodule, ranks=Ranks, device="cpu")


def test_one_rank_feeds_its_pairs_without_the_padding():
    dm = _DataModule(Curriculum(CurriculumSettings(), num_problems=4, seed=0))
    feed(_learner(dm), 7, [602, 601, 603], [0.25, 1.0, float("nan")], capacity=6)
    [(draw, task_ids, shares)] = dm.recorded
    assert (draw, task_ids, shares[:2]) == (7, [602, 601, 603], [0.25, 1.0]) and shares[2] != shares[2]
    with pytest.raises(ValueError, match="exceed the curriculum feed's capacity 2"):
        feed(_learner(dm), 8, [601, 602, 603], [0.0] * 3, capacity=2)


def test_without_a_curriculum_nothing_is_fed_or_measured():
    dm = _DataModule(None)
    feed(_learner(dm), 0, [601], [1.0], capacity=1)
    assert dm.recorded == [] and pool_metrics(_learner(dm), {"position": (0, 0)}) == {}
    assert pool_metrics(_learner(None), {}) == {}


def test_extra_rounds_sample_with_seeds_of_their_own():
    step_seeds = [(0 * 1_000_003 + step) * 1009 + rank for step in range(50) for rank in range(4)]
    seeds = [extra_round_seed(s, r) for s in step_seeds for r in (1, 2, 3)]
    assert len(set(seeds)) == len(seeds) and not set(seeds) & set(step_seeds)
    assert extra_round_seed(5, 1) == extra_round_seed(5, 1)
