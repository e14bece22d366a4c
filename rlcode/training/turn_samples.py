"""Episodes -> training samples: one row per turn the trained policy played.

A row is (the context tokens the backend encoded for that turn, the tokens it sampled), exactly as
generated: observations, feedback and the other player's words are context, never trained. Its
reward is the return of the turn's player in that episode; the advantage estimator (group-relative
over episodes of one problem, or RAE's role baselines) turns returns into advantages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rlcode.training.step_record import StepRecord
from rlcode.rollout.assembly import batch_from_token_lists

if TYPE_CHECKING:
    from torch import Tensor

    from rlcode.envs.runner import Episode, TurnRecord
    from rlcode.rollout.base import RolloutBatch


def turn_return(episode: Episode, turn: TurnRecord) -> float:
    """What one turn earned: its own ``info["return"]`` when it has one (the code game's K predictions
    of one program each earn their own), else its player's return in the episode (NaN: none)."""
    return float(turn.info.get("return", episode.returns.get(turn.player, float("nan"))))


@dataclass
class EpisodeTurns:
    episodes: list[Episode]
    rollout: RolloutBatch
    """[N] one row per learner turn, episode by episode."""
    rows: list[tuple[int, int]]
    """(episode index, turn index) of each row."""

    @classmethod
    def from_episodes(cls, episodes: list[Episode], pad_token_id: int, device) -> EpisodeTurns:
        rows = [(e, t) for e, episode in enumerate(episodes) for t, turn in enumerate(episode.turns) if turn.learner]
        # No rows happens (every game ended before the policy's first turn): the step then has no update.
        turns = [episodes[e].turns[t] for e, t in rows]
        # The sampler's log-probs (vLLM) travel with the turns: the importance correction needs every row's.
        sampler_logps = [turn.sampling_logps for turn in turns]
        with_logps = bool(turns) and all(logps is not None for logps in sampler_logps)
        rollout = batch_from_token_lists(
            prompt_ids=[turn.prompt_ids for turn in turns], completion_ids=[turn.completion_ids for turn in turns],
            ended=[not turn.truncated for turn in turns], completion_texts=[turn.text for turn in turns],
            pad_token_id=pad_token_id, device=device, sampling_logps=sampler_logps if with_logps else None)
        return cls(episodes, rollout, rows)

    def returns(self) -> list[float]:
        """Each row's ``turn_return``."""
        return [turn_return(self.episodes[e], self.episodes[e].turns[t]) for e, t in self.rows]

    def rewards(self, device) -> Tensor:
        return torch.tensor(self.returns(), dtype=torch.float32, device=device)

    def record(self, *, step, advantages, updated, loss, totals, frac_zero_std, timings, extra_metrics) -> StepRecord:
        turns = [self.episodes[e].turns[t] for e, t in self.rows]
        returns = self.returns()
        return StepRecord(
            step=step, group_size=1, task_ids=[f"{self.episodes[e].game}#{e}" for e, _ in self.rows],
            prompts=[turn.prompt_text for turn in turns], completions=[turn.text for turn in turns],
            rewards=returns, rewards_by_function={"return": returns},
            details=[_describe(turn.info) for turn in turns], advantages=advantages.tolist(),
            completion_lengths=[len(turn.completion_ids) for turn in turns], truncated=[t.truncated for t in turns],
            frac_reward_zero_std=frac_zero_std, updated=updated, loss=loss, reward_metrics=totals.metrics(),
            timings=timings, episodes=[episode_json(e) for e in self.episodes], extra_metrics=extra_metrics,
            episode_of_row=[e for e, _ in self.rows])


def episode_json(episode: Episode) -> dict:
    """A whole game for the rollout log: each turn's player, what it saw, said and the parsed move."""
    return {"game": episode.game, "seed": episode.seed, "learner_seats": list(episode.learner_seats),
            "returns": {str(k): v for k, v in episode.returns.items()}, "success": episode.success,
            "turns": [{"player": turn.player, "learner": turn.learner, "observation": turn.messages[-1]["content"],
                       "reply": turn.text, **_turn_outcome(turn.info)} for turn in episode.turns]}


def _turn_outcome(info: dict) -> dict:
    """A game turn's parsed move, a code-game turn's verdict (the writer's program valid or not and its
    output, a prediction right or not), or a coding attempt's verdict and the feedback it got."""
    if "move" in info:
        return {"move": info.get("move"), "valid": info.get("valid"), "reason": info.get("reason", "")}
    if info.get("role") in ("writer", "predictor"):
        keys = ("role", "valid", "reason", "output", "correct", "expected")
        return {key: info[key] for key in keys if key in info}
    return {key: info[key] for key in ("attempt", "verdict", "feedback", "success") if key in info}


def _describe(info: dict) -> str:
    if "verdict" in info:
        return f"attempt {info.get('attempt')}: {info['verdict']}"
    if info.get("valid"):
        return f"move {info.get('move')}"
    return f"invalid: {info.get('reason', '')}"
