"""Rewards computed in the sandbox: TRL-compatible callables that never raise (no torch here)."""

from rlcode.rewards.base import RewardJob, SandboxReward, Scored
from rlcode.rewards.execution import ExecutionReward
from rlcode.rewards.extraction import code_blocks, completion_text, extract_code
from rlcode.rewards.mbpp_hidden_tests import MBPPHiddenTestsFraction, MBPPHiddenTestsPassed
from rlcode.rewards.mbpp_tests import MBPPTestsFraction, MBPPTestsPassed, entry_point_of
from rlcode.rewards.registry import REWARDS, build_reward

__all__ = ["REWARDS", "ExecutionReward", "MBPPHiddenTestsFraction", "MBPPHiddenTestsPassed",
           "MBPPTestsFraction", "MBPPTestsPassed", "RewardJob",
           "SandboxReward", "Scored", "build_reward", "code_blocks", "completion_text",
           "extract_code", "entry_point_of"]
