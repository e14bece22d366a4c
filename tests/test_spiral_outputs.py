"""SPIRAL's own measures in its outputs: the plot's panels per game (win, draw, loss and invalid-move
rates against the random mover, invalid moves in training against the training opponent) and the
game eval's JSON (per game and opponent, then every episode), on hand-made episodes and histories."""

from __future__ import annotations

import json

from rlcode.callbacks.plots import draw_games, game_panels
from rlcode.envs.game_evaluation import eval_report
from rlcode.envs.runner import Episode, TurnRecord
from rlcode.training.run_history import StepScalars

GAME = "TicTacToe-v0"


def episode(seat: int, result: float, valid: bool = True) -> Episode:
    turns = [TurnRecord(player=seat, messages=[], text="\\boxed{4}", learner=True,
                        info={"move": "[4]" if valid else None, "valid": valid, "reason": "" if valid else "bad"}),
             TurnRecord(player=1 - seat, messages=[], text="[0]", info={"move": "[0]", "valid": True})]
    return Episode(GAME, seed=7, learner_seats=(seat,), turns=turns, returns={seat: result, 1 - seat: -result})


def test_the_eval_report_holds_rates_per_game_and_opponent_and_every_episode():
    episodes = [episode(0, 1.0), episode(1, 0.0), episode(0, -1.5, valid=False), episode(1, -1.0)]
    report = json.loads(json.dumps(eval_report(6, episodes)))
    assert report["step"] == 6
    assert report["games"] == {GAME: {"random": {"win_rate": 0.25, "draw_rate": 0.25, "loss_rate": 0.5,
                                                 "invalid_move_rate": 0.25, "episodes": 4}}}
    first, _, invalid, _ = report["episodes"]
    assert (first["outcome"], first["seat"], first["opponent"], first["invalid_move"]) == ("win", 0, "random", False)
    assert (invalid["outcome"], invalid["invalid_move"]) == ("loss", True)
    assert invalid["turns"][0] == {"player": 0, "policy": True, "text": "\\boxed{4}", "move": None, "valid": False,
                                   "reason": "bad"}


def test_the_plot_has_a_panel_of_rates_per_game(tmp_path):
    evals = [{"step": 0, **{f"spiral/{GAME}/{rate}": 0.1 for rate in ("win_rate", "draw_rate", "loss_rate",
                                                                        "invalid_move_rate")}},
             {"step": 4, f"spiral/{GAME}/win_rate": 0.5, f"spiral/{GAME}/invalid_move_rate": 0.0}]
    steps = [StepScalars(step, {"reward/avg_batch_reward": 0.0, f"spiral/{GAME}/train_invalid_move_rate": 0.5 - step / 10},
                         [], 4, True) for step in range(1, 5)]
    panels = game_panels([GAME, "KuhnPoker-v1"], evals, steps, "self")
    assert set(panels) == {GAME, "KuhnPoker-v1"} and panels["KuhnPoker-v1"] == {}
    series = panels[GAME]
    assert list(series) == ["win vs random", "draw vs random", "loss vs random", "invalid move vs random",
                            "invalid move in training vs self"]
    assert series["win vs random"] == ((0, 4), (0.1, 0.5)) and series["draw vs random"] == ((0,), (0.1,))
    assert series["invalid move in training vs self"][0] == (1, 2, 3, 4)
    path = draw_games([(1, 0.0), (2, 0.5)], panels, tmp_path / "plots" / "training.png")
    assert path.is_file() and path.stat().st_size > 0
