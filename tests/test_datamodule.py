"""MBPPDataModule: seeded shuffles, per-rank shards, resumable position, prompt formats."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.pytorch.trainer.states import TrainerFn

from rlcode.data.datamodule import MBPPDataModule, epoch_order, rank_batches
from rlcode.data.prompts import build_prompt, chat_messages, plain_prompt
from mbpp_location import mbpp_file  # noqa: E402

MBPP_PATH = str(mbpp_file())
pytestmark = pytest.mark.skipif(not Path(MBPP_PATH).is_file(), reason="MBPP data not found")


def _module(**kwargs) -> MBPPDataModule:
    dm = MBPPDataModule(source=MBPP_PATH, **kwargs)
    dm.setup("fit")
    return dm


def _take(dm: MBPPDataModule, n: int) -> list[list[int]]:
    """Task ids of the next n batches, advancing the position as training would."""
    ids = []
    for batch in itertools.islice(iter(dm.train_dataloader()), n):
        dm.on_before_batch_transfer(batch, 0)
        ids.append(batch["task_id"])
    return ids


def test_epoch_order_is_seeded_and_differs_between_epochs():
    assert epoch_order(50, seed=1, epoch=0) == epoch_order(50, seed=1, epoch=0)
    assert epoch_order(50, seed=1, epoch=0) != epoch_order(50, seed=1, epoch=1)
    assert epoch_order(50, seed=1, epoch=0) != epoch_order(50, seed=2, epoch=0)
    assert sorted(epoch_order(50, seed=1, epoch=3)) == list(range(50))


def test_ranks_get_disjoint_shards_covering_the_epoch():
    shards = [sum(rank_batches(20, 2, seed=0, epoch=0, rank=r, world_size=2), []) for r in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(20))
    # a last partial batch is dropped so every rank runs the same number of steps
    counts = [len(rank_batches(7, 2, seed=0, epoch=0, rank=r, world_size=2)) for r in range(2)]
    assert counts == [1, 1]


def test_batches_carry_reward_columns():
    dm = _module(num_train_tasks=6, prompts_per_step=3)
    batch = next(iter(dm.train_dataloader()))
    assert len(batch["task_id"]) == len(batch["prompt"]) == len(batch["test_list"]) == 3
    assert all(601 <= t <= 606 for t in batch["task_id"])
    assert all(isinstance(tests, list) and tests[0].startswith("assert") for tests in batch["test_list"])
    assert batch["prompt"][0][0]["role"] == "user"
    assert batch["entry_point"][0] and batch["entry_point"][0] in batch["prompt"][0][0]["content"]


def test_stream_runs_past_an_epoch_with_a_new_order():
    dm = _module(num_train_tasks=4, prompts_per_step=2)
    first, second = _take(dm, 2), _take(dm, 2)
    assert sorted(sum(first, [])) == sorted(sum(second, [])) == [601, 602, 603, 604]
    assert dm.position == {"epoch": 1, "batch": 2}


def test_position_restores_the_same_data_order():
    dm = _module(num_train_tasks=10, prompts_per_step=2, seed=3)
    _take(dm, 3)
    state = dm.state_dict()
    expected = _take(dm, 4)

    resumed = _module(num_train_tasks=10, prompts_per_step=2, seed=3)
    resumed.load_state_dict(state)
    assert _take(resumed, 4) == expected


def test_another_shuffle_is_flagged_when_a_fit_resumes_and_not_when_a_test_restores():
    state = _module(num_train_tasks=10, prompts_per_step=2, seed=3).state_dict()
    with pytest.warns(UserWarning, match="prompt order after resuming"):
        _module(num_train_tasks=10, prompts_per_step=2, seed=4).load_state_dict(state)
    scoring = _module(num_train_tasks=10, prompts_per_step=2, seed=4)
    scoring.trainer = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.TESTING))  # rlcode test --ckpt_path
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scoring.load_state_dict(state)
    assert scoring.position == state["position"]


def test_too_few_tasks_for_a_step_is_a_clear_error():
    with pytest.raises(ValueError, match="prompts_per_step"):
        _module(num_train_tasks=2, prompts_per_step=3)


def test_prompt_formats_show_the_tests():
    from rlcode.data.mbpp import load_mbpp

    task = load_mbpp(MBPP_PATH, split="train")[0]
    message = chat_messages(task)[0]["content"]
    assert message.startswith("You are an expert Python programmer.") and task.test_list[0] in message
    assert message.endswith("Write the function in a ```python block.")
    text = plain_prompt(task)
    assert task.test_list[-1] in text and text.endswith("[BEGIN]\n")
    with pytest.raises(ValueError, match="prompt_format"):
        build_prompt(task, "fancy")


def test_eval_loaders_do_not_move_the_training_stream():
    dm = _module(num_train_tasks=6, prompts_per_step=2, num_eval_tasks=5, eval_batch_size=2)
    before = dict(dm.position)
    batches = list(dm.val_dataloader())
    assert [len(b["task_id"]) for b in batches] == [2, 2, 1]
    assert sorted(i for b in batches for i in b["task_id"]) == [511, 512, 513, 514, 515]  # validation: 511-600
    for batch in batches:
        dm.on_before_batch_transfer(batch, 0)
    assert dm.position == before
    assert all(11 <= i <= 15 for i in next(iter(dm.test_dataloader()))["task_id"])  # test split: 11-510


def test_eval_batches_have_their_own_size_not_the_training_steps():
    """A training step's 2 prompts made `rlcode validate` generate 2 at a time; the batches
    hold prompts of similar length."""
    sized = _module(num_train_tasks=6, prompts_per_step=2, num_eval_tasks=40, eval_batch_size=16)
    assert [len(b["task_id"]) for b in sized.val_dataloader()] == [16, 16, 8]
    assert [len(b["task_id"]) for b in sized.test_dataloader()] == [16, 16, 8]
    auto = _module(num_train_tasks=6, prompts_per_step=2, num_eval_tasks=40)  # no trainer: a CPU
    assert auto.resolved_eval_batch_size() == 16
    batches = list(auto.val_dataloader())
    assert sorted(i for b in batches for i in b["task_id"]) == [t.task_id for t in auto.eval_tasks(40)]
    # Shortest prompts first: a batch of similar lengths is padded little.
    lengths = [len(prompt[0]["content"]) for b in batches for prompt in b["prompt"]]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    with pytest.raises(ValueError, match="data.eval_batch_size=0 is out of range"):
        MBPPDataModule(source=MBPP_PATH, eval_batch_size=0)
