"""Who holds the seats the trained policy does not: one component for every game mode.

- ``"self"``: nobody else; the policy holds every seat and every seat is trained.
- ``"random"``: a uniformly random legal move (games that list their legal moves).
- ``"frozen"``: the starting policy (a frozen copy, or under LoRA the adapter-free base).
- ``"served"``: a model behind an OpenAI-compatible server (``server``: ``OpenAISettings``, api chat),
  sampled with the policy's temperature, max_new_tokens and stop strings.

The actor is built once, the first time a step needs it (the served client, the frozen generator);
the frozen copy is taken in ``configure``, before any checkpoint is restored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from rlcode.envs.opponents import PolicyOpponent, RandomLegalMover, ServedOpponent
from rlcode.envs.runner import EpisodeRunner
from rlcode.training.frozen_policy import frozen_copy, frozen_generator

if TYPE_CHECKING:
    from rlcode.envs.runner import Episode
    from rlcode.rollout.openai.client import OpenAISettings
    from rlcode.training.mode import LearnerView

OpponentKind = Literal["self", "random", "frozen", "served"]


class Opponents:
    def __init__(self, kind: OpponentKind, server: OpenAISettings | None = None) -> None:
        self.kind, self.server = kind, server
        self._frozen = None  # the frozen starting policy (kind "frozen", full fine-tuning)
        self._actor = None

    @property
    def trains_every_seat(self) -> bool:
        return self.kind == "self"

    def configure(self, learner: LearnerView) -> None:
        if self.kind == "frozen" and learner.policy is not None:
            self._frozen = frozen_copy(learner.policy, getattr(learner, "sharding_plan", None))

    def actor(self, learner: LearnerView):
        """The player of the seats the policy does not hold (None in self-play), built once."""
        if self._actor is None and self.kind == "served":
            self._actor = ServedOpponent(self.server, learner.sampling_params(None))
        elif self._actor is None and self.kind == "random":
            self._actor = RandomLegalMover()
        elif self._actor is None and self.kind == "frozen":
            self._actor = PolicyOpponent(learner.render, frozen_generator(learner, self._frozen))
        return self._actor


def play_episodes(learner: LearnerView, envs, seeds, seats, opponents: Opponents | None = None
                  ) -> tuple[list[Episode], int]:
    """Play ``envs`` with the policy in ``seats`` (one tuple per env) and the opponent elsewhere, at
    the training temperature and this step's seed: (episodes, the backend's generate calls)."""
    runner = EpisodeRunner(learner.render, learner.turn_generator(),
                           opponent=opponents.actor(learner) if opponents is not None else None)
    episodes = runner.play(envs, seeds, seats, sampling_seed=learner.sampling_seed())
    return episodes, runner.backend_calls
