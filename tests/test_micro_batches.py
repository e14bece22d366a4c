"""Micro-batches by rows and by a token budget: the cut, and a step's update unchanged by it."""

from __future__ import annotations

import torch

from grpo_harness import GradientRecorder, assert_same_gradients, build_module, fit_steps
from rlcode.logprobs import sequence_logps
from rlcode.training.micro_batches import micro_batches


def _rows(prompts: list[list[int]], completion_lengths: list[int]):
    width = max(map(len, prompts))
    prompt_ids = torch.zeros(len(prompts), width, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    for row, prompt in enumerate(prompts):
        prompt_ids[row, width - len(prompt):] = torch.tensor(prompt)
        prompt_mask[row, width - len(prompt):] = 1
    completion_mask = (torch.arange(max(completion_lengths)) < torch.tensor(completion_lengths).unsqueeze(1)).long()
    return prompt_ids, prompt_mask, completion_mask


def _cut(rows, batch, **bounds) -> list[list[int]]:
    return [part.tolist() for part in micro_batches(torch.tensor(rows), *batch, **bounds)]


def test_rows_only():
    batch = _rows([[1, 2]] * 5, [1] * 5)
    assert _cut([0, 1, 2, 3, 4], batch, max_rows=2) == [[0, 1], [2, 3], [4]]


def test_a_shared_prompt_counts_once_and_the_budget_holds():
    # two groups of 3 rows on 10-token prompts, completions of 4 tokens: a group is 10 + 3 x 4 = 22 tokens
    a, b = list(range(1, 11)), list(range(11, 21))
    batch = _rows([a, a, a, b, b, b], [4] * 6)
    assert _cut(range(6), batch, max_rows=8, max_tokens=22) == [[0, 1, 2], [3, 4, 5]]
    assert _cut(range(6), batch, max_rows=8, max_tokens=44) == [[0, 1, 2, 3, 4, 5]]
    assert _cut(range(6), batch, max_rows=8, max_tokens=21) == [[0, 1], [2], [3, 4], [5]]  # a prompt again per cut
    assert _cut(range(6), batch, max_rows=2, max_tokens=100) == [[0, 1], [2, 3], [4, 5]]  # both bounds hold


def test_a_row_over_the_budget_runs_alone():
    batch = _rows([[1, 2, 3], [4], [5]], [9, 1, 1])
    assert _cut([0, 1, 2], batch, max_rows=8, max_tokens=4) == [[0], [1, 2]]


def test_the_step_update_is_the_same_under_a_token_budget(monkeypatch):
    """Losses are normalised by the whole step's totals, so how rows are cut does not change the
    gradient (float64); the budget did cut differently (more packed calls)."""
    calls = []
    original = sequence_logps.packed_outputs
    monkeypatch.setattr(sequence_logps, "packed_outputs", lambda *a, **k: calls.append(1) or original(*a, **k))
    updates, counts = {}, {}
    for budget in (None, 12):
        calls.clear()
        recorder = GradientRecorder()
        fit_steps(build_module(micro_batch_size=8, micro_batch_tokens=budget, float64=True), callbacks=[recorder])
        updates[budget], counts[budget] = recorder.updates[0], len(calls)
    assert counts[12] > counts[None] >= 1
    assert_same_gradients(updates[12], updates[None])
