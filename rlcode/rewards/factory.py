"""Reward functions by name, sharing one sandbox pool for the run.

A name is a registry entry of ``rlcode.rewards`` ("execution", "mbpp_tests", ...) or, for your own
TRL-style function ``f(prompts, completions, **columns) -> list[float]``, an import path
``package.module:function``. The pool's workers are long-lived processes: starting them once per
run (not per step, not per reward function) is what makes scoring hundreds of completions a second
possible. The caller closes the pool at teardown.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable

from rlcode.errors import SettingError
from rlcode.rewards.registry import REWARDS, build_reward


def check_reward_names(names: list[str]) -> None:
    """A SettingError naming the first reward that is neither a registry name nor an import path."""
    unknown = [name for name in names if name not in REWARDS and ":" not in name]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(REWARDS), n=1)
        raise SettingError(f"unknown reward {unknown[0]!r} in model.mode.init_args.rewards: "
                           + (f"did you mean {close[0]!r}? " if close else "")
                           + f"Use names from {', '.join(REWARDS)} or an import path 'package.module:function'")


def build_rewards(names: list[str], *, timeout: float, pool_factory: Callable[[float], Any],
                  run_id: str | None = None) -> tuple[list[Callable], Any]:
    """(reward callables in ``names`` order, the sandbox pool they share, or None if none needs one).

    ``pool_factory(timeout)`` builds the pool (the module's, with the run's workers and isolation).
    ``run_id`` tags every execution as ``run`` (beside ``step`` and ``task``): ``pool.list`` and
    ``pool.stop`` by run then find this run's programs on a pool several runs share.
    """
    check_reward_names(names)  # before starting any worker process
    imported = {name: _import(name) for name in names if ":" in name}
    pool = None
    if any(name in REWARDS for name in names):
        pool = pool_factory(timeout)
    try:
        return [imported[name] if name in imported else build_reward(name, pool=pool, timeout=timeout, run_id=run_id)
                for name in names], pool
    except Exception:
        if pool is not None:
            pool.close()
        raise


def _import(path: str) -> Callable:
    module_name, _, attribute = path.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"reward {path!r} cannot be imported ({error}): check the module path and name") from None
    if not callable(function):
        raise ValueError(f"reward {path!r} is not callable")
    return function
