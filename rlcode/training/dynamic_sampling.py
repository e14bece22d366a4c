"""Dynamic sampling (DAPO, arXiv 2503.14476; verl's ``filter_groups``): generate again until the step
has its number of groups with a learning signal.

A group whose rewards are all equal has advantage 0 everywhere: it costs its generation and teaches
nothing. When some of a step's P groups come back flat, further prompts are drawn (the DataModule's
``extra_batch``: a deterministic function of the step and the round, so a resumed run draws the same),
generated and scored, round after round, until P groups with signal are found or ``max_extra_rounds``
extra rounds have run. The step then trains on P groups: those with signal in the order they came,
and, when the cap was reached first, flat groups of the first round to fill up, so that every step
has the same number of rows (flat groups add nothing to the gradient; they keep the shapes and the
loss normalisers of a step without dynamic sampling).

A step that drew extra rounds describes the rows it trains: each sandbox reward's metrics (mean,
status counts, successes: the step line's counts) are recomputed from those rows, and a reward that
keeps no per-row record loses its metrics for that step rather than report another round's. Its
``perf/tokens_per_s`` counts every round's tokens, as its time counts every round's generation.

Simplification, stated: DAPO draws whole extra batches and trains on fewer groups when its cap is hit;
this keeps P groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import torch

from rlcode.algorithms.advantages import zero_std_group_mask
from rlcode.rewards.base import row_metrics
from rlcode.rewards.mixture import RewardOutcome
from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.setting import COUNT, check_arguments, field_of
from rlcode.training.experience import CompletionGroups


@dataclass
class DynamicSampling:
    """Generate again while groups come back flat (``model.mode.init_args.dynamic_sampling``).

    Args:
        max_extra_rounds: generation rounds a step may add to its first (each of the step's prompt
            count); a step with too few groups with signal after them trains on what it has.
    """

    max_extra_rounds: Annotated[int, field_of(COUNT)] = 3  # to turn it off, leave dynamic_sampling unset

    def __post_init__(self) -> None:
        check_arguments(DynamicSampling, vars(self), prefix="model.mode.dynamic_sampling.")


def with_signal(first: CompletionGroups, more: Callable[[int], CompletionGroups], settings: DynamicSampling,
                pad_token_id: int) -> CompletionGroups:
    """The step's groups: ``first``'s, topped up from ``more(round)`` (round 1, 2, ...) while flat."""
    group, wanted = first.group_size, len(first.prompts)
    rounds, signal = [first], [_signal_groups(first)]
    while sum(map(len, signal)) < wanted and len(rounds) <= settings.max_extra_rounds:
        rounds.append(more(len(rounds)))
        signal.append(_signal_groups(rounds[-1]))
    kept = [(r, g) for r, groups in enumerate(signal) for g in groups][:wanted]
    metrics = {"dynamic_sampling/rounds": float(len(rounds)),
               "dynamic_sampling/prompts": float(sum(len(r.prompts) for r in rounds)),
               "dynamic_sampling/signal_groups": float(len(kept))}
    if len(rounds) == 1:  # nothing was flat: the step is exactly as without dynamic sampling
        first.outcome.metrics.update(metrics)
        return first
    kept += [(0, g) for g in range(wanted) if g not in signal[0]][: wanted - len(kept)]  # cap hit: fill up
    return _combine(rounds, kept, group, pad_token_id, metrics)


def _signal_groups(groups: CompletionGroups) -> list[int]:
    """Indices of the groups whose rewards are not all equal (waits for the rewards)."""
    if groups.outcome is None:
        groups.rewards("cpu")
    flat = zero_std_group_mask(torch.tensor(groups.outcome.total, dtype=torch.float64), groups.group_size)
    return [g for g in range(len(groups.prompts)) if not bool(flat[g * groups.group_size])]


def _combine(rounds: list[CompletionGroups], kept: list[tuple[int, int]], group: int, pad_token_id: int,
             metrics: dict[str, float]) -> CompletionGroups:
    rows = [(r, g * group + i) for r, g in kept for i in range(group)]
    batches = [rounds[r].rollout for r in range(len(rounds))]

    def tokens(batch, row, ids, mask):
        return getattr(batch, ids)[row][getattr(batch, mask)[row].bool()].tolist()

    with_logps = all(b.sampling_logps is not None for b in batches)
    device = batches[0].prompt_ids.device
    rollout = batch_from_token_lists(
        prompt_ids=[tokens(batches[r], i, "prompt_ids", "prompt_mask") for r, i in rows],
        completion_ids=[tokens(batches[r], i, "completion_ids", "completion_mask") for r, i in rows],
        ended=[not bool(batches[r].truncated[i]) for r, i in rows],
        completion_texts=[batches[r].completion_texts[i] for r, i in rows],
        pad_token_id=pad_token_id, device=device,
        sampling_logps=[tokens(batches[r], i, "sampling_logps", "completion_mask") for r, i in rows]
        if with_logps else None)
    outcomes = [rounds[r].outcome for r in range(len(rounds))]
    names = list(outcomes[0].by_function)
    scored = {name: [outcomes[r].scored[name][i] for r, i in rows]
              for name in outcomes[0].scored if all(name in o.scored for o in outcomes)}
    outcome = RewardOutcome(
        total=[outcomes[r].total[i] for r, i in rows],
        by_function={name: [outcomes[r].by_function[name][i] for r, i in rows] for name in names},
        details=[outcomes[r].details[i] for r, i in rows],
        metrics={**kept_metrics(scored), **metrics},
        seconds=sum(o.seconds for o in outcomes if not math.isnan(o.seconds)), scored=scored)
    return CompletionGroups(rollout, [rounds[r].prompts[g] for r, g in kept], [rounds[r].task_ids[g] for r, g in kept],
                            group, None, outcome,  # every round awaited: no job left
                            generated_tokens=sum(b.num_generated_tokens for b in batches))


def kept_metrics(scored: dict[str, list]) -> dict[str, float]:
    """Each reward's ``<name>/<metric>`` over the kept rows (never the first round's: its rows may
    not be the ones trained)."""
    return {f"{name}/{key}": value for name, rows in scored.items() for key, value in row_metrics(rows).items()}
