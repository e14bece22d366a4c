"""SPIRAL self-play: moves, game rewards, RAE, turn samples, batching across episodes, checkpoints,
and `rlcode fit` / `rlcode validate` with the TicTacToe config on the tiny model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from rlcode.algorithms.role_baselines import RoleBaselines
from rlcode.envs.base import StepResult, Turn
from rlcode.envs.moves import LegalMoves, legal_moves, parse_move
from rlcode.envs.runner import EpisodeRunner
from rlcode.envs.textarena_game import TextArenaGame

REPO = Path(__file__).resolve().parents[1]
SPIRAL = ["--config", str(REPO / "configs/spiral_tictactoe.yaml"), "--config", str(REPO / "configs/tiny_test.yaml")]
BOARD = LegalMoves(listed=[f"[{i}]" for i in range(9)])


@pytest.mark.parametrize("reply, expected", [
    ("I take the centre. \\boxed{4}", "[4]"),
    ("\\boxed{ [ 4 ] }", "[4]"),                       # spacing and brackets inside the box
    ("\\boxed{\\text{4}}", "[4]"),
    ("first \\boxed{1}, no wait: \\boxed{8}", "[8]"),   # the last box counts
    ("\\boxed{9}", None),                               # not a legal move
    ("I play [4]", None),                               # no box: invalid under SPIRAL's format
    ("", None),
])
def test_boxed_moves(reply, expected):
    move, reason = parse_move(reply, BOARD, "boxed")
    assert move == expected
    assert (reason == "") == (expected is not None)


def test_bracket_format_takes_the_first_legal_bracketed_move():
    assert parse_move("maybe [9]? no: [ 4 ] then [5]", BOARD, "bracket") == ("[4]", "")
    assert parse_move("nothing legal [9]", BOARD, "bracket")[0] is None


def test_legal_moves_come_from_the_games_own_text():
    game = TextArenaGame("KuhnPoker-v0")
    turn = game.reset(seed=3)
    legal = game.legal_moves()
    assert legal.listed == ["[check]", "[bet]"] and "Kuhn Poker" in turn.messages[0]["content"]
    assert parse_move("\\boxed{bet}", legal)[0] == "[bet]"
    assert parse_move("\\boxed{call}", legal)[0] is None  # no bet to call yet

    held = legal_moves("SimpleNegotiation-v0", "[Wheat]   Qty: 2    Value: 5\n[Wood]    Qty: 3   Value: 8", 0)
    assert held.allows("[Offer: 2 Wheat -> 1 Wood]")
    assert not held.allows("[Offer: 3 Wheat -> 1 Wood]")   # more than it holds
    assert not held.allows("[Offer: 1 Gold -> 1 Wood]")    # no such resource
    assert not held.allows("[Accept]")                      # nothing offered to it


def test_invalid_move_ends_the_game_with_spirals_rewards():
    game = TextArenaGame("TicTacToe-v0")
    game.reset(seed=1)
    result = game.step("\\boxed{4}")
    assert not result.done and result.info["move"] == "[4]" and result.next_turn.player == 1
    result = game.step("\\boxed{4}")  # occupied
    assert result.done and result.returns == {1: -1.5, 0: 0.5} and result.info["valid"] is False

    custom = TextArenaGame("TicTacToe-v0", invalid_move_penalty=-2.0, invalid_move_bonus=0.0)
    custom.reset(seed=1)
    assert custom.step("no move at all").returns == {0: -2.0, 1: 0.0}


def test_turn_cap_is_a_draw_and_a_win_is_plus_minus_one():
    capped = TextArenaGame("TicTacToe-v0", max_turns=2)
    capped.reset(seed=1)
    capped.step("\\boxed{0}")
    result = capped.step("\\boxed{3}")
    assert result.done and result.returns == {0: 0.0, 1: 0.0} and "turn cap" in result.info["reason"]

    game = TextArenaGame("TicTacToe-v0")
    game.reset(seed=1)
    for move in (0, 3, 1, 4):
        game.step(f"\\boxed{{{move}}}")
    assert game.step("\\boxed{2}").returns == {0: 1.0, 1: -1.0}  # three in a row for player 0


def test_rae_against_the_formula_by_hand():
    """advantage = return - b (read before the update); b <- d b + (1 - d) return; per (game, role)."""
    baselines = RoleBaselines(decay=0.5)
    returns = [("ttt", 0, 1.0), ("ttt", 1, -1.0), ("ttt", 0, 1.0), ("ttt", 0, -1.0), ("kuhn", 0, 2.0)]
    # ttt/0: b 0 -> adv 1, b 0.5 -> adv 0.5, b 0.75 -> adv -1.75, b -0.125; ttt/1: adv -1; kuhn/0: adv 2
    assert baselines.advantages(returns) == [1.0, -1.0, 0.5, -1.75, 2.0]
    assert baselines.values == {"ttt/0": -0.125, "ttt/1": -0.5, "kuhn/0": 1.0}
    spiral_default = RoleBaselines()
    assert spiral_default.advantages([("g", 0, 1.0), ("g", 0, 1.0)]) == [1.0, pytest.approx(0.95)]

    restored = RoleBaselines(decay=0.5)
    restored.load_state_dict(baselines.state_dict())
    assert restored.advantages([("ttt", 0, 0.0)]) == [0.125]


class ScriptedGame:
    """``length`` turns, players alternating from seat 0; seat 0 wins. Counts what it was told."""

    name = "Scripted"

    def __init__(self, length: int) -> None:
        self.length = length

    def reset(self, seed: int) -> Turn:
        self.turn, self.seed = 0, seed
        return self._turn()

    def step(self, answer: str) -> StepResult:
        self.turn += 1
        if self.turn == self.length:
            return StepResult(None, {0: 1.0, 1: -1.0}, {"valid": True})
        return StepResult(self._turn(), None, {"valid": True})

    def _turn(self) -> Turn:
        content = f"game {self.seed}, turn {self.turn}: feedback {self.turn * 7}"
        return Turn(self.turn % 2, [{"role": "user", "content": content}])


@pytest.fixture(scope="module")
def module():
    from rlcode.modes import SPIRAL
    from grpo_harness import learner

    built = learner(SPIRAL, model_name="tiny-random", max_new_tokens=6, temperature=1.0)
    built.configure_model()
    return built


def test_one_backend_call_per_round_not_per_episode(module):
    """Episodes of 1, 2 and 3 turns with the policy in both seats: 3 rounds, so 3 generation calls
    (of 3, 2 and 1 prompts), not one per turn (6)."""
    sizes = []

    def generate(prompts, seed):
        sizes.append(len(prompts))
        return module.generate(prompts, 1, temperature=1.0, seed=seed)

    runner = EpisodeRunner(module.render, generate)
    episodes = runner.play([ScriptedGame(n) for n in (1, 2, 3)], [0, 1, 2], [(0, 1)] * 3)
    assert runner.backend_calls == 3 and sizes == [3, 2, 1]
    assert [len(e.turns) for e in episodes] == [1, 2, 3]


def test_trained_tokens_are_the_sampled_tokens_and_context_is_what_the_model_saw(module):
    """Turn samples keep the backend's own ids (no re-tokenisation), contexts decode to the rendered
    prompt of that turn, the mask covers the sampled tokens only, and opponent turns (and every
    observation or feedback) are never trained."""
    from rlcode.envs.opponents import PolicyOpponent
    from rlcode.training.turn_samples import EpisodeTurns

    sampled = {}  # rendered prompt -> the ids the backend sampled for it

    def generate(prompts, seed):
        rollout = module.generate(prompts, 1, temperature=1.0, seed=seed)
        for row in range(len(prompts)):
            length = int(rollout.completion_mask[row].sum())
            sampled[prompts[row]] = rollout.completion_ids[row][:length].tolist()
        return rollout

    opponent = PolicyOpponent(module.render, lambda prompts, seed: module.generate(prompts, 1, temperature=1.0,
                                                                                     seed=seed + 99))
    runner = EpisodeRunner(module.render, generate, opponent=opponent)
    episodes = runner.play([ScriptedGame(3), ScriptedGame(4)], [0, 1], [(0,), (0,)])
    samples = EpisodeTurns.from_episodes(episodes, module.tokenizer.pad_token_id, "cpu")

    learner_turns = [t for e in episodes for t in e.turns if t.learner]
    assert len(samples.rows) == len(learner_turns) == 4 and all(t.player == 0 for t in learner_turns)
    assert len(sampled) == 4
    batch = samples.rollout
    for row, turn in enumerate(learner_turns):
        prompt = module.render(turn.messages)
        length = int(batch.completion_mask[row].sum())
        assert batch.completion_ids[row][:length].tolist() == sampled[prompt] == turn.completion_ids
        assert not batch.completion_mask[row][length:].any()
        context = batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist()
        assert module.tokenizer.decode(context) == prompt == turn.prompt_text
    assert samples.returns() == [1.0, 1.0, 1.0, 1.0]


def test_fit_leaves_a_complete_run_directory(tmp_path, capsys):
    from rlcode.cli.command import main

    main(["fit", *SPIRAL, "--run.root_dir", str(tmp_path)])
    run = next(tmp_path.glob("tiny/version_*"))
    for name in ("config.yaml", "metrics.csv", "rollouts.jsonl", "plots/training.png", "checkpoints/last.ckpt"):
        assert (run / name).is_file(), name
    with (run / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    columns = set(rows[0])
    for name in ("spiral/TicTacToe-v0/win_rate", "spiral/TicTacToe-v0/draw_rate", "spiral/TicTacToe-v0/loss_rate",
                 "spiral/TicTacToe-v0/invalid_move_rate", "spiral/TicTacToe-v0/baseline_role0",
                 "reward/avg_batch_reward", "loss/loss"):
        assert name in columns, name
    games = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert games and all(g["game"] == "TicTacToe-v0" and g["turns"] for g in games)
    assert {"player", "observation", "reply", "move", "valid"} <= set(games[0]["turns"][0])
    checkpoint = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["rlcode_resume"]["parts"]["mode"]["estimator"]["values"]["TicTacToe-v0/0"] != 0.0
    assert "TicTacToe-v0 vs random" in capsys.readouterr().out
    report = json.loads((run / "eval/games_step_0.json").read_text())  # the start-of-run game eval
    assert report["step"] == 0 and set(report["games"]["TicTacToe-v0"]["random"]) == {
        "win_rate", "draw_rate", "loss_rate", "invalid_move_rate", "episodes"}
    assert len(report["episodes"]) == report["games"]["TicTacToe-v0"]["random"]["episodes"] > 0
    assert (run / f"eval/games_step_{checkpoint['global_step']}.json").is_file()  # and the end-of-run one


def test_baselines_and_games_resume_exactly(tmp_path):
    """A run resumed from its step-2 checkpoint plays the same games with the same baselines as one
    that never stopped (the baselines are checkpoint state)."""
    from rlcode.cli.command import main

    quiet = ["--game_eval.at_start", "false", "--game_eval.at_end", "false", "--checkpoint.every_n_train_steps", "1"]
    main(["fit", *SPIRAL, "--run.root_dir", str(tmp_path / "straight"), "--trainer.max_steps", "3", *quiet])
    main(["fit", *SPIRAL, "--run.root_dir", str(tmp_path / "resumed"), "--trainer.max_steps", "2", *quiet])
    main(["fit", *SPIRAL, "--run.root_dir", str(tmp_path / "resumed"), "--trainer.max_steps", "3",
          "--ckpt_path", "last", *quiet])

    def final(root):
        run = next(root.glob("tiny/version_*"))
        state = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
        games = [(g["step"], g["seed"], g["returns"]) for g in map(json.loads, (run / "rollouts.jsonl").open())]
        return state["rlcode_resume"]["parts"]["mode"]["estimator"], games, state["global_step"]

    assert final(tmp_path / "resumed") == final(tmp_path / "straight")


def test_validate_reports_game_rates(tmp_path):
    from rlcode.cli.command import main

    main(["validate", *SPIRAL, "--run.root_dir", str(tmp_path)])
    with next(tmp_path.glob("tiny/version_*/metrics.csv")).open() as handle:
        row = next(csv.DictReader(handle))
    # the random model never writes a legal move: every game is lost by an invalid move
    assert float(row["spiral/TicTacToe-v0/invalid_move_rate"]) == 1.0
    assert float(row["spiral/TicTacToe-v0/loss_rate"]) == 1.0


@pytest.mark.parametrize("opponent", ["random", "frozen"])
def test_one_seat_against_a_fixed_opponent(tmp_path, opponent):
    """The policy holds seat 1 only; seat 0 is a random legal mover or a frozen copy of the start.
    Only seat 1's turns are trained, and the opponent's moves are in the logged games."""
    from rlcode.cli.command import main

    main(["fit", *SPIRAL, "--run.root_dir", str(tmp_path), "--model.mode.opponent", opponent,
          "--model.mode.trained_seat", "1", "--game_eval.at_start", "false", "--game_eval.at_end", "false"])
    games = [json.loads(line) for line in next(tmp_path.glob("tiny/version_*/rollouts.jsonl")).open()]
    assert all(g["learner_seats"] == [1] for g in games)
    for game in games:
        assert all(turn["learner"] == (turn["player"] == 1) for turn in game["turns"])
        assert game["turns"][0]["player"] == 0 and not game["turns"][0]["learner"]
        if opponent == "random":  # a random legal mover never loses by an invalid move
            assert game["turns"][0]["valid"]


def test_game_mixture_is_drawn_by_weight_and_seeded_per_step_and_rank():
    from rlcode.data.games import GameDataModule

    data = GameDataModule(games=["TicTacToe-v0", "KuhnPoker-v0"], weights=[1.0, 0.0], episodes_per_step=6)
    assert set(data.step_batch(0, 0)["game"]) == {"TicTacToe-v0"}
    mixed = GameDataModule(games=["TicTacToe-v0", "KuhnPoker-v0"], episodes_per_step=64)
    batch = mixed.step_batch(3, 1)
    assert batch == mixed.step_batch(3, 1) and set(batch["game"]) == {"TicTacToe-v0", "KuhnPoker-v0"}
    seeds = batch["seed"] + mixed.step_batch(3, 0)["seed"] + mixed.step_batch(4, 1)["seed"]
    assert len(set(seeds)) == len(seeds), "every (step, rank, episode) deals its own game"
    with pytest.raises(ValueError, match="one non-negative weight per game"):
        GameDataModule(games=["TicTacToe-v0"], weights=[1.0, 2.0])


def test_multigame_gpu_recipe_runs_on_the_tiny_model(tmp_path):
    """The GPU recipe's settings (three games, boxed moves, dr_grpo, two PPO epochs, zero-advantage
    turns dropped) run end to end with the tiny-model overlay."""
    from rlcode.cli.command import main

    main(["fit", "--config", str(REPO / "configs/spiral_multigame.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
          "--run.root_dir", str(tmp_path), "--trainer.accelerator", "cpu", "--trainer.devices", "1",
          "--data.episodes_per_step", "6", "--data.eval_episodes", "1", "--game_eval.every_n_steps", "0"])
    run = next(tmp_path.glob("tiny/version_*"))
    with (run / "metrics.csv").open() as handle:
        columns = set(next(csv.DictReader(handle)))
    for game in ("TicTacToe-v0", "KuhnPoker-v0", "SimpleNegotiation-v0"):
        assert f"spiral/{game}/win_rate" in columns, game
