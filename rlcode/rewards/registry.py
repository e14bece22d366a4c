"""Rewards by short name, for configs: ``reward_funcs: [execution, mbpp_tests_fraction]``."""

from __future__ import annotations

from rlcode.rewards.base import SandboxReward
from rlcode.rewards.execution import ExecutionReward
from rlcode.rewards.mbpp_hidden_tests import MBPPHiddenTestsFraction, MBPPHiddenTestsPassed
from rlcode.rewards.mbpp_tests import MBPPTestsFraction, MBPPTestsPassed

REWARDS: dict[str, type[SandboxReward]] = {
    "execution": ExecutionReward,
    "mbpp_tests": MBPPTestsPassed,
    "mbpp_tests_fraction": MBPPTestsFraction,
    "mbpp_hidden_tests": MBPPHiddenTestsPassed,
    "mbpp_hidden_tests_fraction": MBPPHiddenTestsFraction,
}


def build_reward(name: str, **kwargs) -> SandboxReward:
    """Create a reward by its short name; keyword arguments go to its ``__init__`` (pool, timeout...)."""
    try:
        cls = REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}: use one of {', '.join(REWARDS)}") from None
    return cls(**kwargs)
