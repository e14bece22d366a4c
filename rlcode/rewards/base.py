"""What every sandbox-backed reward shares: TRL's calling convention, a lazily created pool,
execution tags, non-blocking jobs, and the rule that a reward never raises.

TRL calls ``reward(prompts=..., completions=..., **columns)`` where each dataset column (and
``completion_ids``, ``trainer_state``) arrives as a list with one entry per completion.
``start(...)`` submits one sandbox execution per completion and returns at once, so a trainer can
compute something else while the pool works; ``__call__`` is ``start(...).result()``.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import NamedTuple

from rlcode.sandbox import SandboxPool


class Scored(NamedTuple):
    """One completion's reward and what to log about it."""

    reward: float
    detail: str  # short verdict, e.g. "passed", "syntax_error", "assert 1 failed: got 3, expected 4"
    status: str  # the execution status ("ok", "timeout", ..., "internal_error")
    success: bool  # counted in successful_predictions_count
    # Passed every visible test but failed a hidden one (mbpp_hidden_tests); None for rewards that
    # have no hidden tests to tell: their rows add no ``hardcoded_share`` metric.
    hardcoded: bool | None = None


class RewardJob:
    """Rewards being computed. ``result()`` blocks until every completion is scored."""

    def __init__(self, reward: "SandboxReward", futures: list[Future | None], errors: list[str]):
        self._reward, self._futures, self._errors = reward, futures, errors
        self._scores: list[float] | None = None
        self._lock = threading.Lock()

    def done(self) -> bool:
        return all(f is None or f.done() for f in self._futures)

    def result(self) -> list[float]:
        with self._lock:
            if self._scores is None:
                self._scores = self._collect()
            return list(self._scores)

    def _collect(self) -> list[float]:
        reward = self._reward
        scored: list[Scored] = []
        for future, error in zip(self._futures, self._errors):
            try:
                if future is None:
                    raise RuntimeError(error)
                item = reward._score(future.result())
                if not isinstance(item.reward, float) or math.isnan(item.reward):
                    raise ValueError(f"reward {item.reward!r} is not a float")
            except Exception as e:  # never raise into the trainer: lowest reward, counted
                item = Scored(reward.lowest, f"internal_error: {e}"[:120], "internal_error", False)
            scored.append(item)
        reward.last_details = [item.detail for item in scored]
        reward.last_scored = scored  # per row: a step keeping some rows only recomputes its metrics
        reward.last_metrics = row_metrics(scored)
        return [item.reward for item in scored]


class SandboxReward:
    """Base class: subclasses define ``_submit`` (one completion -> a Future) and ``_score``."""

    name = "sandbox_reward"
    lowest = 0.0  # the reward for anything that went wrong
    # What ``successful_predictions_count`` counts, for people: a short label (step line, progress
    # bar) and its meaning (the end-of-run summary).
    success_label = "succeeded"
    success_meaning = "completions this reward counted as successful"

    def __init__(self, pool=None, timeout: float = 10.0, workers: int | None = None,
                 tags: Mapping[str, str] | None = None, run_id: str | None = None):
        """
        Args:
            pool: a ``SandboxPool`` to share; by default the reward creates its own on first use.
            timeout: seconds per execution (also the default of a pool the reward creates).
            workers: workers of a pool the reward creates (default: one per core).
            tags: tags added to every execution (e.g. ``{"model": "smollm2"}``).
            run_id: tagged as ``run`` on every execution; a trainer's global step is tagged as
                ``step`` and a ``task_id`` column as ``task``.
        """
        self.__name__ = self.name  # TRL logs rewards under their __name__
        self.timeout, self.workers = timeout, workers
        self.tags = dict(tags or {})
        self.run_id = run_id
        self._pool, self._owns_pool = pool, pool is None
        self._pool_lock = threading.Lock()
        self.last_details: list[str] = []
        self.last_metrics: dict[str, float] = {}
        self.last_scored: list[Scored] = []

    @property
    def pool(self):
        with self._pool_lock:
            if self._pool is None:
                self._pool = SandboxPool(workers=self.workers, timeout=self.timeout)
            return self._pool

    def close(self) -> None:
        """Stop the pool if this reward created it."""
        with self._pool_lock:
            if self._owns_pool and self._pool is not None:
                self._pool.close()
                self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __call__(self, prompts=None, completions=None, **kwargs) -> list[float]:
        return self.start(prompts, completions, **kwargs).result()

    def start(self, prompts=None, completions=None, **kwargs) -> RewardJob:
        """Submit one execution per completion and return without waiting."""
        completions = list(completions or [])
        futures: list[Future | None] = []
        errors: list[str] = []
        step = _global_step(kwargs)
        for index, completion in enumerate(completions):
            try:
                row = _row(kwargs, index, len(completions))
                tags = self._tags(row, step)
                futures.append(self._submit(completion, row, tags))
                errors.append("")
            except Exception as e:  # a bad row or a broken pool: this completion gets the lowest
                futures.append(None)
                errors.append(f"{type(e).__name__}: {e}")
        return RewardJob(self, futures, errors)

    # -- for subclasses -----------------------------------------------------------------------------
    def _submit(self, completion, row: dict, tags: dict[str, str]) -> Future:
        raise NotImplementedError

    def _score(self, outcome) -> Scored:
        """Score one finished Future's result."""
        raise NotImplementedError

    def _tags(self, row: dict, step) -> dict[str, str]:
        tags = dict(self.tags)
        if self.run_id:
            tags["run"] = str(self.run_id)
        if step is not None:
            tags["step"] = str(step)
        if row.get("task_id") is not None:
            tags["task"] = str(row["task_id"])
        return tags


def row_metrics(scored: list[Scored]) -> dict[str, float]:
    """A reward's ``last_metrics`` over these rows: mean, std, status counts, successes."""
    n = len(scored)
    rewards = [item.reward for item in scored]
    mean = sum(rewards) / n if n else 0.0
    statuses = Counter(item.status for item in scored)
    metrics = {
        "mean": mean,
        "std": math.sqrt(sum((r - mean) ** 2 for r in rewards) / n) if n else 0.0,
        "count": float(n),
        "internal_errors": float(statuses["internal_error"] + statuses["cancelled"]),
        "successful_predictions_count": float(sum(item.success for item in scored)),
    }
    metrics.update({f"status/{name}": float(count) for name, count in sorted(statuses.items())})
    judged = [item.hardcoded for item in scored if item.hardcoded is not None]
    if judged:  # among every row, so it reads as the step's share of special-casing programs
        metrics["hardcoded_share"] = sum(judged) / n
    return metrics


def _row(kwargs: dict, index: int, count: int) -> dict:
    """This completion's dataset columns: per-completion lists are indexed, scalars broadcast."""
    row = {}
    for key, value in kwargs.items():
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == count:
            row[key] = value[index]
        else:
            row[key] = value
    return row


def _global_step(kwargs: dict):
    step = getattr(kwargs.get("trainer_state"), "global_step", None)
    if step is None and isinstance(kwargs.get("step"), (int, str)):
        step = kwargs["step"]
    return step
