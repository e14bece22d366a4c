"""Training scalars of each GRPO step, from the module's StepRecord, to every logger.

Names keep the original GRPO-on-MBPP scripts' W&B panels (``reward/avg_batch_reward``,
``reward/successful_predictions_count``) plus one mean per reward function (``reward/<name>``),
completion lengths, loss parts (clip fractions, ratio, KL), throughput and where the step's time
went. The progress bar gets the short ones: reward, the share of what each reward counts as a
success, tok/s. Each step also prints one line in the ART toolkit's format, every success count named
by what it counts (``Step 3: reward=0.250, ran=75.0% (6/8), passed=12.5% (1/8), time=41.2s``:
``ran`` = programs that ran without an error, under the execution reward; ``passed`` = programs
that passed every MBPP test, under the MBPP test rewards).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from rlcode.training.step_record import StepRecord
from rlcode.rewards.registry import REWARDS


def step_metrics(record: StepRecord) -> dict[str, float]:
    """Every scalar worth plotting for one step."""
    rewards = [r for r in record.rewards if not math.isnan(r)]
    lengths = record.completion_lengths
    step_seconds = record.timings.get("step", float("nan"))
    metrics = {
        "reward/avg_batch_reward": record.mean_reward,
        "reward/successful_predictions_count": float(successes(record)),
        "reward/std": _std(rewards),
        "reward/frac_reward_zero_std": record.frac_reward_zero_std,
        "completions/mean_length": sum(lengths) / max(len(lengths), 1),
        "completions/max_length": float(max(lengths, default=0)),
        "completions/truncated_fraction": sum(record.truncated) / max(len(record.truncated), 1),
        "perf/tokens_per_s": record.generated_tokens / step_seconds if step_seconds > 0 else 0.0,
        "perf/updated": float(record.updated),
    }
    for name, values in record.rewards_by_function.items():
        scored = [v for v in values if not math.isnan(v)]
        metrics[f"reward/{name}"] = sum(scored) / len(scored) if scored else float("nan")
    metrics.update({f"reward/{key}": value for key, value in record.reward_metrics.items()})
    metrics.update({f"loss/{key}": value for key, value in record.loss.items()})
    metrics.update({f"perf/{key}_s": value for key, value in record.timings.items()})
    metrics.update(record.extra_metrics)
    return metrics


class Successes(NamedTuple):
    """One success count of a step: what it counts (``label`` for the step line and the progress
    bar, ``meaning`` for the summary), among how many."""

    label: str
    meaning: str
    count: int
    total: int


POSITIVE = ("positive", "completions with a positive total reward")


def success_labels(module) -> dict[str, tuple[str, str]]:
    """(label, meaning) of each reward function that counts successes, by its name in the step's
    record, plus ``"episodes"`` for modes whose episodes know whether they succeeded."""
    labels = {}
    mixture = getattr(module, "rewards", None)
    for name, function in zip(getattr(mixture, "names", []), getattr(mixture, "functions", [])):
        if getattr(function, "success_label", None):
            labels[name] = (function.success_label, function.success_meaning)
    if getattr(module, "success_label", None):
        labels["episodes"] = (module.success_label, module.success_meaning)
    return labels


def success_counts(record: StepRecord, labels: dict[str, tuple[str, str]] | None = None) -> list[Successes]:
    """What succeeded in this step, per reward. Episodes that know whether they succeeded (multi-step
    MBPP: solved; code game: predicted) count as one each; otherwise each reward function that counts
    successes gives its own (execution: the program ran; MBPP tests: every assert passed), and with
    none of those, completions with a positive total reward."""
    labels = labels or {}
    if _episodes_know_success(record):
        label, meaning = labels.get("episodes", ("succeeded", "episodes that succeeded"))
        return [Successes(label, meaning, sum(bool(e.get("success")) for e in record.episodes), len(record.episodes))]
    counts: list[Successes] = []
    for name in record.rewards_by_function:
        counted = record.reward_metrics.get(f"{name}/successful_predictions_count")
        if counted is None:
            continue
        label, meaning = labels.get(name) or _known_label(name)
        if all(c.label != label for c in counts):  # mbpp_tests and mbpp_tests_fraction count the same
            counts.append(Successes(label, meaning, int(counted), len(record.rewards)))
    return counts or [Successes(*POSITIVE, sum(r > 0 for r in record.rewards), len(record.rewards))]


def _known_label(name: str) -> tuple[str, str]:
    known = REWARDS.get(name)
    if known is None:
        return f"{name}_ok", f"completions {name} counted as successful"
    return known.success_label, known.success_meaning


def successes(record: StepRecord) -> int:
    """``reward/successful_predictions_count``: the first count of ``success_counts`` (the first reward
    function's, as the original scripts logged it)."""
    return success_counts(record)[0].count


def _episodes_know_success(record: StepRecord) -> bool:
    """Multi-step MBPP (solved) and the code game (predicted correctly) say so per episode."""
    return any(e.get("success") is not None for e in record.episodes)


def trials(record: StepRecord) -> int:
    """What successes are counted among: episodes where they know success, else completions."""
    if _episodes_know_success(record):
        return len(record.episodes)
    return len(record.rewards)


def step_line(record: StepRecord, labels: dict[str, tuple[str, str]] | None = None) -> str:
    """One human line per step, as the ART toolkit prints it, each success count named by what it
    counts: ``Step 3: reward=0.250, ran=75.0% (6/8), passed=12.5% (1/8), time=41.2s``."""
    shares = "".join(f"{c.label}={100 * c.count / max(c.total, 1):.1f}% ({c.count}/{c.total}), "
                     for c in success_counts(record, labels))
    line = f"  Step {record.step}: reward={record.mean_reward:.3f}, {shares}time={record.timings.get('step', 0.0):.1f}s"
    return line if record.updated else line + " (no update)"


class GRPOMetrics(L.Callback):
    def __init__(self, print_steps: bool = True) -> None:
        """Log each step's scalars and keep their history for plots and the summary.

        Args:
            print_steps: print one line per step (reward, what succeeded per reward, time).
        """
        self.print_steps = print_steps
        self.history: list[tuple[int, float]] = []  # (step, mean reward)
        self.trajectories = 0  # completions (single-turn) or episodes, over the run: the ART summary
        self.successes: dict[str, list] = {}  # label -> [meaning, count] over the run
        self.updates = 0  # steps that changed the weights
        self._labels: dict[str, tuple[str, str]] | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record: StepRecord | None = getattr(pl_module, "last_step", None)
        if record is None:
            return
        if self._labels is None:
            self._labels = success_labels(pl_module)
        metrics = step_metrics(record)
        grad_norm = getattr(pl_module, "last_grad_norm", None)
        if grad_norm is not None and record.updated:
            metrics["train/grad_norm"] = grad_norm
        # Straight to the loggers, keyed by the step the batch started at: Lightning's own logging
        # would repeat a stale value in steps that do not log it (loss and grad norm of a step
        # without an update). Under DDP these are rank zero's numbers.
        for logger in trainer.loggers:
            logger.log_metrics({k: v for k, v in metrics.items() if not math.isnan(v)}, step=record.step)
        batch_size = len(record.prompts)
        counts = success_counts(record, self._labels)
        bar = [("reward", record.mean_reward), *((c.label, c.count / max(c.total, 1)) for c in counts),
               ("tok/s", metrics["perf/tokens_per_s"])]
        for name, value in bar:
            pl_module.log(name, value, prog_bar=True, logger=False, batch_size=batch_size)
        self.history.append((record.step, record.mean_reward))
        self.trajectories += trials(record)
        self.updates += bool(record.updated)
        for c in counts:
            self.successes.setdefault(c.label, [c.meaning, 0])[1] += c.count
        if self.print_steps:
            _write(step_line(record, self._labels))

    def state_dict(self) -> dict:
        return {"history": list(self.history), "trajectories": self.trajectories, "updates": self.updates,
                "successes": {label: list(entry) for label, entry in self.successes.items()}}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = [tuple(item) for item in state_dict.get("history", [])]
        self.trajectories = int(state_dict.get("trajectories", 0))
        self.updates = int(state_dict.get("updates", len(self.history)))
        self.successes = {label: list(entry) for label, entry in state_dict.get("successes", {}).items()}


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


@rank_zero_only
def _write(line: str) -> None:
    import sys

    from tqdm import tqdm  # cooperates with the progress bar instead of breaking its line

    tqdm.write(line)
    sys.stdout.flush()  # a redirected log (SLURM, nohup) shows each step as it ends
