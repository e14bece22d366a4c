"""Plays many episodes at once, batching generation across them.

Each round, every live episode's pending turn is collected: the learner's turns go to the rollout
backend in one call (not one episode at a time), the opponent's turns (a random legal mover, a frozen
copy of the policy) in one call of their own. Episodes end at different times; a round holds whatever
is still live. Every model turn keeps the exact token ids the backend encoded and sampled, so the
training sample is what was generated (no re-tokenisation drift), and the sampler's log-probs of
them when it is not the policy itself (vLLM), so the importance-sampling correction applies to turns. Environments with a ``prepare``
method (an answer to run in the sandbox) get every answer of a round before any ``step`` waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from rlcode.envs.base import Environment, Turn
from rlcode.rollout.base import RolloutBatch


@dataclass
class TurnRecord:
    """One player's turn: what it saw and said, and, for a model's turn, the exact tokens."""

    player: int
    messages: list[dict[str, str]]
    text: str
    info: dict[str, Any] = field(default_factory=dict)
    prompt_text: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    truncated: bool = False
    learner: bool = False
    """Played by the policy being trained (its turns become training samples)."""
    sampling_logps: list[float] | None = None
    """The sampler's log-prob of each completion token (vLLM; None: the sampler is the policy itself),
    for the importance-sampling correction of the turn's sample."""


@dataclass
class Episode:
    game: str
    seed: int
    learner_seats: tuple[int, ...]
    turns: list[TurnRecord] = field(default_factory=list)
    returns: dict[int, float] = field(default_factory=dict)
    success: bool | None = None
    """Whether the task was solved, for environments that have a notion of it (multi-step MBPP)."""


class Opponent(Protocol):
    def act(self, envs: Sequence[Environment], turns: Sequence[Turn], seed: int) -> list[str]:
        """One answer per pending turn (one batched call per round)."""
        ...


class EpisodeRunner:
    def __init__(self, render: Callable[[list[dict[str, str]]], str],
                 generate: Callable[[list[str], int], RolloutBatch], opponent: Opponent | None = None) -> None:
        """Play episodes with the policy in its seats and ``opponent`` in the others.

        Args:
            render: chat messages -> the prompt string the backend encodes (the chat template).
            generate: (rendered prompts, seed) -> one completion each (a ``RolloutBatch``).
            opponent: answers the turns of seats the policy does not hold (None: self-play only).
        """
        self.render = render
        self.generate = generate
        self.opponent = opponent
        self.backend_calls = 0

    def play(self, envs: Sequence[Environment], seeds: Sequence[int], learner_seats: Sequence[tuple[int, ...]],
             sampling_seed: int = 0) -> list[Episode]:
        episodes = [Episode(env.name, seed, tuple(seats)) for env, seed, seats in zip(envs, seeds, learner_seats)]
        pending: dict[int, Turn] = {i: env.reset(seed) for i, (env, seed) in enumerate(zip(envs, seeds))}
        round_index = 0
        while pending:
            learner = [i for i, turn in pending.items() if turn.player in episodes[i].learner_seats]
            others = [i for i in pending if i not in learner]
            if others and self.opponent is None:
                raise ValueError("a seat without the learner needs an opponent: configure one or train every seat")
            records: dict[int, TurnRecord] = {}
            if learner:
                records.update(zip(learner, self._policy_turns([pending[i] for i in learner],
                                                               sampling_seed * 1009 + round_index)))
            if others:
                answers = self.opponent.act([envs[i] for i in others], [pending[i] for i in others],
                                            sampling_seed * 1009 + round_index)
                records.update({i: TurnRecord(pending[i].player, pending[i].messages, text)
                                for i, text in zip(others, answers)})
            for i in sorted(records):  # environments that wait on something (the sandbox) start first
                if callable(getattr(envs[i], "prepare", None)):
                    envs[i].prepare(records[i].text)
            for i in sorted(records):
                record = records[i]
                result = envs[i].step(record.text)
                record.info = result.info
                episodes[i].turns.append(record)
                if result.done:
                    episodes[i].returns = dict(result.returns or {})
                    episodes[i].success = result.info.get("success")
                    del pending[i]
                else:
                    pending[i] = result.next_turn
            round_index += 1
        return episodes

    def _policy_turns(self, turns: list[Turn], seed: int) -> list[TurnRecord]:
        prompts = [self.render(turn.messages) for turn in turns]
        rollout = self.generate(prompts, seed)
        self.backend_calls += 1
        records = []
        for row, (turn, prompt) in enumerate(zip(turns, prompts)):
            length = int(rollout.completion_mask[row].sum())
            records.append(TurnRecord(
                player=turn.player, messages=turn.messages, text=rollout.completion_texts[row], prompt_text=prompt,
                prompt_ids=rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist(),
                completion_ids=rollout.completion_ids[row][:length].tolist(),
                truncated=bool(rollout.truncated[row]), learner=True,
                sampling_logps=None if rollout.sampling_logps is None else rollout.sampling_logps[row][:length].tolist()))
        return records
