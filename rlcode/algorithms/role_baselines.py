"""Role-conditioned Advantage Estimation (RAE, SPIRAL arXiv 2506.24119).

In a two-player game the seats are not alike (in TicTacToe the first mover wins more often), so one
baseline for every return would credit a seat for its position. RAE keeps one exponential moving
average of the return per (game, role):

    advantage = return - b[game, role]       (b read before this episode updates it)
    b[game, role] <- decay * b[game, role] + (1 - decay) * return

Baselines start at 0 with decay 0.95, as in SPIRAL. Every turn a role played in an episode gets that
episode's advantage for the role. Episodes are folded in a fixed order (the order they were played;
under DDP rank 0's first, then rank 1's, ...), so the baselines are the same on every rank and
resume exactly from a checkpoint (``state_dict``).
"""

from __future__ import annotations

from collections.abc import Iterable


class RoleBaselines:
    def __init__(self, decay: float = 0.95) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"RAE decay must be in (0, 1), got {decay}: SPIRAL uses 0.95")
        self.decay = decay
        self.values: dict[str, float] = {}  # "<game>/<role>" -> baseline

    def advantages(self, returns: Iterable[tuple[str, int, float]]) -> list[float]:
        """(game, role, return) per trained (episode, role), in episode order -> one advantage each."""
        out = []
        for game, role, value in returns:
            key = f"{game}/{role}"
            baseline = self.values.get(key, 0.0)
            out.append(value - baseline)
            self.values[key] = self.decay * baseline + (1.0 - self.decay) * value
        return out

    def state_dict(self) -> dict:
        return {"decay": self.decay, "values": dict(self.values)}

    def load_state_dict(self, state: dict) -> None:
        self.decay = float(state.get("decay", self.decay))
        self.values = {str(k): float(v) for k, v in state.get("values", {}).items()}
