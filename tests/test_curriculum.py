"""The online difficulty curriculum: its sampling rule on synthetic success histories, its estimates,
and the DataModule stream drawing through it (resume, ranks)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.pytorch.trainer.states import TrainerFn

from rlcode.data.curriculum import Curriculum, CurriculumSettings, success_shares
from rlcode.data.datamodule import MBPPDataModule
from mbpp_location import mbpp_file  # noqa: E402

MBPP_PATH = str(mbpp_file())


def _curriculum(num_problems=12, **settings) -> Curriculum:
    return Curriculum(CurriculumSettings(**settings), num_problems, seed=0)


def test_first_observation_sets_the_estimate_then_it_moves_by_the_decay():
    c = _curriculum(decay=0.5)
    c.observe(0, [3], [0.0])
    assert c.estimates[3] == 0.0
    c.observe(1, [3], [1.0])
    assert c.estimates[3] == 0.5  # 0.5 * 0 + 0.5 * 1
    c.observe(2, [3], [float("nan")])  # an unscored group changes nothing
    assert c.estimates[3] == 0.5 and c.last_seen[3] == 1


def test_buckets_follow_the_estimates_and_go_stale():
    c = _curriculum(num_problems=5, stale_after=10)
    c.observe(0, [0, 1, 2], [0.0, 1.0, 0.25])
    assert [c.bucket(p, step=5) for p in range(5)] == ["too_hard", "solved", "learnable", "unseen", "unseen"]
    assert c.bucket(0, step=10) == "stale"  # 10 steps after it was scored
    assert c.metrics(5) == {"curriculum/learnable": 1.0, "curriculum/unseen": 2.0, "curriculum/stale": 0.0,
                            "curriculum/too_hard": 1.0, "curriculum/solved": 1.0}


def test_a_draw_takes_the_exploration_share_from_unseen_and_the_rest_from_learnable():
    c = _curriculum(num_problems=20, explore_share=0.25)
    learnable, too_hard = list(range(10)), list(range(10, 16))  # 16-19 stay unseen
    c.observe(0, learnable + too_hard, [0.5] * 10 + [0.0] * 6)
    for step in range(1, 30):
        drawn = c.draw(step, 8)
        assert len(set(drawn)) == 8
        assert sum(p >= 16 for p in drawn) == 2  # round(0.25 * 8) explored
        assert sum(p in learnable for p in drawn) == 6
        assert not set(drawn) & set(too_hard)


def test_short_pools_are_filled_from_exploration_then_from_every_problem():
    c = _curriculum(num_problems=6, explore_share=0.0)
    c.observe(0, [0, 1, 2, 3], [0.5, 0.0, 1.0, 1.0])  # one learnable, two unseen (4, 5)
    drawn = c.draw(1, 4)
    assert drawn[0] == 0 and set(drawn[1:3]) == {4, 5}  # learnable, then the unseen
    assert drawn[3] in (1, 2, 3)  # then anything not drawn yet
    assert len(set(c.draw(2, 6))) == 6


def test_a_draw_avoids_the_problems_already_drawn_while_others_are_left():
    c = _curriculum(num_problems=6, explore_share=0.5)
    c.observe(0, [0, 1], [0.5, 0.5])  # learnable 0, 1; unseen 2-5
    for step in range(1, 20):
        drawn = c.draw(step, 2, salt="-extra", avoid=frozenset({0, 2, 3}))
        assert set(drawn) <= {1, 4, 5} and 1 in drawn, "the learnable one left, and one unseen not avoided"
    assert len(set(c.draw(1, 6, avoid=frozenset({0, 2, 3})))) == 6, "avoided problems fill a draw that needs them"


def test_draws_are_seeded_by_step_and_survive_a_state_round_trip():
    c = _curriculum(num_problems=30)
    c.observe(0, list(range(20)), [i / 20 for i in range(20)])
    again = _curriculum(num_problems=30)
    again.load_state_dict(c.state_dict())
    assert [c.draw(s, 6) for s in range(1, 6)] == [again.draw(s, 6) for s in range(1, 6)]
    assert c.draw(1, 6) != c.draw(2, 6)


def test_on_a_synthetic_policy_the_curriculum_spends_its_draws_where_success_is_mixed():
    # True success rates: a third never solved, a third always, a third half the time. Each draw's
    # groups report their problem's true rate. Once every problem has been scored (and none is stale),
    # the explore pool is empty and the rule leaves only learnable problems: every later draw is
    # entirely the mixed third, where a uniform draw would hit it a third of the time.
    rates = [0.0] * 10 + [1.0] * 10 + [0.5] * 10
    c = _curriculum(num_problems=30, explore_share=0.25, stale_after=1000)
    for step in range(40):
        drawn = c.draw(step, 6)
        c.observe(step, drawn, [rates[p] for p in drawn])
        if len(c.estimates) == 30:
            break
    else:
        pytest.fail("exploration never covered every problem")
    for later in range(step + 1, step + 20):
        drawn = c.draw(later, 6)
        assert all(rates[p] == 0.5 for p in drawn)
        c.observe(later, drawn, [rates[p] for p in drawn])


def test_success_shares_per_group():
    assert success_shares([1.0, 0.0, 1.0, 1.0], 2, 1.0) == [0.5, 1.0]
    assert math.isnan(success_shares([0.9, float("nan")], 2, 0.5)[0])  # a group not wholly scored


def test_settings_are_checked():
    with pytest.raises(ValueError, match="explore_share"):
        CurriculumSettings(explore_share=1.5)
    with pytest.raises(ValueError, match="decay"):
        CurriculumSettings(decay=1.0)


# ---- through the DataModule -------------------------------------------------------------------
needs_mbpp = pytest.mark.skipif(not Path(MBPP_PATH).is_file(), reason="MBPP data not found")


def _module(rank=0, world_size=1, **kwargs) -> MBPPDataModule:
    dm = MBPPDataModule(source=MBPP_PATH, num_train_tasks=16, prompts_per_step=2,
                        curriculum=CurriculumSettings(explore_share=0.5), **kwargs)
    dm.trainer = SimpleNamespace(global_rank=rank, world_size=world_size, state=SimpleNamespace(fn=TrainerFn.FITTING))
    dm.setup("fit")
    return dm


def _steps(dm: MBPPDataModule, n: int, outcome) -> list[list[int]]:
    """Task ids of n steps, each fed back as a step would (outcome: task id -> success share)."""
    ids = []
    stream = iter(dm.train_dataloader())
    for _ in range(n):
        batch = dm.on_before_batch_transfer(next(stream), 0)
        ids.append(batch["task_id"])
        dm.record_outcomes(batch["position"][1], batch["task_id"], [outcome(t) for t in batch["task_id"]])
    return ids


@needs_mbpp
def test_the_stream_draws_from_the_curriculum_and_resumes_exactly():
    outcome = lambda task_id: [0.0, 0.5, 1.0][task_id % 3]  # noqa: E731
    dm = _module()
    _steps(dm, 5, outcome)
    state = dm.state_dict()
    expected = _steps(dm, 6, outcome)

    resumed = _module()
    resumed.load_state_dict(state)
    assert _steps(resumed, 6, outcome) == expected
    # And the curriculum did steer: after the first steps, mostly the mixed problems.
    mixed = sum(t % 3 == 1 for ids in expected for t in ids)
    assert mixed >= len(expected)  # at least half of 2 prompts per step (explore_share 0.5)


@needs_mbpp
def test_ranks_fed_the_same_outcomes_draw_disjoint_halves_of_one_batch():
    ranks = [_module(rank=r, world_size=2) for r in range(2)]
    streams = [iter(dm.train_dataloader()) for dm in ranks]
    for _ in range(4):
        batches = [dm.on_before_batch_transfer(next(s), 0) for dm, s in zip(ranks, streams)]
        assert not set(batches[0]["task_id"]) & set(batches[1]["task_id"])
        everyone = batches[0]["task_id"] + batches[1]["task_id"]  # all ranks' groups, in rank order
        for dm in ranks:
            dm.record_outcomes(batches[0]["position"][1], everyone, [0.5] * len(everyone))
    assert ranks[0].curriculum.state_dict() == ranks[1].curriculum.state_dict()
    assert list(itertools.islice(ranks[0].curriculum.estimates, 3))


@needs_mbpp
def test_extra_batches_are_a_function_of_the_step_and_round_and_leave_the_stream_alone():
    for curriculum in (True, False):
        dm = _module() if curriculum else MBPPDataModule(source=MBPP_PATH, num_train_tasks=16, prompts_per_step=2)
        dm.setup("fit")
        position = dict(dm.position)
        first = dm.extra_batch(3, 1)["task_id"]
        assert dm.extra_batch(3, 1)["task_id"] == first and len(set(first)) == 2
        assert [dm.extra_batch(3, r)["task_id"] for r in (2, 3, 4)] != [first] * 3
        assert dm.position == position and "position" not in dm.extra_batch(3, 1)
        others = [dm.train_tasks[i].task_id for i in range(14)]  # all but two of the 16 already drawn
        for round_ in (1, 2, 3):
            assert set(dm.extra_batch(3, round_, drawn=others)["task_id"]) == \
                {dm.train_tasks[14].task_id, dm.train_tasks[15].task_id}
        assert len(set(dm.extra_batch(3, 1, drawn=[t.task_id for t in dm.train_tasks])["task_id"])) == 2
