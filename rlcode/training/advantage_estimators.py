"""Advantage estimators as objects: how a mode turns the step's rewards into advantages.

An estimator answers two questions about the rows of one step (``rlcode.training.experience``):
which rows carry no learning signal (``flat_rows``: logged, and skipped by
``skip_zero_advantage_rows``), and each row's advantage. The maths is in ``rlcode.algorithms``
(``advantages.group_advantages``, ``role_baselines.RoleBaselines``); what is here is which values
form a group and how the ranks of a distributed run agree, so that every estimator gives on 2 ranks
what it gives on 1 rank on the combined batch:

- ``GroupRelative``: GRPO's. Groups are the G completions of a prompt (``CompletionGroups``) or the
  G episodes of a problem (``EpisodeTurns``, every turn taking its episode's advantage). With
  ``scale_rewards="batch"`` the std is over every rank's values.
- ``GroupRelativePerRole``: the same per seat of a two-player episode (the code game's writer and
  predictor): a seat's returns over the G episodes of a prompt; a seat that did not play gets 0. A
  seat that plays up to K turns per episode (the code game's K predictions of one program) is
  relative over the G x K turns of the prompt, each turn with its own return (``info["return"]``).
- ``RoleBaselineAdvantages``: SPIRAL's RAE: return minus a per-(game, role) moving average, folded
  over every rank's episodes in rank order, so the baselines are the same everywhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from rlcode.algorithms.advantages import RewardScaling, group_advantages, zero_std_group_mask
from rlcode.algorithms.role_baselines import RoleBaselines
from rlcode.training.turn_samples import EpisodeTurns, turn_return

if TYPE_CHECKING:
    from torch import Tensor

    from rlcode.training.all_ranks_totals import AllRanksTotals, Ranks
    from rlcode.training.experience import Experience


class AdvantageEstimator(ABC):
    def flat_rows(self, experience: Experience, rewards: Tensor) -> Tensor:
        """[N] bool: rows without a learning signal (default: none known)."""
        return torch.zeros_like(rewards, dtype=torch.bool)

    @abstractmethod
    def advantages(self, ranks: Ranks, experience: Experience, rewards: Tensor, totals: AllRanksTotals) -> Tensor:
        """[N] float32 advantages of the step's rows. Every rank calls it, in step: it may run collectives."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _episode_values(experience: EpisodeTurns, seat: int, device) -> Tensor:
    """[E] the return of ``seat`` in each episode (NaN: the seat did not play), prompt-major."""
    return torch.tensor([e.returns.get(seat, float("nan")) for e in experience.episodes], dtype=torch.float32,
                        device=device)


def _row_episodes(experience: EpisodeTurns) -> Tensor:
    """[N] the episode of each row (a long index, also when there are no rows)."""
    return torch.tensor([e for e, _ in experience.rows], dtype=torch.long)


class GroupRelative(AdvantageEstimator):
    def __init__(self, group_size: int, scale_rewards: RewardScaling = "group") -> None:
        """Group-relative advantages over groups of ``group_size`` (see the module docstring)."""
        self.group_size, self.scale_rewards = group_size, scale_rewards

    def flat_rows(self, experience, rewards):
        if not isinstance(experience, EpisodeTurns):
            return zero_std_group_mask(rewards, self.group_size)
        flat = zero_std_group_mask(_episode_values(experience, 0, rewards.device), self.group_size)
        return flat[_row_episodes(experience).to(flat.device)]

    def advantages(self, ranks, experience, rewards, totals):
        if not isinstance(experience, EpisodeTurns):  # the rows are the group members
            # the step's totals already hold the std of every rank's row rewards (one collective)
            return self._advantages(rewards, totals.reward_std)
        returns = _episode_values(experience, 0, rewards.device)
        per_episode = self._advantages(returns, ranks.std(returns) if self.scale_rewards == "batch" else None)
        return per_episode[_row_episodes(experience).to(per_episode.device)]

    def _advantages(self, values: Tensor, batch_std: float | None) -> Tensor:
        advantages, _ = group_advantages(values, self.group_size, self.scale_rewards, batch_std=batch_std)
        return advantages


