"""Every advantage estimator gives on 2 ranks what it gives on 1 rank on the combined batch.

Two CPU processes over gloo (``torch.distributed``, the process group Lightning's DDP strategy sets
up) each hold half of a step's rows; the parent computes the same estimator on all rows in one
process. Rewards and returns are multiples of 1/8, so every sum over them is exact in any order and
the float32 advantages must be bit-identical (``torch.equal``), ``scale_rewards="batch"`` included.

The last test is the empty rank: a SPIRAL step where every game of rank 1 ended before the policy's
first turn (an opponent that moves first and plays an invalid move), so rank 1 has no row at all
while rank 0 updates. Rank 1 must join the gradient sync (a zero-weighted dummy backward), and the
all-reduced gradient must equal a 1-process step on the combined batch, which is rank 0's rows (rank
0 of a 2-rank run draws the same games and sampling seeds as a 1-rank run). That run is Lightning's
DDP strategy on 2 processes, so it is this file run as a script (``_empty_rank_script``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlcode.envs.runner import Episode, TurnRecord
from rlcode.training.advantage_estimators import GroupRelative, GroupRelativePerRole, RoleBaselineAdvantages
from rlcode.training.all_ranks_totals import Ranks, sum_over_ranks
from rlcode.training.turn_samples import EpisodeTurns

REPO = Path(__file__).resolve().parents[1]
GROUP = 4


class Completions:
    """Stands in for CompletionGroups: GroupRelative reads only the rewards of its rows."""


def completion_rewards(rank: int) -> torch.Tensor:
    """[2 prompts x 4] per rank, multiples of 1/8; rank 1's second group is flat."""
    values = [[1, 3, 0, 6], [2, 2, 5, 1]] if rank == 0 else [[7, 0, 4, 4], [3, 3, 3, 3]]
    return torch.tensor([v / 8 for group in values for v in group], dtype=torch.float32)


def turn(player: int) -> TurnRecord:
    return TurnRecord(player=player, messages=[], text="", learner=True)


def mbpp_episodes(rank: int) -> EpisodeTurns:
    """2 problems x 4 episodes of 1-3 attempts (multi-step MBPP): each turn takes its episode's return."""
    returns = [[1, 0, 3, 3], [5, 5, 5, 5]] if rank == 0 else [[2, 6, 0, 1], [4, 0, 0, 7]]
    episodes = [Episode("mbpp", 0, (0,), [turn(0) for _ in range(1 + (v + i) % 3)], {0: v / 8})
                for group in returns for i, v in enumerate(group)]
    return _turns(episodes)


def game_episodes(rank: int) -> EpisodeTurns:
    """Code-game-like: 2 prompts x 4 games, writer (seat 0) and predictor (seat 1); an invalid
    program ends the game before the predictor plays (no seat-1 return)."""
    episodes = []
    for i in range(2 * GROUP):
        writer = ((3 * i + 5 * rank) % 7) / 8
        valid = (i + rank) % 3 != 0
        returns = {0: writer, 1: -writer} if valid else {0: -1.0}
        episodes.append(Episode("game", i, (0, 1), [turn(0)] + ([turn(1)] if valid else []), returns))
    return _turns(episodes)


def game_k_episodes(rank: int) -> EpisodeTurns:
    """The code game with K = 2 predictions per program: each prediction turn carries its own return
    (1 right, 0 wrong), the writer's is over both; invalid programs have no prediction turns."""
    episodes = []
    for i in range(2 * GROUP):
        valid = (i + rank) % 3 != 0
        verdicts = [(i + rank) % 2 == 0, (2 * i + rank) % 3 == 1] if valid else []
        predictions = [TurnRecord(player=1, messages=[], text="", info={"return": float(v)}, learner=True)
                       for v in verdicts]
        returns = {0: ((5 * i + 3 * rank) % 7) / 8, 1: sum(verdicts) / 2} if valid else {0: -1.0}
        episodes.append(Episode("game", i, (0, 1), [turn(0)] + predictions, returns))
    return _turns(episodes)


