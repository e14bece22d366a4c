"""A weighted sum of reward functions, started together so they run while the trainer computes.

Each function follows TRL's convention, ``fn(prompts, completions, **columns) -> list[float]`` with
dataset columns as per-completion lists. Functions that also offer ``start(...) -> job`` (with
``job.result()``) run in the background, e.g. in the sandbox pool, while the trainer computes old
and reference log-probs; plain callables are simply called in ``start``.

No torch here: rewards are plain floats until the trainer turns them into a tensor.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


@dataclass
class RewardOutcome:
    """Rewards of one batch of completions (all lists have one entry per completion)."""

    total: list[float]
    """Weighted sum over the functions that scored the completion (None/NaN counts as missing, as
    TRL's ``nansum``); NaN only when every function returned None."""
    by_function: dict[str, list[float]]
    """Unweighted rewards of each function, keyed by its name."""
    details: list[str]
    """A short verdict per completion (the first function's ``last_details``; empty strings if none)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Function-specific scalars (``last_metrics``), keyed ``<name>/<metric>``."""
    seconds: float = 0.0
    """Wall time from start to the last result (overlaps the trainer's own work)."""
    scored: dict[str, list] = field(default_factory=dict)
    """Per completion, what each sandbox reward made of it (its ``last_scored``: ``rewards.base.Scored``),
    keyed by name: a step that keeps some rows only (dynamic sampling) recomputes ``metrics`` from them."""


def reward_name(function: Callable) -> str:
    """A function's name for logs: its ``name`` attribute, else its class or function name."""
    name = getattr(function, "name", None) or getattr(function, "__name__", None)
    return str(name or type(function).__name__)


class RewardMixture:
    def __init__(self, functions: Sequence[Callable], weights: Sequence[float] | None = None) -> None:
        """Combine reward functions as ``sum_i weight_i * reward_i``.

        Args:
            functions: TRL-style reward callables (optionally with ``start``).
            weights: one weight per function; None = all 1.0.
        """
        if not functions:
            raise ValueError("no reward functions: set model.mode.init_args.rewards to at least one name, e.g. ['execution']")
        weights = list(weights) if weights is not None else [1.0] * len(functions)
        if len(weights) != len(functions):
            raise ValueError(f"{len(weights)} reward weights for {len(functions)} reward functions: "
                             "give model.mode.init_args.reward_weights one number per entry of rewards")
        self.functions = list(functions)
        self.weights = [float(w) for w in weights]
        names = [reward_name(f) for f in functions]
        # two functions of one kind (e.g. the same reward with two timeouts) still need distinct keys
        self.names = [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]

    def start(self, prompts: list[str], completions: list[str], **columns: Any) -> "MixtureJob":
        started = time.perf_counter()
        pending = []
        for function in self.functions:
            if callable(getattr(function, "start", None)):
                pending.append(function.start(prompts, completions, **columns))
            else:
                pending.append(_Done(function(prompts, completions, **columns)))
        return MixtureJob(self, pending, started, len(completions))

    # A resumed run continues the state of reward functions that keep one (a curriculum, a running
    # normaliser): those with state_dict/load_state_dict, keyed by name. The sandbox holds none.
    def state_dict(self) -> dict[str, Any]:
        return {name: function.state_dict() for name, function in zip(self.names, self.functions)
                if callable(getattr(function, "state_dict", None))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, function in zip(self.names, self.functions):
            if name in state and callable(getattr(function, "load_state_dict", None)):
                function.load_state_dict(state[name])


class MixtureJob:
    """Rewards being computed; ``result()`` waits for every function and combines them."""

    def __init__(self, mixture: RewardMixture, pending: list, started: float, count: int) -> None:
        self.mixture, self.pending, self.started, self.count = mixture, pending, started, count

    def result(self) -> RewardOutcome:
        by_function: dict[str, list[float]] = {}
        for name, job in zip(self.mixture.names, self.pending):
            values = [math.nan if v is None else float(v) for v in job.result()]
            if len(values) != self.count:
                raise ValueError(f"reward {name!r} returned {len(values)} values for {self.count} completions")
            by_function[name] = values
        total = [_nansum([w * by_function[n][i] for n, w in zip(self.mixture.names, self.mixture.weights)])
                 for i in range(self.count)]
        first = self.mixture.functions[0]
        details = list(getattr(first, "last_details", None) or [""] * self.count)
        metrics, scored = {}, {}
        for name, function in zip(self.mixture.names, self.mixture.functions):
            for key, value in (getattr(function, "last_metrics", None) or {}).items():
                if isinstance(value, (int, float)):
                    metrics[f"{name}/{key}"] = float(value)
            rows = list(getattr(function, "last_scored", None) or [])
            if len(rows) == self.count:
                scored[name] = rows
        return RewardOutcome(total, by_function, details, metrics, time.perf_counter() - self.started, scored)


def _nansum(values: list[float]) -> float:
    """Sum of the non-NaN values; NaN when all are NaN (the completion is then left out of training)."""
    present = [value for value in values if not math.isnan(value)]
    return sum(present) if present else math.nan


class _Done:
    """A job whose result is already known (a reward function without ``start``)."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def result(self) -> list[float]:
        return self.values
