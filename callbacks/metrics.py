"""Training scalars of each GRPO step, from the module's StepRecord, to every logger.

Names keep the original GRPO-on-MBPP scripts' W&B panels (``reward/avg_batch_reward``,
``reward/successful_predictions_count``) plus one mean per reward function (``reward/<name>``),
completion lengths, loss parts (clip fractions, ratio, KL), throughput and where the step's time
went. The progress bar gets the short ones: reward, pass (share of completions that pass), tok/s. Each step also prints one line in the
ART toolkit's format (``Step 3: reward=0.250, success=37.5% (3/8), time=41.2s``).
"""

from __future__ import annotations

import math

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from rlcode.algorithms.step_record import StepRecord


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


def successes(record: StepRecord) -> int:
    """Successful completions as the first reward function counts them (execution: the program ran;
    MBPP tests: every assert passed), else those with a positive total reward. Episodes that know
    whether they solved their task (multi-step MBPP) count as one each."""
    if _episodes_know_success(record):
        return sum(bool(e.get("success")) for e in record.episodes)
    first = next(iter(record.rewards_by_function), None)
    counted = record.reward_metrics.get(f"{first}/successful_predictions_count")
    return int(counted) if counted is not None else sum(r > 0 for r in record.rewards)


def _episodes_know_success(record: StepRecord) -> bool:
    """Multi-step MBPP (solved) and the code game (predicted correctly) say so per episode."""
    return any(e.get("success") is not None for e in record.episodes)


def trials(record: StepRecord) -> int:
    """What successes are counted among: episodes where they know success, else completions."""
    if _episodes_know_success(record):
        return len(record.episodes)
    return len(record.rewards)


def step_line(record: StepRecord) -> str:
    """One human line per step, as the ART toolkit prints it."""
    count, total = successes(record), trials(record)
    line = (f"  Step {record.step}: reward={record.mean_reward:.3f}, success={100 * count / max(total, 1):.1f}% "
            f"({count}/{total}), time={record.timings.get('step', 0.0):.1f}s")
    return line if record.updated else line + " (no update)"


class GRPOMetrics(L.Callback):
    def __init__(self, print_steps: bool = True) -> None:
        """Log each step's scalars and keep their history for plots and the summary.

        Args:
            print_steps: print one line per step (reward, success count, time).
        """
        self.print_steps = print_steps
        self.history: list[tuple[int, float]] = []  # (step, mean reward)
        self.trajectories = 0  # completions (single-turn) or episodes, over the run: the ART summary
        self.successful = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record: StepRecord | None = getattr(pl_module, "last_step", None)
        if record is None:
            return
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
        share = successes(record) / max(len(record.rewards), 1)
        for name, value in (("reward", record.mean_reward), ("pass", share), ("tok/s", metrics["perf/tokens_per_s"])):
            pl_module.log(name, value, prog_bar=True, logger=False, batch_size=batch_size)
        self.history.append((record.step, record.mean_reward))
        self.trajectories += trials(record)
        self.successful += successes(record)
        if self.print_steps:
            _write(step_line(record))

    def state_dict(self) -> dict:
        return {"history": list(self.history), "trajectories": self.trajectories, "successful": self.successful}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = [tuple(item) for item in state_dict.get("history", [])]
        self.trajectories = int(state_dict.get("trajectories", 0))
        self.successful = int(state_dict.get("successful", 0))


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
