"""Where an update asks whether to stop (``policy_update.update_policy``): before each micro-batch of its
first pass, unsharded; only before the first under FSDP; and when the answer is yes, it leaves before
any optimizer step."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from rlcode.algorithms.losses import LossTotals
from rlcode.models import load_model
from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.training import policy_update
from rlcode.training.policy_update import TrainerHooks, UpdateAbandoned, UpdateSettings, update_policy

ROWS = 4  # one row per micro-batch


def _update(give_up, steps: list, num_iterations: int = 2) -> None:
    """One update of 4 one-row micro-batches; ``steps`` gets each optimizer step's ``counted`` flag."""
    torch.manual_seed(0)
    policy = load_model("tiny-random")
    rollout = batch_from_token_lists([[1, 2]] * ROWS, [[3, 4, 5]] * ROWS, [True] * ROWS, ["x"] * ROWS, pad_token_id=0)
    loss_mask = rollout.completion_mask.float()
    hooks = TrainerHooks(backward=lambda loss: loss.backward(), no_sync=nullcontext,
                         step=lambda counted: steps.append(counted), world_size=1, give_up=give_up)
    settings = UpdateSettings(loss_type="dapo", beta=0.0, epsilon_low=0.2, epsilon_high=0.2,
                              importance_sampling_level="token", num_iterations=num_iterations, micro_batch_size=1,
                              share_prefix=False, temperature=1.0, max_completion_length=3)
    update_policy(policy, hooks, settings, rollout, loss_mask, torch.tensor([1.0, -1.0, 0.5, -0.5]), None,
                  torch.arange(ROWS), LossTotals.of(loss_mask))


def test_an_unsharded_update_asks_before_each_micro_batch_of_its_first_pass():
    asked, steps = [], []
    _update(lambda: asked.append(1) or False, steps)
    assert len(asked) == ROWS and steps == [False, True], "4 micro-batches asked once each, then 2 passes"


def test_a_sharded_update_asks_only_before_its_first_micro_batch(monkeypatch):
    monkeypatch.setattr(policy_update, "is_sharded", lambda policy: True)
    monkeypatch.setattr(policy_update, "gathered_for_update", lambda policy: nullcontext())
    monkeypatch.setattr(policy_update, "_sync_sharded_gradients", lambda *args: None)
    asked, steps = [], []
    _update(lambda: asked.append(1) or False, steps)
    assert len(asked) == 1 and steps == [False, True]


def test_a_yes_leaves_before_any_optimizer_step():
    asked, steps = [], []
    with pytest.raises(UpdateAbandoned):
        _update(lambda: asked.append(1) or len(asked) == 3, steps)
    assert len(asked) == 3 and steps == [], "left at the third micro-batch, having run two, stepping nothing"
