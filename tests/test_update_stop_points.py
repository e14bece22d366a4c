"""Where an update asks whether to stop (``policy_update.update_policy``): before each micro-batch of its
first pass, as often on every rank (the least micro-batch count over the ranks); under FSDP every rank
runs as many passes as the rank with the most, zero-weighted ones changing nothing; and when the answer
is yes, it leaves before any optimizer step."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from rlcode.algorithms.losses import LossTotals
from rlcode.models import load_model
from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.training import policy_update
from rlcode.stopping import Stopped
from rlcode.training.policy_update import TrainerHooks, UpdateSettings, update_policy

ROWS = 4  # one row per micro-batch


def _update(stop_agreed, steps: list, num_iterations: int = 2, count_range=lambda count: (count, count),
            backward=lambda loss: loss.backward()):
    """One update of 4 one-row micro-batches; ``steps`` gets each optimizer step's ``counted`` flag.
    Returns the policy with the update's gradients (``steps`` does not zero them)."""
    torch.manual_seed(0)
    policy = load_model("tiny-random").double()
    rollout = batch_from_token_lists([[1, 2]] * ROWS, [[3, 4, 5]] * ROWS, [True] * ROWS, ["x"] * ROWS, pad_token_id=0)
    loss_mask = rollout.completion_mask.float()
    hooks = TrainerHooks(backward=backward, no_sync=nullcontext, step=lambda counted: steps.append(counted),
                         world_size=1, stop_agreed=stop_agreed, count_range=count_range)
    settings = UpdateSettings(loss_type="dapo", beta=0.0, epsilon_low=0.2, epsilon_high=0.2,
                              importance_sampling_level="token", num_iterations=num_iterations, micro_batch_size=1,
                              share_prefix=False, temperature=1.0, max_new_tokens=3)
    update_policy(policy, hooks, settings, rollout, loss_mask, torch.tensor([1.0, -1.0, 0.5, -0.5]), None,
                  torch.arange(ROWS), LossTotals.of(loss_mask))
    return policy


def test_an_unsharded_update_asks_before_each_micro_batch_of_its_first_pass():
    asked, steps = [], []
    _update(lambda: asked.append(1) or False, steps)
    assert len(asked) == ROWS and steps == [False, True], "4 micro-batches asked once each, then 2 passes"


def test_every_rank_asks_as_often_as_the_rank_with_the_fewest_micro_batches():
    asked, steps = [], []
    _update(lambda: asked.append(1) or False, steps, count_range=lambda count: (2, count))
    assert len(asked) == 2 and steps == [False, True], "another rank has 2 micro-batches: asked before 2"


def test_a_sharded_rank_runs_the_largest_pass_count_with_zero_weighted_passes(monkeypatch):
    losses: list[torch.Tensor] = []

    def backward(loss):
        losses.append(loss.detach())
        loss.backward()
    plain = _update(lambda: False, [])
    monkeypatch.setattr(policy_update, "is_sharded", lambda policy: True)
    padded = _update(lambda: False, [], count_range=lambda count: (count, count + 3), backward=backward)
    assert len(losses) == 2 * (ROWS + 3), "each of 2 iterations: 4 micro-batches and 3 passes for the largest rank"
    assert all(float(loss) == 0.0 for loss in losses[ROWS:ROWS + 3] + losses[-3:]), "the added passes weigh 0"
    for (name, a), b in zip(plain.named_parameters(), padded.parameters()):
        assert torch.equal(a.grad, b.grad), f"{name}: a zero-weighted pass changed the gradient"


def test_a_yes_leaves_before_any_optimizer_step():
    asked, steps = [], []
    with pytest.raises(Stopped):
        _update(lambda: asked.append(1) or len(asked) == 3, steps)
    assert len(asked) == 3 and steps == [], "left at the third micro-batch, having run two, stepping nothing"
