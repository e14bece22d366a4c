"""Reward functions by name, sharing one sandbox pool for the run.

The pool's workers are long-lived processes: starting them once per run (not per step) is what
makes scoring hundreds of completions a second possible. The caller closes the pool at teardown.
"""

from __future__ import annotations

from typing import Any, Callable


def build_rewards(names: list[str], *, timeout: float, workers: int | None) -> tuple[list[Callable], Any]:
    """(reward callables in ``names`` order, the sandbox pool they share)."""
    from rlcode.rewards import REWARD_FUNCTIONS
    from rlcode.sandbox import SandboxPool

    unknown = [name for name in names if name not in REWARD_FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown reward {unknown[0]!r}: model.rewards takes names from "
                         f"{sorted(REWARD_FUNCTIONS)}")
    pool = SandboxPool(workers=workers, timeout=timeout)
    pool.__enter__()
    try:
        return [REWARD_FUNCTIONS[name](pool=pool, timeout=timeout) for name in names], pool
    except Exception:
        pool.__exit__(None, None, None)
        raise
