"""What a training mode is: the one class to read before writing a fifth.

A training run is one ``Learner`` (``rlcode.training.learner``: the policy, its tokenizer and rollout
backend, the reference, the loss and the update, the settings every mode reads) and one ``Mode``
(``rlcode.modes``: GRPO, SPIRAL, MultiStepMBPP, CodeGame). The Learner's step is the same for every
mode and reads top to bottom::

    experience = mode.collect(learner, batch)                 # rows to train, rewards started
    ref_logps  = reference log-probs of experience.rollout      # beta > 0; overlaps the rewards
    rewards    = experience.rewards(device)                     # [N], NaN = unscored
    flat       = mode.estimator.flat_rows(experience, rewards)  # rows without a learning signal
    totals     = sums over every rank (loss normalisers, reward std)
    advantages = mode.estimator.advantages(ranks, experience, rewards, totals)
    rows       = rows to train (skip_zero_advantage_rows)  ->  update_policy  ->  learner.last_step

A mode owns everything that differs between modes, and nothing else:

- its settings: the typed arguments of its ``__init__`` (a config's ``model.mode.init_args``), each
  kept as an attribute of the same name (``init_args`` reads them back for the checkpoint);
- ``collect``: what the policy plays and how it is scored (an ``Experience``);
- ``estimator``: its advantage estimator, an object (``rlcode.training.advantage_estimators``):
  which rows are flat, and the advantages, the same on one rank and on many;
- its opponents (``rlcode.modes.opponents``), built in ``configure`` once the policy exists;
- its evaluation: ``validation_step`` / ``test_step`` (``rlcode validate`` / ``test``);
- ``step_metrics``: scalars of its own, logged under its own names each step;
- ``state_dict`` / ``load_state_dict``: its state in checkpoints (exact resume);
- ``check_data``: whether the DataModule gives it what ``collect`` reads (a one-line error if not);
- ``description``: what the run's banner says about it (rewards, what a success means, group size);
- ``sandbox``: the sandbox settings of a mode that runs code (None: it runs none).

The mode talks to the learner through ``LearnerView`` below and nothing else: sampling, rendering,
sandbox pools, seeds, the ranks. Modes live one layer above ``rlcode.training`` (``rlcode.modes``);
nothing in ``rlcode.training`` imports them.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, is_dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from torch import Tensor

    from rlcode.rollout.base import RolloutBatch, SamplingParams
    from rlcode.training.advantage_estimators import AdvantageEstimator
    from rlcode.training.all_ranks_totals import Ranks
    from rlcode.training.experience import Experience
    from rlcode.training.run_context import SandboxSettings


@dataclass(frozen=True)
class ModeDescription:
    """What the run's banner and summary say about the mode."""

    rewards: list[str]
    """What the reward is: reward function names, or one sentence for modes whose episodes score themselves."""
    group_size: int | None
    """Completions or episodes per prompt (None: no groups, e.g. SPIRAL's games)."""
    success_label: str | None = None
    """What one success is called in the step line (``"solved"``), None: the reward functions say."""
    success_meaning: str | None = None
    """The same in words for the summary (``"episodes solved within the attempts"``)."""
    opponent: str | None = None
    """Who holds the other seats (``"self"``, ``"random"``, ...), for game modes."""


