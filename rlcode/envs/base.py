"""The environment interface every training mode shares: whose turn, what that player sees, and
the end of an episode with a return per player.

A turn is what one player sees (chat messages); the player answers with text; the environment
moves on to the next turn or ends the episode. Single-turn MBPP is the one-turn case, a two-player
game alternates seats, multi-step MBPP feeds execution errors back as the next user turn. The episode
runner (``rlcode.envs.runner``) drives many environments at once; environments never see tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Turn:
    """A pending turn: ``player`` (seat index) is to answer ``messages``."""

    player: int
    messages: Messages


@dataclass
class StepResult:
    """What followed a player's answer: the next turn, or the end with each player's return."""

    next_turn: Turn | None
    returns: dict[int, float] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    """What the environment made of the answer (e.g. the parsed move, whether it was legal)."""

    @property
    def done(self) -> bool:
        return self.next_turn is None


class Environment(Protocol):
    name: str
    """What the episode is an instance of (a game id, ``"mbpp"``): groups baselines and metrics."""

    def reset(self, seed: int) -> Turn:
        """Start an episode; the first turn."""
        ...

    def step(self, answer: str) -> StepResult:
        """The current player's answer (the model's whole reply) -> the next turn or the end."""
        ...
