"""Fixed opponents for the seats the trained policy does not hold.

- ``RandomLegalMover``: a uniformly random legal move (what SPIRAL evaluates against); needs an
  environment that lists its legal moves (``TextArenaGame.legal_moves``).
- ``PolicyOpponent``: another model answering through its own generation call, e.g. a frozen copy
  of the starting policy (``rlcode.algorithms.spiral`` builds it) or, later, a served model.
"""

from __future__ import annotations

import random
from typing import Callable


class RandomLegalMover:
    def act(self, envs, turns, seed: int) -> list[str]:
        rng = random.Random(seed)
        answers = []
        for env in envs:
            moves = env.legal_moves().examples()
            answers.append(_boxed(rng.choice(moves), env) if moves else "")
        return answers


class PolicyOpponent:
    def __init__(self, render: Callable, generate: Callable) -> None:
        """Answers with a model: ``render`` (messages -> prompt), ``generate`` (prompts, seed) -> rollout."""
        self.render = render
        self.generate = generate

    def act(self, envs, turns, seed: int) -> list[str]:
        return list(self.generate([self.render(turn.messages) for turn in turns], seed).completion_texts)


def _boxed(move: str, env) -> str:
    """Write a move the way the environment parses it (SPIRAL's ``\\boxed{}`` or a bare bracket)."""
    return f"\\boxed{{{move}}}" if getattr(env, "move_format", "boxed") == "boxed" else move

