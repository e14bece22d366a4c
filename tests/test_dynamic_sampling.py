"""Dynamic sampling: flat groups are replaced by groups with signal from further rounds, up to a cap."""

from __future__ import annotations

import pytest
import torch

from rlcode.rewards.mixture import RewardOutcome
from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.training.dynamic_sampling import DynamicSampling, with_signal
from rlcode.training.experience import CompletionGroups

G = 2


class _Known:
    def __init__(self, outcome):
        self.outcome = outcome

    def result(self):
        return self.outcome


def _groups(tag: str, rewards: list[float]) -> CompletionGroups:
    """Groups of G rows whose prompt and completion tokens encode (tag, group, row), with ``rewards``."""
    prompts = [f"{tag}{p}" for p in range(len(rewards) // G)]
    prompt_ids = [[ord(tag), p + 1][: 1 + p % 2 + 1] for p in range(len(prompts)) for _ in range(G)]
    completion_ids = [[10 + i] * (1 + i % 3) for i in range(len(rewards))]
    rollout = batch_from_token_lists(prompt_ids, completion_ids, [i % 2 == 0 for i in range(len(rewards))],
                                     [f"{tag}-{i}" for i in range(len(rewards))], pad_token_id=0)
    outcome = RewardOutcome(list(rewards), {"r": list(rewards)}, [f"d{tag}{i}" for i in range(len(rewards))],
                            {"r/count": 1.0}, 0.5)
    return CompletionGroups(rollout, prompts, [f"{tag}{p}" for p in range(len(prompts))], G, _Known(outcome))


def test_flat_groups_are_replaced_by_groups_with_signal_in_arrival_order():
    first = _groups("a", [1, 1, 0, 1, 0, 0])  # groups: flat, signal, flat
    extra = {1: _groups("b", [0, 0, 1, 0, 1, 1]), 2: _groups("c", [1, 0, 0, 0, 0, 0])}
    asked = []

    def more(round_):
        asked.append(round_)
        return extra[round_]

    step = with_signal(first, more, DynamicSampling(max_extra_rounds=3), pad_token_id=0)
    assert asked == [1, 2]
    assert step.task_ids == ["a1", "b1", "c0"]
    assert step.rollout.completion_texts == ["a-2", "a-3", "b-2", "b-3", "c-0", "c-1"]
    assert step.rewards("cpu").tolist() == [0, 1, 1, 0, 1, 0]
    assert step.outcome.details == ["da2", "da3", "db2", "db3", "dc0", "dc1"]
    assert step.outcome.metrics["dynamic_sampling/rounds"] == 3.0
    assert step.outcome.metrics["dynamic_sampling/prompts"] == 9.0
    # Rows keep their own tokens: every row's unpadded prompt and completion are the source row's.
    source = [(first, 2), (first, 3), (extra[1], 2), (extra[1], 3), (extra[2], 0), (extra[2], 1)]
    for row, (groups, index) in enumerate(source):
        for ids, mask in (("prompt_ids", "prompt_mask"), ("completion_ids", "completion_mask")):
            got = getattr(step.rollout, ids)[row][getattr(step.rollout, mask)[row].bool()]
            want = getattr(groups.rollout, ids)[index][getattr(groups.rollout, mask)[index].bool()]
            assert torch.equal(got, want)
        assert bool(step.rollout.truncated[row]) == bool(groups.rollout.truncated[index])


def test_the_cap_fills_up_with_flat_groups_of_the_first_round():
    first = _groups("a", [1, 1, 0, 1, 0, 0])
    step = with_signal(first, lambda r: _groups("x", [1, 1, 1, 1, 1, 1]), DynamicSampling(max_extra_rounds=2),
                       pad_token_id=0)
    assert step.task_ids == ["a1", "a0", "a2"]
    assert step.outcome.metrics["dynamic_sampling/rounds"] == 3.0
    assert step.outcome.metrics["dynamic_sampling/signal_groups"] == 1.0


def test_a_step_with_signal_everywhere_is_unchanged():
    first = _groups("a", [1, 0, 0, 1])
    step = with_signal(first, lambda r: pytest.fail("no extra round needed"), DynamicSampling(), pad_token_id=0)
    assert step is first
    assert step.outcome.metrics["dynamic_sampling/rounds"] == 1.0


def test_the_setting_is_checked():
    with pytest.raises(ValueError, match="max_extra_rounds"):
        DynamicSampling(max_extra_rounds=0)
