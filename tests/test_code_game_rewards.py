"""The code game's writer rewards on hand-made outcomes: all right, all wrong, mixed, invalid."""

from __future__ import annotations

import pytest

from rlcode.envs.code_game_rewards import prediction_return, writer_return


@pytest.mark.parametrize("correct, zero_sum, learnability", [
    ([True, True, True, True], -1.0, 0.0),  # every prediction right: nothing to learn
    ([False, False, False, False], 1.0, 0.0),  # none right: too hard or unpredictable, not paid
    ([True, False, False, False], 0.5, 0.75),  # hard but learnable: paid the most
    ([True, True, True, False], -0.5, 0.25),
    ([True], -1.0, 0.0),  # K = 1: learnability can never pay
    ([False], 1.0, 0.0),
])
def test_writer_rewards_on_hand_made_outcomes(correct, zero_sum, learnability):
    assert writer_return("zero_sum", correct) == zero_sum
    assert writer_return("learnability", correct) == learnability


def test_an_invalid_program_costs_the_penalty_under_both():
    assert writer_return("zero_sum", None, invalid_program_penalty=-1.0) == -1.0
    assert writer_return("learnability", None, invalid_program_penalty=-0.5) == -0.5


def test_predictions_earn_plus_minus_one_or_one_zero():
    assert [prediction_return("zero_sum", c) for c in (True, False)] == [1.0, -1.0]
    assert [prediction_return("learnability", c) for c in (True, False)] == [1.0, 0.0]


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="writer_reward"):
        writer_return("hardness", [True])
    with pytest.raises(ValueError, match="at least one prediction"):
        writer_return("zero_sum", [])
