"""The scalars of one training step, as pure functions of its StepRecord (every mode's).

Names keep the original GRPO-on-MBPP scripts' W&B panels (``reward/avg_batch_reward``, a mean per
episode in multi-turn modes, whose per-turn mean is ``reward/avg_turn_reward``;
``reward/successful_predictions_count``) plus one mean per reward function (``reward/<name>``),
completion lengths, loss parts (clip fractions, ratio, KL), throughput and where the step's time
went. Success counts are kept by what counted them (a reward function's name, ``"episodes"`` for
modes whose episodes know whether they succeeded, ``"positive"`` otherwise) and named for people
(``ran``, ``passed``, ``solved``) by the run's labels (``RunDescription.success_labels``), so that
``RunHistory`` can derive them without knowing the mode, and every reader names them alike.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from rlcode.rewards.registry import REWARDS
from rlcode.training.step_record import StepRecord

EPISODES = "episodes"  # the count of modes whose episodes say whether they succeeded
POSITIVE = "positive"  # the fallback: completions with a positive total reward
_DEFAULT_LABELS = {EPISODES: ("succeeded", "episodes that succeeded"),
                   POSITIVE: ("positive", "completions with a positive total reward")}


def step_metrics(record: StepRecord) -> dict[str, float]:
    """Every scalar worth plotting for one step (the loggers' keys)."""
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
    metrics.update({f"perf/{key}": value for key, value in record.memory.items()})
    if record.episode_of_row:  # multi-turn: avg_batch_reward is per episode, this per turn
        metrics["reward/avg_turn_reward"] = record.mean_turn_reward
    metrics.update(record.extra_metrics)
    return metrics


class Successes(NamedTuple):
    """One success count of a step: what it counts (``label`` for the step line and the progress
    bar, ``meaning`` for the summary), among how many."""

    label: str
    meaning: str
    count: int
    total: int


def counted(record: StepRecord) -> list[tuple[str, int, int]]:
    """(what counted, count, among how many) of each success count of the step. Episodes that know
    whether they succeeded (multi-step MBPP: solved; code game: predicted) count as one each;
    otherwise each reward function that counts successes gives its own (execution: the program ran;
    MBPP tests: every assert passed), and with none of those, completions with a positive reward."""
    if _episodes_know_success(record):
        return [(EPISODES, sum(bool(e.get("success")) for e in record.episodes), len(record.episodes))]
    counts = [(name, int(value), len(record.rewards)) for name in record.rewards_by_function
              if (value := record.reward_metrics.get(f"{name}/successful_predictions_count")) is not None]
    return counts or [(POSITIVE, sum(r > 0 for r in record.rewards), len(record.rewards))]


def named(counts: list[tuple[str, int, int]], labels: dict[str, tuple[str, str]] | None = None) -> list[Successes]:
    """``counted``'s counts under their labels; one per label (mbpp_tests and mbpp_tests_fraction
    count the same programs)."""
    result: list[Successes] = []
    for key, count, total in counts:
        label, meaning = (labels or {}).get(key) or _known_label(key)
        if all(c.label != label for c in result):
            result.append(Successes(label, meaning, count, total))
    return result


def success_counts(record: StepRecord, labels: dict[str, tuple[str, str]] | None = None) -> list[Successes]:
    """What succeeded in this step, per reward, named (see ``counted``)."""
    return named(counted(record), labels)


def success_labels(mode) -> dict[str, tuple[str, str]]:
    """(label, meaning) of each reward function of ``mode.rewards`` (a RewardMixture) that counts
    successes, by its name, plus ``"episodes"`` when ``mode.success_label`` says what an episode's
    success means. Anything with those attributes works (a module, a mode, its class)."""
    labels = {}
    mixture = getattr(mode, "rewards", None)
    for name, function in zip(getattr(mixture, "names", []), getattr(mixture, "functions", [])):
        if getattr(function, "success_label", None):
            labels[name] = (function.success_label, function.success_meaning)
    if getattr(mode, "success_label", None):
        labels[EPISODES] = (mode.success_label, mode.success_meaning)
    return labels


def _known_label(key: str) -> tuple[str, str]:
    if key in _DEFAULT_LABELS:
        return _DEFAULT_LABELS[key]
    known = REWARDS.get(key)
    if known is None:
        return f"{key}_ok", f"completions {key} counted as successful"
    return known.success_label, known.success_meaning


def successes(record: StepRecord) -> int:
    """``reward/successful_predictions_count``: the first count of ``counted`` (the first reward
    function's, as the original scripts logged it)."""
    return counted(record)[0][1]


def _episodes_know_success(record: StepRecord) -> bool:
    """Multi-step MBPP (solved) and the code game (predicted correctly) say so per episode."""
    return any(e.get("success") is not None for e in record.episodes)


def trials(record: StepRecord) -> int:
    """What successes are counted among: episodes where they know success, else completions."""
    if _episodes_know_success(record):
        return len(record.episodes)
    return len(record.rewards)


def step_line(record: StepRecord, labels: dict[str, tuple[str, str]] | None = None, scalars=None) -> str:
    """One human line per step, as the ART toolkit prints it, each success count named by what it
    counts: ``Step 3: reward=0.250, ran=75.0% (6/8), passed=12.5% (1/8), time=41.2s``. With the
    step's ``run_history.StepScalars`` the reward and counts are every rank's, else this rank's."""
    counts = named(scalars.successes, labels) if scalars is not None else success_counts(record, labels)
    reward = scalars.mean_reward if scalars is not None else record.mean_reward
    shares = "".join(f"{c.label}={100 * c.count / max(c.total, 1):.1f}% ({c.count}/{c.total}), " for c in counts)
    line = f"  Step {record.step}: reward={reward:.3f}, {shares}time={record.timings.get('step', 0.0):.1f}s"
    if record.memory:
        line += (f", GPU peak {record.memory['gpu_peak_allocated_gib']:.1f} GiB allocated / "
                 f"{record.memory['gpu_peak_reserved_gib']:.1f} reserved")
    return line if record.updated else line + " (no update)"


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
