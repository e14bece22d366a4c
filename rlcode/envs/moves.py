"""Moves in text games: the model's reply -> the game's bracketed move, and the legal moves of a turn.

As in SPIRAL (arXiv 2506.24119): the move is the content of the last ``\\boxed{}`` in the reply,
written in the game's bracket syntax (``\\boxed{4}`` -> ``[4]``, ``\\boxed{[bet]}`` -> ``[bet]``) with
whitespace collapsed, and it must be one of the turn's legal moves. A reply without a legal move is an
invalid move. The ``"bracket"`` format is a lenient option for small models (measured: SmolLM2-135M
almost never writes a legal ``\\boxed{}`` move, but a quarter of its replies hold a legal ``[4]``):
the first legal bracketed move anywhere in the reply counts.

Legal moves are read from the observation TextArena writes (the game's own rules decide them):
TicTacToe's ``Available Moves:`` line, Kuhn Poker's ``available actions are:`` line; Simple
Negotiation has no list, so its moves are checked by form (an offer of resources the player holds,
or ``[Accept]``/``[Deny]`` when an offer to the player is open).
"""

from __future__ import annotations

import re
from typing import Literal

MoveFormat = Literal["boxed", "bracket"]

_BRACKETED = re.compile(r"\[[^\[\]]*\]")
_TICTACTOE_MOVES = re.compile(r"Available Moves:([^\n]*)")
_KUHN_ACTIONS = re.compile(r"available actions are:([^\n]*)")
_QUOTED_MOVE = re.compile(r"'(\[[^\]]*\])'")
_RESOURCE = re.compile(r"\[(\w+)\]\s+Qty:\s+(\d+)")
_OFFER = re.compile(r"^\[Offer:\s*(.+?)\s*->\s*(.+?)\s*\]$", re.IGNORECASE)
_ITEM = re.compile(r"^(\d+)\s+(\w+)$")
_OFFER_TO = re.compile(r"Player (\d+) made the following offer to Player (\d+)")
_OFFER_CLOSED = re.compile(r"(accepted|rejected|denied)", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    opening = text.find("{", start)
    if opening < 0:
        return None
    depth = 0
    for position in range(opening, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[opening + 1:position]
    return None


def normalise(move: str) -> str:
    """``4`` -> ``[4]``, ``\\text{[ bet ]}`` -> ``[bet]``: bracket syntax, single spaces."""
    move = re.sub(r"\\text\{([^}]*)\}", r"\1", move).strip()
    move = re.sub(r"\s+", " ", move)
    if not (move.startswith("[") and move.endswith("]")):
        move = f"[{move}]"
    return re.sub(r"\[\s+|\s+\]", lambda m: m.group(0).strip(), move)


def parse_move(reply: str, legal: "LegalMoves", move_format: MoveFormat = "boxed") -> tuple[str | None, str]:
    """(the move, "") or (None, why it is invalid)."""
    if move_format == "boxed":
        boxed = last_boxed(reply)
        if boxed is None:
            return None, "no \\boxed{} move"
        move = normalise(boxed)
        return (move, "") if legal.allows(move) else (None, f"illegal move {move}")
    for candidate in _BRACKETED.findall(reply):
        move = normalise(candidate)
        if legal.allows(move):
            return move, ""
    return None, "no legal [move]"


class LegalMoves:
    """The moves allowed at one turn: a list where the game prints one, else a check by form."""

    def __init__(self, listed: list[str] | None = None, resources: dict[str, int] | None = None,
                 offer_open: bool = False) -> None:
        self.listed = listed
        self.resources = resources or {}
        self.offer_open = offer_open

    def allows(self, move: str) -> bool:
        if self.listed is not None:
            return move.lower() in {m.lower() for m in self.listed}
        lowered = move.lower()
        if lowered in ("[accept]", "[deny]"):
            return self.offer_open
        offer = _OFFER.match(move)
        if not offer:
            return False
        offered, requested = (_items(part) for part in offer.groups())
        known = {name.lower() for name in self.resources}
        return (offered is not None and requested is not None and bool(offered) and bool(requested)
                and all(name.lower() in known for name, _ in offered + requested)
                and all(count <= self._held(name) for name, count in offered))

    def examples(self) -> list[str]:
        """Moves a random legal player may pick from (listed ones, or simple offers and replies)."""
        if self.listed is not None:
            return list(self.listed)
        moves = ["[Accept]", "[Deny]"] if self.offer_open else []
        names = sorted(self.resources)
        for give in names:
            for take in names:
                if give != take and self.resources[give] > 0:
                    moves.append(f"[Offer: 1 {give} -> 1 {take}]")
        return moves

    def _held(self, name: str) -> int:
        return next((count for key, count in self.resources.items() if key.lower() == name.lower()), 0)


def _items(part: str) -> list[tuple[str, int]] | None:
    items = []
    for piece in part.split(","):
        match = _ITEM.match(piece.strip())
        if not match or int(match.group(1)) < 1:
            return None
        items.append((match.group(2), int(match.group(1))))
    return items


def legal_moves(game: str, observation: str, player: int) -> LegalMoves:
    """The legal moves of ``player`` given the text TextArena showed it (``game``: a TextArena id)."""
    if game.startswith("TicTacToe"):
        return LegalMoves(listed=_last_quoted_list(_TICTACTOE_MOVES, observation))
    if game.startswith("KuhnPoker"):
        return LegalMoves(listed=_last_quoted_list(_KUHN_ACTIONS, observation))
    if game.startswith("SimpleNegotiation"):
        resources = {name: int(count) for name, count in _RESOURCE.findall(observation)}
        offers = list(_OFFER_TO.finditer(observation))
        open_offer = bool(offers) and int(offers[-1].group(2)) == player and \
            not _OFFER_CLOSED.search(observation[offers[-1].end():])
        return LegalMoves(resources=resources, offer_open=open_offer)
    raise ValueError(f"no legal-move reader for {game!r}: supported games are TicTacToe, KuhnPoker, "
                     "SimpleNegotiation (add a reader in rlcode/envs/moves.py)")


def _last_quoted_list(pattern: re.Pattern, observation: str) -> list[str]:
    lines = pattern.findall(observation)
    return _QUOTED_MOVE.findall(lines[-1]) if lines else []
