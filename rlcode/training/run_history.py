"""What a run did and what it is, in one place that the training module fills and callbacks read.

The module adds each step's ``StepRecord`` as the step ends (``add_step``); ``RunHistory`` keeps that
last record whole (rollout logging reads its completions) and, of every step, only the scalars
derived from it by ``rlcode.training.step_scalars`` (the loggers' metrics, the success counts, how
many trajectories, whether the weights changed), so memory grows by a few dozen floats per step.
Evaluation callbacks append their results (``add_eval``, ``add_game_eval``); the graceful shutdown
says why and where the run stopped (``stop``); the plot callback says where its picture is.

Readers never look for each other: the step line, metrics, progress bar, plots and summary read
this object and ``module.run_description()``, and a reader that must see a phase's results reads
them in a later hook than the one that produces them (a batch's eval at the next batch or at train
end, train-end results at fit end), so the order of the callbacks does not matter.

The module saves ``state_dict()`` in its checkpoints, so a resumed run's summary and plot cover the
steps and evals before the interruption too. Under DDP and FSDP each step's trials and success counts
are summed over the ranks as the step is added, and its reward is the mean over every rank, so every
rank's history (rank zero's shows) counts the whole run; the other metrics stay each rank's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlcode.training.all_ranks_totals import Ranks, counts_over_ranks
from rlcode.training.step_record import StepRecord
from rlcode.training.step_scalars import Successes, counted, named, step_metrics, trials


@dataclass(frozen=True)
class RunDescription:
    """What the run is, as the banner, the step lines and the summary say it (``module.run_description()``)."""

    mode: str
    """The training mode's name, the banner's title ("GRPO", "SPIRAL", ...)."""
    model: str
    """What samples the rollouts: the model name, or a served model and where it is."""
    rewards: list[str]
    """The reward function names, or one line saying what the episodes' reward is."""
    success_labels: dict[str, tuple[str, str]] = field(default_factory=dict)
    """(label, meaning) of each success count by what counts it (``step_scalars.success_labels``)."""
    group_size: int | None = None
    """Completions per prompt, for modes that sample groups (None: the mode does not)."""
    dry_run: bool = False
    """Rollouts and rewards only: no weight update, no checkpoint."""
    opponent: str | None = None
    """Who the policy plays against, in game modes."""


@dataclass
class StepScalars:
    """What a run keeps of each step: its scalars, not its text."""

    step: int
    metrics: dict[str, float]
    """``step_metrics`` of the record (plus ``train/grad_norm`` when the step updated and clipped)."""
    successes: list[tuple[str, int, int]]
    """``step_scalars.counted``: (what counted, count, among how many)."""
    trials: int
    updated: bool

    @property
    def mean_reward(self) -> float:
        """Over every rank (rank zero's own is ``metrics["reward/avg_batch_reward"]``)."""
        return self.metrics.get("reward/avg_batch_reward_all_ranks", self.metrics["reward/avg_batch_reward"])


class RunHistory:
    def __init__(self) -> None:
        self.last_step: StepRecord | None = None
        self.steps: list[StepScalars] = []
        self.evals: list[dict] = []  # pass-rate evals: {"step", "pass_rate", "num_questions", "path", ...}
        self.game_evals: list[dict] = []  # games vs a random mover: {"step", "spiral/<game>/<rate>", ...}
        self.eval_problems: int | None = None  # problems each pass-rate eval scores (set up before training)
        self.stopped_by: str | None = None  # the signal that stopped the run early
        self.saved_on_stop: str | None = None  # the checkpoint written on the way out
        self.plot: str | None = None  # where the training plot is

    # ---- filled by the module, each step ------------------------------------------------------
    def add_step(self, record: StepRecord, grad_norm: float | None = None, ranks: Ranks | None = None) -> StepScalars:
        """Keep ``record`` as the last step and its scalars for the run's plots and summary.
        ``grad_norm``: the gradient norm before clipping, logged for steps that updated; ``ranks``:
        the run's ranks, over which the counts are summed (every rank must call this)."""
        metrics = {key: float(value) for key, value in step_metrics(record).items()}
        if grad_norm is not None and record.updated:
            metrics["train/grad_norm"] = float(grad_norm)
        count, successes = counts_over_ranks(ranks or Ranks(), trials(record), counted(record))
        scalars = StepScalars(record.step, metrics, successes, count, bool(record.updated))
        self.last_step = record
        self.steps.append(scalars)
        return scalars

    # ---- filled by callbacks ------------------------------------------------------------------
    def add_eval(self, entry: dict) -> None:
        self.evals.append(dict(entry))

    def add_game_eval(self, entry: dict) -> None:
        self.game_evals.append(dict(entry))

    def stop(self, reason: str, saved: str | None) -> None:
        self.stopped_by, self.saved_on_stop = reason, saved

    # ---- derived ------------------------------------------------------------------------------
    def rewards(self) -> list[tuple[int, float]]:
        """(step, mean reward) of every step."""
        return [(s.step, s.mean_reward) for s in self.steps]

    def trajectories(self) -> int:
        """Completions (single-turn) or episodes over the run: the ART summary's count."""
        return sum(s.trials for s in self.steps)

    def updates(self) -> int:
        """Steps that changed the weights."""
        return sum(s.updated for s in self.steps)

    def successes(self, labels: dict[str, tuple[str, str]] | None = None) -> list[Successes]:
        """Each success count summed over the run, named by ``labels`` (total: ``trajectories``)."""
        totals: dict[str, Successes] = {}
        for scalars in self.steps:
            for c in named(scalars.successes, labels):
                before = totals.get(c.label)
                totals[c.label] = c if before is None else before._replace(count=before.count + c.count,
                                                                            total=before.total + c.total)
        return list(totals.values())

    def evaluated_at(self, step: int, games: bool = False) -> bool:
        return any(entry["step"] == step for entry in (self.game_evals if games else self.evals))

    # ---- checkpoints (plain data: checkpoints load with weights_only) --------------------------
    def state_dict(self) -> dict:
        return {"steps": [[s.step, dict(s.metrics), [list(c) for c in s.successes], s.trials, s.updated]
                          for s in self.steps],
                "evals": [dict(e) for e in self.evals], "game_evals": [dict(e) for e in self.game_evals]}

    def load_state_dict(self, state: dict) -> None:
        self.steps = [StepScalars(int(step), dict(metrics), [(str(k), int(n), int(t)) for k, n, t in successes],
                                  int(count), bool(updated))
                      for step, metrics, successes, count, updated in state.get("steps", [])]
        self.evals = [dict(e) for e in state.get("evals", [])]
        self.game_evals = [dict(e) for e in state.get("game_evals", [])]
