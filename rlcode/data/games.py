"""The game DataModule of SPIRAL self-play: which games are played at each step, resumably.

A training batch is ``episodes_per_step`` (game, seed) pairs for this rank: the game drawn from the
mixture ``weights``, the seed distinct for every (step, rank, episode) so no two episodes of a run
deal the same cards. The draw depends only on (seed, step, rank), so a resumed run plays what the
uninterrupted one would have: the position (the next step) is the DataModule's checkpoint state.

Evaluation batches (``rlcode validate`` and the game-eval callback) are per game: ``eval_episodes``
games with the policy in seat 0 and as many in seat 1, against a random legal mover.
"""

from __future__ import annotations

import random
from typing import Annotated, Any, Iterator

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from rlcode.setting import COUNT, NON_NEGATIVE, SEED, check_arguments, free

GameBatch = dict[str, list]  # "game", "seed" (and "seat" in evaluation): one entry per episode


class GameDataModule(L.LightningDataModule):
    def __init__(self, games: Annotated[list[str], free()] = ["TicTacToe-v0"],  # noqa: B006
                 weights: Annotated[list[float], free(NON_NEGATIVE)] | None = None,
                 episodes_per_step: Annotated[int, free(COUNT)] = 8, seed: Annotated[int, free(SEED)] = 0,
                 eval_episodes: Annotated[int, free(COUNT)] = 8, eval_seed: Annotated[int, free(SEED)] = 10_000) -> None:
        """Games for self-play training and evaluation.

        Args:
            games: TextArena game ids (``TicTacToe-v0``, ``KuhnPoker-v0``, ``SimpleNegotiation-v0``).
            weights: mixture weights, one per game (None: uniform).
            episodes_per_step: episodes each rank plays per training step.
            seed: seeds the games drawn and their deals.
            eval_episodes: evaluation episodes per game and seat.
            eval_seed: first deal of the evaluation games (the same deals at every evaluation).
        """
        super().__init__()
        check_arguments(GameDataModule, locals(), prefix="data.")  # Python callers; the CLI checked before building
        if not games:
            raise ValueError("data.games is empty: name at least one TextArena game, e.g. TicTacToe-v0")
        if weights is not None and (len(weights) != len(games) or min(weights) < 0 or sum(weights) <= 0):
            raise ValueError(f"data.weights must give one non-negative weight per game ({len(games)}), not all 0")
        self.games = list(games)
        self.weights = list(weights) if weights is not None else [1.0] * len(games)
        self.episodes_per_step = episodes_per_step
        self.seed = seed
        self.eval_episodes = eval_episodes
        self.eval_seed = eval_seed
        self.position = {"step": 0}

    @property
    def rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    def step_batch(self, step: int, rank: int) -> GameBatch:
        """The (game, seed) pairs of one rank at one step."""
        rng = random.Random(f"{self.seed}-{step}-{rank}")
        games = rng.choices(self.games, weights=self.weights, k=self.episodes_per_step)
        base = ((self.seed * 1_000_003 + step) * 1009 + rank) * self.episodes_per_step
        return {"game": games, "seed": [base + i for i in range(self.episodes_per_step)], "step": step}

    def eval_batches(self) -> list[GameBatch]:
        """One batch per game: ``eval_episodes`` deals with the policy in seat 0, the same in seat 1."""
        seeds = [self.eval_seed + i for i in range(self.eval_episodes)]
        return [{"game": [game] * (2 * len(seeds)), "seed": seeds * 2,
                 "seat": [0] * len(seeds) + [1] * len(seeds)} for game in self.games]

    def train_dataloader(self):
        return DataLoader(_GameStream(self), batch_size=None, num_workers=0)

    def val_dataloader(self):
        return DataLoader(self.eval_batches(), batch_size=None, num_workers=0)

    def test_dataloader(self):
        return self.val_dataloader()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, dict) and "step" in batch:  # the batch a training step is about to use
            self.position = {"step": batch["step"] + 1}
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"position": dict(self.position), "seed": self.seed}

    def state_before(self, batch) -> dict:
        """The state as it was before the training ``batch`` was taken (a step given up puts it back)."""
        return {**self.state_dict(), "position": {"step": batch["step"]}} if "step" in batch else self.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.position = dict(state_dict["position"])


class _GameStream(IterableDataset):
    def __init__(self, datamodule: GameDataModule) -> None:
        super().__init__()
        self.datamodule = datamodule

    def __iter__(self) -> Iterator[GameBatch]:
        step = self.datamodule.position["step"]
        while True:
            yield self.datamodule.step_batch(step, self.datamodule.rank)
            step += 1
