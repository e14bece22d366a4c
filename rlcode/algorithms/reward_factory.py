"""Reward functions by name, sharing one sandbox pool for the run.

The pool's workers are long-lived processes: starting them once per run (not per step, not per
reward function) is what makes scoring hundreds of completions a second possible. The caller
closes the pool at teardown.
"""

from __future__ import annotations

from typing import Any, Callable


def build_rewards(names: list[str], *, timeout: float, workers: int | None) -> tuple[list[Callable], Any]:
    """(reward callables in ``names`` order, the sandbox pool they share)."""
    from rlcode.rewards import REWARDS, build_reward
    from rlcode.sandbox import SandboxPool

    unknown = [name for name in names if name not in REWARDS]
    if unknown:  # before starting any worker process
        raise ValueError(f"unknown reward {unknown[0]!r} in model.rewards: use names from {', '.join(REWARDS)}")
    pool = SandboxPool(workers=workers, timeout=timeout)
    try:
        return [build_reward(name, pool=pool, timeout=timeout) for name in names], pool
    except Exception:
        pool.close()
        raise
