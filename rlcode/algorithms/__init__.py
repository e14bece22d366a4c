"""RL algorithms: group-relative advantages and the GRPO-family policy loss.

Importing this package loads no torch: the functions import it when called, so light commands
can depend on the names.
"""

from rlcode.algorithms.advantages import AdvantageStats, group_advantages, zero_std_group_mask
from rlcode.algorithms.losses import LossParts, mask_truncated, per_token_logps, policy_loss

__all__ = [
    "AdvantageStats",
    "LossParts",
    "group_advantages",
    "mask_truncated",
    "per_token_logps",
    "policy_loss",
    "zero_std_group_mask",
]
