"""A two-player TextArena game as an ``Environment``, with SPIRAL's observations, moves and rewards.

The rules are TextArena's (``textarena`` 0.7: ``TicTacToe-v0``, ``KuhnPoker-v0``,
``SimpleNegotiation-v0``); this wrapper only decides what a player sees and what ends a game:

- Observation (as SPIRAL): TicTacToe shows the first and the last observation (the rules and the
  current board), the other games the whole history; one user message says the player is in a
  two-player zero-sum game and where to put its move.
- Move: parsed from the reply (``rlcode.envs.moves``) and checked against the turn's legal moves.
  An invalid move ends the game: ``invalid_move_penalty`` (-1.5) to the offender,
  ``invalid_move_bonus`` (+0.5) to the other player. TextArena's own check is kept as a second
  line (its error allowance set to 0, as SPIRAL does), with the same rewards.
- End: win +1, loss -1, draw 0 (TextArena's rewards); ``max_turns`` reached counts as a draw.
"""

from __future__ import annotations

from rlcode.envs.base import StepResult, Turn
from rlcode.envs.moves import LegalMoves, MoveFormat, legal_moves, parse_move

GAMES = ("TicTacToe-v0", "KuhnPoker-v0", "SimpleNegotiation-v0")
FIRST_LAST_OBSERVATION = ("TicTacToe",)  # board games: the rules and the board are all a player needs

_INSTRUCTIONS = {
    "boxed": "Please reason step by step, and put your final answer within \\boxed{}.",
    # No example move: a small model copies it (SmolLM2 answered "[4]" on every board).
    "bracket": "Reply with one of your available moves, written in brackets as the game lists them.",
}


def game_prompt(observation: str, move_format: MoveFormat) -> str:
    """The user message of a turn (SPIRAL's wording for ``boxed``)."""
    return ("You are playing a two-player zero-sum game. Make valid actions to win.\n"
            f"Observation: {observation}\n{_INSTRUCTIONS[move_format]}")


class TextArenaGame:
    def __init__(self, game: str, *, move_format: MoveFormat = "boxed", max_turns: int = 50,
                 invalid_move_penalty: float = -1.5, invalid_move_bonus: float = 0.5) -> None:
        """One episode at a time of a two-player TextArena game.

        Args:
            game: a TextArena id (``TicTacToe-v0``, ``KuhnPoker-v0``, ``SimpleNegotiation-v0``).
            move_format: ``"boxed"`` (SPIRAL: the last ``\\boxed{}``) or ``"bracket"`` (lenient: the
                first legal ``[move]`` in the reply).
            max_turns: turns (both players together) after which the game is a draw.
            invalid_move_penalty: return of a player whose move is invalid (the game ends).
            invalid_move_bonus: return of the other player then.
        """
        import textarena  # imported here: ~0.5 s, and only game modes need it

        if game not in textarena.envs.registration.ENV_REGISTRY:
            raise ValueError(f"unknown TextArena game {game!r}: try one of {', '.join(GAMES)}")
        self.name = game
        self.move_format = move_format
        self.max_turns = max_turns
        self.invalid_move_penalty = invalid_move_penalty
        self.invalid_move_bonus = invalid_move_bonus
        self._textarena = textarena
        self._env = None
        self._turns = 0
        self._player = 0
        self._observation = ""

    def reset(self, seed: int) -> Turn:
        from textarena.wrappers.ObservationWrappers.llm_observation_wrapper import (
            FirstLastObservationWrapper, LLMObservationWrapper)

        first_last = self.name.startswith(FIRST_LAST_OBSERVATION)
        raw = self._textarena.make(self.name + "-raw")  # no default wrappers: observations are ours
        self._env = (FirstLastObservationWrapper if first_last else LLMObservationWrapper)(raw)
        self._env.reset(num_players=2, seed=seed)
        self._env.state.error_allowance = 0  # an invalid move ends the game (SPIRAL)
        self._turns = 0
        return self._turn()

    def legal_moves(self) -> LegalMoves:
        """The current player's legal moves (what a random legal opponent picks from)."""
        return legal_moves(self.name, self._observation, self._player)

    def step(self, answer: str) -> StepResult:
        player = self._player
        move, reason = parse_move(answer, self.legal_moves(), self.move_format)
        info = {"player": player, "move": move, "valid": move is not None, "reason": reason}
        self._turns += 1
        if move is None:
            return StepResult(None, self._invalid(player), info)
        done, _ = self._env.step(action=move)
        if self._env.state.game_info[player].get("invalid_move"):  # TextArena's own rules said no
            info.update(valid=False, reason=str(self._env.state.game_info[player].get("reason", "invalid")))
            self._env.close()
            return StepResult(None, self._invalid(player), info)
        if done:
            rewards, _ = self._env.close()
            return StepResult(None, {int(p): float(r) for p, r in (rewards or {}).items()}, info)
        if self._turns >= self.max_turns:
            self._env.close()
            info["reason"] = "turn cap: draw"
            return StepResult(None, {0: 0.0, 1: 0.0}, info)
        return StepResult(self._turn(), None, info)

    def _turn(self) -> Turn:
        self._player, self._observation = self._env.get_observation()
        text = game_prompt(self._observation.strip(), self.move_format)
        return Turn(self._player, [{"role": "user", "content": text}])

    def _invalid(self, offender: int) -> dict[int, float]:
        return {offender: self.invalid_move_penalty, 1 - offender: self.invalid_move_bonus}
