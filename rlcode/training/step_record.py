"""What one training step did, as plain data: callbacks log, sample and plot from it.

The Learner fills one record per training step, keeps it as ``learner.last_step`` and adds
it to its run history (``rlcode.training.run_history``), which keeps the step's scalars; metrics,
rollout logging, plots and the end-of-run summary read that history, so the training step itself
stays free of logging code.

Under DDP every field is this rank's own (callbacks log rank zero's), except two sums over all ranks
that ``reward_metrics`` gains when there are several: ``avg_batch_reward_all_ranks`` and
``frac_reward_zero_std_all_ranks`` (one small all-reduce per step, which the step needs anyway).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from rlcode.training.device_memory import synchronized


@dataclass
class StepRecord:
    step: int
    """Optimizer steps taken before this batch (``trainer.global_step`` at its start)."""
    group_size: int
    task_ids: list[int]
    """One per prompt."""
    prompts: list[str]
    """Rendered prompt text, one per prompt."""
    completions: list[str]
    """Prompt-major: completions[p * group_size + g] answers prompts[p]."""
    rewards: list[float]
    """Weighted total reward per completion."""
    rewards_by_function: dict[str, list[float]]
    details: list[str]
    """A short verdict per completion (e.g. "passed 2/3", "SyntaxError")."""
    advantages: list[float]
    completion_lengths: list[int]
    truncated: list[bool]
    frac_reward_zero_std: float
    updated: bool
    """False in a dry run (or when every group was filtered out): the weights did not change."""
    loss: dict[str, float] = field(default_factory=dict)
    """Loss and its parts (clip fractions, ratio, KL), averaged over micro-batches and iterations."""
    reward_metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: generation, rewards_wait, logps, update, step."""
    memory: dict[str, float] = field(default_factory=dict)
    """The step's peak accelerator memory in GiB (``device_memory.peak_memory_gib``; empty on a CPU)."""
    episodes: list[dict] = field(default_factory=list)
    """Multi-turn modes: every episode of the step, whole (rollout logs keep games, not rows)."""
    extra_metrics: dict[str, float] = field(default_factory=dict)
    """Mode-specific scalars, logged under their own names (e.g. ``spiral/TicTacToe-v0/...``)."""
    all_rounds_tokens: int | None = None
    """Tokens generated in every round of the step (dynamic sampling draws rounds it does not
    keep); None: the kept rows' ``completion_lengths`` are all it generated."""
    episode_of_row: list[int] = field(default_factory=list)
    """Multi-turn modes: the episode of each row (empty: each row is its own episode)."""
    hardcoded: list[bool] = field(default_factory=list)
    """Per completion: passed every shown MBPP assert and failed a hidden one, by a reward with hidden
    tests (``rewards.base.Scored.hardcoded``); empty when no reward of the step judges it."""

    @property
    def mean_reward(self) -> float:
        """Mean per episode: a failed episode's several turns weigh as one episode, so that one
        solved-at-1 episode among four gives 0.25, as its success rate does."""
        if not self.episode_of_row:
            return self.mean_turn_reward
        by_episode: dict[int, list[float]] = {}
        for episode, reward in zip(self.episode_of_row, self.rewards):
            if reward == reward:  # NaN-free
                by_episode.setdefault(episode, []).append(reward)
        means = [sum(values) / len(values) for values in by_episode.values()]
        return sum(means) / len(means) if means else float("nan")

    @property
    def mean_turn_reward(self) -> float:
        """Mean per row (a turn, or a completion of single-turn modes)."""
        values = [r for r in self.rewards if r == r]  # NaN-free
        return sum(values) / len(values) if values else float("nan")

    @property
    def generated_tokens(self) -> int:
        return sum(self.completion_lengths) if self.all_rounds_tokens is None else self.all_rounds_tokens

    def groups(self) -> list[list[int]]:
        """Completion indices of each prompt's group."""
        g = self.group_size
        return [list(range(p * g, (p + 1) * g)) for p in range(len(self.prompts))]


@contextmanager
def timed(timings: dict[str, float], name: str):
    """Add the block's wall time to ``timings[name]`` (a StepRecord's ``timings``), the device's queued
    work included at both edges (``device_memory.synchronized``: CUDA's kernels run asynchronously)."""
    synchronized()
    started = time.perf_counter()
    try:
        yield
    finally:
        synchronized()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - started
