"""Who holds the seats the trained policy does not: one component for every game mode.

- ``"self"``: nobody else; the policy holds every seat and every seat is trained.
- ``"random"``: a uniformly random legal move (games that list their legal moves).
- ``"frozen"``: the starting policy (a frozen copy, or under LoRA the adapter-free base).
- ``"served"``: a model behind an OpenAI-compatible server (``server``: ``OpenAISettings``, api chat).
- ``"model"``: another Hugging Face model loaded frozen in this process (``model``: any name the
  policy's ``model_name`` takes), with its own tokenizer and chat template.

A served or other model samples with ``OpponentSampling`` (temperature and max_new_tokens; unset:
the policy's) and the policy's stop strings; the frozen copy samples exactly as the policy does.
The actor is built once, the first time a step needs it (the served client, the frozen generator);
the frozen copy and the other model are loaded in ``configure``, before any checkpoint is restored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlcode.envs.opponents import LocalModelOpponent, PolicyOpponent, RandomLegalMover, ServedOpponent
from rlcode.envs.runner import EpisodeRunner
from rlcode.errors import SettingError
from rlcode.models.loading import load_model, load_tokenizer
from rlcode.training.frozen_policy import frozen_copy, frozen_generator

if TYPE_CHECKING:
    from rlcode.envs.runner import Episode
    from rlcode.rollout.openai.client import OpenAISettings
    from rlcode.training.mode import LearnerView

OpponentKind = Literal["self", "random", "frozen", "served", "model"]


@dataclass(frozen=True)
class OpponentSampling:
    """How a served or other model samples its answers; None: the policy's setting."""

    temperature: float | None = None
    max_new_tokens: int | None = None


class Opponents:
    def __init__(self, kind: OpponentKind, server: OpenAISettings | None = None, model: str | None = None,
                 sampling: OpponentSampling | None = None, tokenizer: str | None = None) -> None:
        """``model``: the other model (kind "model"); ``tokenizer``: the served model's tokenizer, for
        budgets counted in its tokens (kind "served"; None: unknown)."""
        if (kind == "model") != (model is not None):
            raise SettingError(f"opponent={kind!r} with opponent_model={model!r}: opponent 'model' takes the other "
                               "model's name (an alias, a hub id or a folder), and only it does")
        self.kind, self.server, self.model_name, self.tokenizer_name = kind, server, model, tokenizer
        self.sampling = sampling or OpponentSampling()
        self._frozen = None  # the frozen starting policy (kind "frozen", full fine-tuning)
        self._other = None  # (model, tokenizer) of kind "model"
        self._tokenizer = None  # the served model's, when named
        self._actor = None

    @property
    def trains_every_seat(self) -> bool:
        return self.kind == "self"

    def configure(self, learner: LearnerView) -> None:
        if self.kind == "frozen" and learner.policy is not None:
            self._frozen = frozen_copy(learner.policy, getattr(learner, "sharding_plan", None))
        if self.kind == "model" and self._other is None:
            model = load_model(self.model_name)  # fp32, as transformers loads it; moved to the policy's device
            if learner.policy is not None:
                parameter = next(learner.policy.parameters())
                model = model.to(device=learner.device, dtype=parameter.dtype if parameter.is_floating_point() else None)
            self._other = (model, load_tokenizer(self.model_name))
        if self.kind == "served" and self.tokenizer_name is not None and self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer_name)

    def tokenizer(self, learner: LearnerView):
        """The tokenizer of whoever answers in the other seats: the policy's (self, frozen), the other
        model's, the served model's when named, else None (unknown: budgets are counted in bytes)."""
        if self.kind == "model":
            return self._other[1]
        return self._tokenizer if self.kind == "served" else learner.tokenizer

    def sampling_params(self, learner: LearnerView):
        """The opponent's sampling: its own temperature and max_new_tokens where set, the policy's rest."""
        if self.kind in ("served", "model"):
            return learner.sampling_params(None, self.sampling.temperature, self.sampling.max_new_tokens)
        return learner.sampling_params(None)

    def actor(self, learner: LearnerView):
        """The player of the seats the policy does not hold (None in self-play), built once."""
        if self._actor is None and self.kind == "served":
            self._actor = ServedOpponent(self.server, self.sampling_params(learner))
        elif self._actor is None and self.kind == "model":
            self._actor = LocalModelOpponent(*self._other, self.sampling_params(learner), learner.stop_token)
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