class GroupRelativePerRole(GroupRelative):
    """Group-relative per seat of two-player episodes (``EpisodeTurns`` only)."""

    seats = (0, 1)

    def __init__(self, group_size: int, scale_rewards: RewardScaling = "group",
                 turns_per_seat: tuple[int, int] = (1, 1)) -> None:
        """``turns_per_seat``: the most turns each seat plays in one episode; a seat's group is the
        ``group_size`` x that many turns of a prompt (turns not played count as absent, NaN)."""
        super().__init__(group_size, scale_rewards)
        self.turns_per_seat = tuple(turns_per_seat)

    def flat_rows(self, experience, rewards):
        return torch.zeros_like(rewards, dtype=torch.bool)  # groups are per seat: a flat seat shows in its zeros

    def advantages(self, ranks, experience, rewards, totals):
        per_seat = {}
        for seat, turns in zip(self.seats, self.turns_per_seat):
            values = _turn_values(experience, seat, turns)
            batch_std = ranks.std(values.to(rewards.device)) if self.scale_rewards == "batch" else None
            advantages, _ = group_advantages(values, self.group_size * turns, self.scale_rewards, batch_std=batch_std)
            per_seat[seat] = advantages.view(-1, turns)  # [E, turns]
        values = []
        for e, t in experience.rows:
            turns = experience.episodes[e].turns
            player = turns[t].player
            nth = sum(r.player == player for r in turns[:t]) if per_seat[player].shape[1] > 1 else 0
            values.append(float(per_seat[player][e, nth]))
        return torch.tensor(values, dtype=torch.float32, device=rewards.device)


def _turn_values(experience: EpisodeTurns, seat: int, turns: int) -> Tensor:
    """[E * turns] the return of each of ``seat``'s turns in each episode, prompt-major (NaN: not
    played), each ``turn_return``."""
    if turns == 1:  # one value per episode: the seat's return
        return _episode_values(experience, seat, torch.device("cpu"))
    values = []
    for episode in experience.episodes:
        own = [turn_return(episode, turn) for turn in episode.turns if turn.player == seat]
        if len(own) > turns:
            raise ValueError(f"seat {seat} played {len(own)} turns in an episode; the estimator expects at most {turns}")
        values.extend(own + [float("nan")] * (turns - len(own)))
    return torch.tensor(values, dtype=torch.float32)


class RoleBaselineAdvantages(AdvantageEstimator):
    def __init__(self, decay: float = 0.95) -> None:
        """RAE (``rlcode.algorithms.role_baselines``). ``games``: the run's game names, whose order
        numbers them when episodes cross ranks (set by the mode from its DataModule)."""
        self.baselines = RoleBaselines(decay)
        self.games: list[str] = []

    def advantages(self, ranks, experience, rewards, totals):
        """Each trained (episode, seat) gets return - baseline, folded in over every rank in order."""
        index = {game: i for i, game in enumerate(self.games)}
        local = [(index[episode.game], seat, episode.returns.get(seat, 0.0))
                 for episode in experience.episodes for seat in episode.learner_seats]
        # (episodes x learner seats) is the same on every rank, so the gathered shapes agree
        gathered = ranks.gather(torch.tensor(local, dtype=torch.float64, device=rewards.device).reshape(-1, 3))
        ordered = [(int(g), int(s), float(r)) for rank in gathered.cpu().tolist() for g, s, r in rank]
        start = ranks.rank * len(local)
        values = self.baselines.advantages((self.games[g], seat, value) for g, seat, value in ordered)
        per_role = dict(zip([(e, seat) for e, episode in enumerate(experience.episodes)
                             for seat in episode.learner_seats], values[start:start + len(local)]))
        turns = [(e, experience.episodes[e].turns[t].player) for e, t in experience.rows]
        return torch.tensor([per_role[key] for key in turns], dtype=torch.float32, device=rewards.device)

    def state_dict(self):
        return self.baselines.state_dict()

    def load_state_dict(self, state):
        if state:
            self.baselines.load_state_dict(state)
