"""A training step given up before its update changes the weights, when a stop signal arrives while it
collects rollouts, waits for rewards or runs the update's first pass.

Generation is most of a step on CPU (minutes with long completions) and SLURM kills 30 s after its
SIGTERM, so a step does not finish its collection once a stop is asked: the HF decode loop ends its
rows at the next token (``StopToken.collecting``), the ranks agree after the collection
(``StopPoint.AFTER_COLLECT``, one all-reduce per step), and the step leaves no trace. What it
changed is put back as the step found it: the mode's state, the data's (the stream position, a curriculum's estimates)
and, for the checkpoint, the random generators. The resumed run redoes the step on the same batch
with the same sampling seeds (a function of the seed, the step and the rank) and ends as a run never
stopped would. The update asks again before each micro-batch of its first pass
(``StopPoint.BEFORE_MICRO_BATCH``, raising ``rlcode.stopping.Stopped``): until the first optimizer
step only gradients have changed, and they are cleared. After it the step finishes (with ``num_iterations > 1``, its remaining passes): the
weights and optimizer moments would have to be copied to be put back. Under FSDP the update asks only
before its first micro-batch (unsynced sharded gradients are out of the optimizer's reach).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from rlcode.training.resume_state import rng_states


@dataclass(frozen=True)
class StepStart:
    """What a step may change before its update, as the step found it."""

    rng: dict[str, Any]
    mode: dict[str, Any]
    data: dict[str, Any] | None


def step_start(mode, datamodule, batch) -> StepStart:
    """Taken as the step begins; the DataModule has already moved past ``batch``, so its state is the
    one from before the batch (``state_before``)."""
    state_before = getattr(datamodule, "state_before", None)
    data = copy.deepcopy(state_before(batch)) if callable(state_before) else None
    return StepStart(rng=rng_states(), mode=copy.deepcopy(mode.state_dict()), data=data)


def abandon(start: StepStart, experience, mode, datamodule, device) -> None:
    """Let the step's sandbox jobs end (bounded by their timeouts), then put its state back."""
    experience.rewards(device)
    mode.load_state_dict(start.mode)
    if start.data is not None:
        datamodule.load_state_dict(start.data)
