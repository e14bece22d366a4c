"""Sampled rollouts, to read what the model actually writes: ``rollouts.jsonl`` and a logger table.

Every ``every_n_steps`` steps, ``samples_per_step`` completions of each rank (spread over its groups)
are written with their prompt, reward, per-function rewards, advantage and verdict, one JSON object
per line in ``<run dir>/rollouts.jsonl``; a W&B logger also gets them as a table. Under DDP and FSDP
rank zero gathers every rank's rows (each row says its ``rank``), so the file shows every prompt.
"""

from __future__ import annotations

import json
from typing import Annotated

import lightning as L
import torch

from rlcode.run_dir import run_directory
from rlcode.setting import COUNT_OR_ZERO, free
from rlcode.training.step_record import StepRecord

COLUMNS = ("step", "task_id", "prompt", "completion", "reward", "advantage", "verdict")


def sample_rows(record: StepRecord, count: int) -> list[dict]:
    """Up to ``count`` completions: the first of each group, then the second, ... (every prompt shows)."""
    order = [index for rank in range(record.group_size) for index in
             (group[rank] for group in record.groups())]
    rows = []
    for index in order[:count]:
        prompt = index // record.group_size
        rows.append({
            "step": record.step,
            "task_id": record.task_ids[prompt],
            "prompt": record.prompts[prompt],
            "completion": record.completions[index],
            "reward": record.rewards[index],
            "rewards": {name: values[index] for name, values in record.rewards_by_function.items()},
            "advantage": record.advantages[index],
            "verdict": record.details[index] if index < len(record.details) else "",
            "truncated": record.truncated[index],
            # with a hidden-test reward: passed the shown asserts only (special-cased them)
            **({"hardcoded": record.hardcoded[index]} if record.hardcoded else {}),
        })
    return rows


class RolloutLogging(L.Callback):
    def __init__(self, every_n_steps: Annotated[int, free(COUNT_OR_ZERO)] = 1,
                 samples_per_step: Annotated[int, free(COUNT_OR_ZERO)] = 4) -> None:
        """Write sampled completions to ``rollouts.jsonl`` (and a W&B table when W&B logs).

        Args:
            every_n_steps: steps between samples (0: never).
            samples_per_step: completions kept per sampled step.
        """
        self.every_n_steps = every_n_steps
        self.samples_per_step = samples_per_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record: StepRecord | None = pl_module.history.last_step
        if record is None or not self.every_n_steps or record.step % self.every_n_steps:
            return
        # Multi-turn modes: whole episodes (every turn's player, observation, reply and move).
        rows = record.episodes[:self.samples_per_step] if record.episodes else sample_rows(record, self.samples_per_step)
        if record.episodes:
            rows = [{"step": record.step, **row} for row in rows]
        rows = _every_rank(trainer, rows)  # every rank calls it: a collective
        if not trainer.is_global_zero:
            return
        path = run_directory(trainer) / "rollouts.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
        for logger in trainer.loggers:
            if hasattr(logger, "log_table") and not record.episodes:  # WandbLogger
                columns = [*COLUMNS, "hardcoded"] if record.hardcoded else list(COLUMNS)
                logger.log_table(key="rollouts", columns=columns,
                                 data=[[row.get(c) for c in columns] for row in rows], step=record.step)


def _every_rank(trainer, rows: list[dict]) -> list[dict]:
    """Every rank's rows in rank order, each with its ``rank``, on rank zero (one gather of Python
    objects); this rank's alone on one device."""
    if getattr(trainer, "world_size", 1) == 1 or not torch.distributed.is_initialized():
        return rows
    gathered = [None] * trainer.world_size if trainer.is_global_zero else None
    torch.distributed.gather_object(rows, gathered, dst=0)
    if not trainer.is_global_zero:
        return []
    return [{**row, "rank": rank} for rank, part in enumerate(gathered) for row in part]