class LearnerView(Protocol):
    """What a mode may ask of the learner (``rlcode.training.learner.Learner`` implements it)."""

    device: Any
    global_step: int
    global_rank: int
    policy: Any
    tokenizer: Any
    trainer: Any
    """Lightning's trainer: evaluation steps read the size of their loop from it."""
    sharding_plan: Any
    """FSDP's ``rlcode.models.sharding.ShardingPlan`` (None unsharded): a frozen copy is sharded alike."""
    stop_token: Any
    """The run's ``rlcode.stopping.StopToken``: an opponent's HF backend ends its rows on it as the policy's does."""

    def render(self, prompt) -> str:
        """Chat messages or plain text -> what the backend encodes."""

    def generate(self, prompts: list[str], num_generations: int, *, temperature: float,
                 max_new_tokens: int | None = None, seed: int | None = None,
                 precision: str | None = None) -> RolloutBatch:
        """G completions per rendered prompt, prompt-major, on the policy's device (``precision``: the
        sampler, "same" or "int8"; None: the training one)."""

    def turn_generator(self, temperature: float | None = None,
                       precision: str | None = None) -> Callable[[list[str], int], RolloutBatch]:
        """(rendered prompts, seed) -> one completion each: what ``EpisodeRunner`` calls."""

    def sampling_params(self, seed: int | None, temperature: float | None = None,
                        max_new_tokens: int | None = None) -> SamplingParams: ...

    def sampling_seed(self) -> int:
        """This step's and this rank's generation seed."""

    def sandbox_pool(self, timeout: float, workers: int | None = None):
        """A sandbox pool sized for this rank, with the mode's ``sandbox`` settings (the caller closes it)."""

    def run_tag(self) -> str:
        """The run's id, the same on every rank (tags sandbox executions)."""

    def ranks(self) -> Ranks:
        """Every rank of the run: sums and gathers for estimators that need them."""

    def pad_token_id(self) -> int: ...

    def datamodule(self):
        """The trainer's DataModule (None outside a trainer)."""

    def log(self, name: str, value, **kwargs) -> None:
        """LightningModule.log (validation and test metrics)."""


class Mode(ABC):
    """A training mode: see the module docstring. Subclasses define ``collect``, ``validation_step``,
    ``test_step``, ``description`` and set ``self.estimator`` in ``__init__``."""

    estimator: AdvantageEstimator
    sandbox: SandboxSettings | None = None

    # ---- the run's life: data check, building, closing ----------------------------------------
    def check_data(self, datamodule) -> None:
        """Raise ``rlcode.errors.SettingError`` (one line: what is missing and which data class has
        it) when ``datamodule`` does not give what ``collect`` reads. Called at setup."""

    def configure(self, learner: LearnerView) -> None:
        """Once the policy and backend exist (e.g. a frozen copy to play against)."""

    def setup(self, learner: LearnerView, stage: str) -> None:
        """At the start of fit / validate / test (e.g. reward functions and their sandbox)."""

    def teardown(self) -> None:
        """Close what ``setup`` and the evaluation opened (sandbox pools)."""

    # ---- one training step ----------------------------------------------------------------------
    @abstractmethod
    def collect(self, learner: LearnerView, batch) -> Experience:
        """The batch's rollouts as rows to train, their rewards started (``rlcode.training.experience``)."""

    def step_metrics(self, experience: Experience) -> dict[str, float]:
        """Scalars of this mode for this step (after ``collect``, before the update)."""
        return {}

    # ---- evaluation (rlcode validate / test) ------------------------------------------------------
    @abstractmethod
    def validation_step(self, learner: LearnerView, batch, batch_idx: int):
        """``LightningModule.validation_step``'s body: log this mode's measure of the policy."""

    @abstractmethod
    def test_step(self, learner: LearnerView, batch, batch_idx: int):
        """``LightningModule.test_step``'s body."""

    # ---- what the banner says -----------------------------------------------------------------------
    @abstractmethod
    def description(self) -> ModeDescription:
        """What the run's banner and summary say about this mode (rewards, success, group size, opponent)."""

    # ---- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume (saved with every checkpoint; plain types and tensors)."""
        return {"estimator": self.estimator.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back ``state_dict``'s state (with the checkpoint, before the first step of a resume)."""
        self.estimator.load_state_dict(state.get("estimator", {}))

    # ---- the settings, back as a config -------------------------------------------------------------
    def init_args(self) -> dict[str, Any]:
        """The ``__init__`` arguments this mode was built with (each kept as an attribute of its name)."""
        names = [p.name for p in inspect.signature(type(self).__init__).parameters.values()
                 if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        return {name: _plain(getattr(self, name)) for name in names}

    def config(self) -> dict[str, Any]:
        """``{"class_path": ..., "init_args": ...}``: how a config (and a checkpoint) names this mode."""
        cls = type(self)
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": self.init_args()}


def _plain(value):
    """Settings objects (dataclasses) as dicts, so checkpoints hold plain types only."""
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
