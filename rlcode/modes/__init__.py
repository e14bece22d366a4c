"""Training modes: what the policy plays, how it is scored and evaluated, and its advantage
estimator. The contract is ``rlcode.training.mode.Mode``; a config names one as
``model.mode.class_path`` (``rlcode.modes.SPIRAL``, ...), with its settings under ``init_args``.
"""

from rlcode.modes.code_game import CodeGame
from rlcode.modes.grpo import GRPO
from rlcode.modes.multistep import MultiStepMBPP
from rlcode.modes.spiral import SPIRAL

__all__ = ["GRPO", "SPIRAL", "MultiStepMBPP", "CodeGame"]