def spiral_episodes(rank: int) -> EpisodeTurns:
    """Two games, seats alternating; returns +-1, 0 or the invalid-move pair (-1.5, 0.5)."""
    episodes = []
    for i in range(4):
        game = ("TicTacToe-v0", "KuhnPoker-v0")[(i + rank) % 2]
        outcome = [(1.0, -1.0), (0.0, 0.0), (-1.5, 0.5), (-1.0, 1.0)][(i + 2 * rank) % 4]
        seat = (i + rank) % 2
        episodes.append(Episode(game, i, (seat,), [turn(0), turn(1), turn(0)][: 2 + i % 2],
                                {0: outcome[0], 1: outcome[1]}))
    for episode in episodes:  # only the learner's turns are rows
        for record in episode.turns:
            record.learner = record.player in episode.learner_seats
    return _turns(episodes)


def _turns(episodes: list[Episode]) -> EpisodeTurns:
    rows = [(e, t) for e, episode in enumerate(episodes) for t, record in enumerate(episode.turns) if record.learner]
    return EpisodeTurns(episodes, rollout=None, rows=rows)


def combined(build, world_size: int = 2):
    """Every rank's rows as one batch, rank by rank (what one process would see)."""
    parts = [build(rank) for rank in range(world_size)]
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return _turns([episode for part in parts for episode in part.episodes])


def estimator_of(kind: str, scale: str):
    if kind == "spiral":
        estimator = RoleBaselineAdvantages(0.95)
        estimator.games = ["TicTacToe-v0", "KuhnPoker-v0"]
        return estimator
    if kind == "game_k":
        return GroupRelativePerRole(GROUP, scale, turns_per_seat=(1, 2))
    return (GroupRelativePerRole if kind == "game" else GroupRelative)(GROUP, scale)


BUILDERS = {"completions": completion_rewards, "mbpp": mbpp_episodes, "game": game_episodes,
            "game_k": game_k_episodes, "spiral": spiral_episodes}


def advantages(kind: str, scale: str, ranks: Ranks, rank: int | None = None):
    """(advantages, estimator state) of ``kind`` on ``ranks``: rank ``rank``'s rows, or (None) all rows."""
    build = BUILDERS[kind]
    batch = combined(build) if rank is None else build(rank)
    if kind == "completions":
        experience, rewards = Completions(), batch
    else:
        experience, rewards = batch, batch.rewards("cpu")
    estimator = estimator_of(kind, scale)
    mask = torch.ones(len(rewards), 2)
    flat = estimator.flat_rows(experience, rewards)
    totals = sum_over_ranks(ranks, rewards, mask, flat.float().mean() if len(flat) else torch.tensor(0.0))
    return estimator.advantages(ranks, experience, rewards, totals), flat, estimator.state_dict()


