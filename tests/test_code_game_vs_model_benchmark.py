"""``benchmarks/code_game_vs_model.py``'s reading of a run: per-step curves from the logged games, the
first-10 against last-10 permutation test, the sample programs; and the recipe it runs parses."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_PATH = REPO / "benchmarks" / "code_game_vs_model.py"
sys.path.insert(0, str(_PATH.parent))
_spec = importlib.util.spec_from_file_location("code_game_vs_model", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _game(step: int, valid: bool, right: list[bool]) -> dict:
    writer = {"player": 0, "reply": f"print({step})", "role": "writer", "valid": valid, "output": str(step)}
    answers = [{"player": 1, "reply": "x", "role": "predictor", "correct": r, "expected": str(step)} for r in right]
    return {"step": step, "turns": [writer, *(answers if valid else [])]}


def _log(tmp_path: Path, games: list[dict]) -> Path:
    path = tmp_path / "run/x/version_0/rollouts.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(g) + "\n" for g in games))
    return tmp_path / "run"


def test_curves_come_from_every_logged_game(tmp_path):
    run = _log(tmp_path, [_game(0, True, [True, False]), _game(0, False, []), _game(1, True, [True, True])])
    rows = bench.curve(bench.games_by_step(run))
    assert rows == [{"step": 0, "games": 2, "valid_share": 0.5, "valid_programs": 1, "predictor_success": 0.5},
                    {"step": 1, "games": 1, "valid_share": 1.0, "valid_programs": 1, "predictor_success": 1.0}]


def test_a_falling_success_with_validity_kept_is_significant_and_a_flat_one_is_not(tmp_path):
    rising_difficulty = [_game(s, True, [True] * 4 if s < 10 else [False] * 4) for s in range(20) for _ in range(4)]
    result = bench.trend(bench.games_by_step(_log(tmp_path / "a", rising_difficulty)))
    assert result["window_steps"] == 10
    assert result["success"]["first"] == 1.0 and result["success"]["last"] == 0.0
    assert result["success"]["permutation_p"] == pytest.approx(1 / (bench.PERMUTATIONS + 1))  # nothing as extreme
    assert result["validity"]["permutation_p"] == 1.0  # every program valid at both ends
    assert result["learnable"]["first"] == 0.0 and result["learnable"]["last"] == 0.0  # all or none right
    flat = [_game(s, True, [True, False]) for s in range(20) for _ in range(4)]
    assert bench.trend(bench.games_by_step(_log(tmp_path / "c", flat)))["learnable"]["last"] == 1.0
    assert bench.trend(bench.games_by_step(_log(tmp_path / "b", flat)))["success"]["permutation_p"] == 1.0


def test_the_permutation_test_recomputes_and_counts_the_observed_split():
    first, last = [1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]
    p = bench.permutation_p(first, last)
    assert p == bench.permutation_p(first, last) and 0.2 < p < 1.0  # 8 values: C(8,4) = 70 splits, not rare
    assert bench.permutation_p([], last) == 1.0


def test_samples_are_valid_programs_of_the_first_and_last_steps(tmp_path):
    steps = bench.games_by_step(_log(tmp_path, [_game(0, False, []), _game(1, True, [False]), _game(5, True, [True])]))
    picked = bench.samples(steps)
    assert picked["first"]["step"] == 1 and picked["last"]["step"] == 5
    assert picked["last"]["games"] == [{"program": "print(5)", "output": "5", "answers": ["x"], "right": [True]}]


def test_the_recipe_names_the_benchmarks_predictor_and_budget():
    import yaml

    recipe = yaml.safe_load((REPO / "configs/code_game_vs_model.yaml").read_text())
    mode = recipe["model"]["mode"]["init_args"]
    assert mode["opponent"] == "model" and mode["opponent_model"] == bench.PREDICTOR
    assert mode["opponent_max_new_tokens"] == bench.BUDGET and mode["writer_reward"] == "learnability"


def test_a_fit_that_fails_stops_the_runs_with_its_exit_code_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "fit", lambda reward, seed, root, extra: (root / f"{reward}-seed{seed}", 0.1, 2))
    with pytest.raises(SystemExit, match="the learnability seed 0 fit exited with 2"):
        bench.main(["runs", str(tmp_path), "--seeds", "0", "--rewards", "learnability"])
    assert not list(tmp_path.rglob("result.json"))
