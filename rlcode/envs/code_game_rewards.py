"""The code game's rewards: what the writer and each prediction earn for one program.

Two writer rewards (``writer_reward``):

- ``zero_sum``: the game as first stated: the writer earns +1 for each wrong prediction and -1 for
  each right one, averaged over the program's predictions (1 - 2 x success); a prediction earns the
  opposite. It pays the writer most for programs nobody predicts, which is also what an impossible
  program earns: with a predictor that never succeeds, every valid program is worth the maximum.
- ``learnability`` (Absolute Zero, arXiv 2505.03335): the predictor answers each valid program K
  times; with success share s, the writer earns 1 - s when 0 < s < 1 and 0 otherwise. A program
  every prediction gets right teaches nothing, and so does one no prediction gets right (too hard,
  or unpredictable by reading): the writer is paid for programs at the edge of the predictor's
  ability, the harder the better. A prediction earns 1 when right and 0 when wrong.

An invalid program earns the writer ``invalid_program_penalty`` under both, and has no predictions.
"""

from __future__ import annotations

from typing import Literal

WriterReward = Literal["zero_sum", "learnability"]
WRITER_REWARDS = ("zero_sum", "learnability")


def writer_return(kind: WriterReward, correct: list[bool] | None, invalid_program_penalty: float = -1.0) -> float:
    """The writer's return for one program: ``correct`` holds each prediction's verdict (None: the
    program was invalid)."""
    if correct is None:
        return invalid_program_penalty
    if not correct:
        raise ValueError("a valid program needs at least one prediction")
    success = sum(correct) / len(correct)
    if kind == "zero_sum":
        return 1.0 - 2.0 * success
    if kind == "learnability":
        return 1.0 - success if 0.0 < success < 1.0 else 0.0
    raise ValueError(f"unknown writer_reward {kind!r}: use one of {', '.join(WRITER_REWARDS)}")


def prediction_return(kind: WriterReward, correct: bool) -> float:
    """One prediction's return: +1/-1 under ``zero_sum``, 1/0 under ``learnability``."""
    if kind == "zero_sum":
        return 1.0 if correct else -1.0
    if kind == "learnability":
        return 1.0 if correct else 0.0
    raise ValueError(f"unknown writer_reward {kind!r}: use one of {', '.join(WRITER_REWARDS)}")