CASES = [("completions", "group"), ("completions", "batch"), ("completions", "none"), ("mbpp", "group"),
         ("mbpp", "batch"), ("game", "group"), ("game", "batch"), ("game_k", "group"), ("game_k", "batch"), ("spiral", "group")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_body(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        results = {}
        for kind, scale in CASES:
            values, flat, state = advantages(kind, scale, Ranks(2, rank), rank)
            results[f"{kind}/{scale}"] = (values, flat, state)
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("estimators")
    torch.set_num_threads(1)
    mp.spawn(_rank_body, args=(_free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]


@pytest.mark.parametrize("kind, scale", CASES, ids=[f"{k}-{s}" for k, s in CASES])
def test_two_ranks_equal_one_rank_on_the_combined_batch(two_ranks, kind, scale):
    whole, whole_flat, whole_state = advantages(kind, scale, Ranks())
    split = len(two_ranks[0][f"{kind}/{scale}"][0])
    assert 0 < split < len(whole), "both ranks hold rows"
    for rank, result in enumerate(two_ranks):
        values, flat, state = result[f"{kind}/{scale}"]
        mine = slice(0, split) if rank == 0 else slice(split, len(whole))
        assert torch.equal(values, whole[mine]), f"rank {rank}"
        assert torch.equal(flat, whole_flat[mine])
        assert state == whole_state, "estimator state (RAE baselines) is the same on every rank"
    assert whole.abs().sum() > 0 and len(set(whole.tolist())) > 2, "advantages with signal: not a vacuous check"


def test_batch_scaling_uses_every_ranks_std():
    """The per-rank std would give other advantages: the batch case above could not pass by accident."""
    for kind in ("completions", "mbpp"):
        whole, _, _ = advantages(kind, "batch", Ranks())
        local = BUILDERS[kind](0)
        rewards = local if kind == "completions" else local.rewards("cpu")
        experience = Completions() if kind == "completions" else local
        estimator = estimator_of(kind, "batch")
        totals = sum_over_ranks(Ranks(), rewards, torch.ones(len(rewards), 2), torch.tensor(0.0))
        own = estimator.advantages(Ranks(), experience, rewards, totals)
        assert not torch.equal(own, whole[: len(own)]), kind


# ---- the empty rank through update_policy -------------------------------------------------------------------


def _empty_rank_script(out_dir: Path, devices: int) -> None:
    """A SPIRAL step whose rank-1 games all ended before the policy's first turn; rank zero saves the
    update's all-reduced gradients (``devices`` 1: rank 0's games alone, the combined batch's rows)."""
    import lightning as L

    from grpo_harness import GradientRecorder
    from exact_float64 import in_float64
    from rlcode.data.games import GameDataModule
    from rlcode.modes import SPIRAL
    from rlcode.training.learner import Learner

    class FirstMoverFails(SPIRAL):
        """On rank 1 the opponent moved first and played an invalid move: each game ended with no learner turn."""

        def collect(self, learner, batch):
            experience = super().collect(learner, batch)
            for episode in experience.episodes:
                if learner.global_rank == 1:
                    episode.turns, episode.returns = [], {0: -1.5, 1: 0.5}
            rows = [(e, t) for e, episode in enumerate(experience.episodes)
                    for t, record in enumerate(episode.turns) if record.learner]
            keep = [experience.rows.index(row) for row in rows]
            experience.rows = rows
            experience.rollout = type(experience.rollout)(**{
                **experience.rollout.__dict__, **{name: getattr(experience.rollout, name)[keep] for name in
                                                  ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
                                                   "truncated")},
                "completion_texts": [experience.rollout.completion_texts[i] for i in keep]})
            return experience

    torch.set_num_threads(1)
    module = Learner(mode=FirstMoverFails(opponent="random", trained_seat=1, move_format="bracket", max_turns=4),
                     model_name="tiny-random", precision="64-true", max_new_tokens=4, temperature=1.0,
                     micro_batch_size=2, max_grad_norm=None, learning_rate=1e-3)
    module.configure_model()
    in_float64(module.policy)
    recorder = GradientRecorder()
    strategy = "auto" if devices == 1 else L.pytorch.strategies.DDPStrategy(process_group_backend="gloo")
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, precision="64-true", max_steps=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[recorder])
    data = GameDataModule(games=["TicTacToe-v0"], episodes_per_step=2)  # per rank
    trainer.fit(module, datamodule=data)
    record = {"rank": trainer.global_rank, "rows": len(module.last_step.advantages), "updated": module.last_step.updated}
    (out_dir / f"empty_{devices}_rank{trainer.global_rank}.json").write_text(json.dumps(record))
    if trainer.global_rank == 0:
        torch.save(recorder.updates, out_dir / f"empty_{devices}.pt")


def test_a_rank_without_rows_joins_the_update(tmp_path):
    from grpo_harness import assert_same_gradients

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    for devices in (2, 1):
        done = subprocess.run([sys.executable, str(Path(__file__)), str(tmp_path), str(devices)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"empty_2_rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["rows"] > 0 and ranks[1]["rows"] == 0, ranks
    assert ranks[0]["updated"] and ranks[1]["updated"], "both ranks take the update rank 0's rows force"
    two, one = torch.load(tmp_path / "empty_2.pt"), torch.load(tmp_path / "empty_1.pt")
    assert len(two) == len(one) == 1
    assert_same_gradients(two[0], one[0])


if __name__ == "__main__":
    _empty_rank_script(Path(sys.argv[1]), int(sys.argv[2]))
