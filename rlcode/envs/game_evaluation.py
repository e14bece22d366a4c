"""Games against a random legal mover, from both seats: win, draw, loss and invalid-move rates.

SPIRAL's first measure of a game-playing policy. A game the policy loses by an invalid move counts as
a loss and as an invalid move; ``win`` means a positive return for the policy's seat.
"""

from __future__ import annotations

from collections import defaultdict

from rlcode.envs.opponents import RandomLegalMover
from rlcode.envs.runner import Episode, EpisodeRunner

RATES = ("win_rate", "draw_rate", "loss_rate", "invalid_move_rate")


def play_against_random(envs, render, generate, batch: dict, seed: int = 0) -> list[Episode]:
    """Play ``envs`` (one per episode of ``batch``: game, seed, seat) with the policy (``render``,
    ``generate``: see ``EpisodeRunner``) against random moves."""
    runner = EpisodeRunner(render, generate, opponent=RandomLegalMover())
    return runner.play(envs, batch["seed"], [(seat,) for seat in batch["seat"]], sampling_seed=seed)


def outcome_rates(episodes: list[Episode]) -> dict[str, dict[str, float]]:
    """game -> the four rates over its episodes (the policy's seat in each)."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for episode in episodes:
        seat = episode.learner_seats[0]
        result = episode.returns.get(seat, 0.0)
        invalid = any(turn.learner and turn.info.get("valid") is False for turn in episode.turns)
        tally = counts[episode.game]
        tally["episodes"] += 1
        tally["invalid_move_rate"] += invalid
        tally["win_rate"] += result > 0
        tally["draw_rate"] += result == 0
        tally["loss_rate"] += result < 0
    return {game: {rate: tally[rate] / tally["episodes"] for rate in RATES} for game, tally in counts.items()}


def rate_metrics(rates: dict[str, dict[str, float]]) -> dict[str, float]:
    """``spiral/<game>/<rate>`` scalars."""
    return {f"spiral/{game}/{rate}": value for game, per_game in rates.items() for rate, value in per_game.items()}


def eval_report(step: int, episodes: list[Episode], opponent: str = "random") -> dict:
    """An eval's file: per game and opponent the four rates and the episode count, then every episode
    (the policy's seat, outcome, whether it made an invalid move, and each turn's text and move)."""
    rates = outcome_rates(episodes)
    counts = defaultdict(int)
    for episode in episodes:
        counts[episode.game] += 1
    return {"step": step,
            "games": {game: {opponent: {**per_game, "episodes": counts[game]}} for game, per_game in rates.items()},
            "episodes": [_episode_json(episode, opponent) for episode in episodes]}


def _episode_json(episode: Episode, opponent: str) -> dict:
    seat = episode.learner_seats[0]
    result = episode.returns.get(seat, 0.0)
    return {"game": episode.game, "seed": episode.seed, "seat": seat, "opponent": opponent,
            "outcome": "win" if result > 0 else "loss" if result < 0 else "draw", "return": result,
            "invalid_move": any(turn.learner and turn.info.get("valid") is False for turn in episode.turns),
            "turns": [{"player": turn.player, "policy": turn.learner, "text": turn.text,
                       **{key: turn.info[key] for key in ("move", "valid", "reason") if key in turn.info}}
                      for turn in episode.turns]}
