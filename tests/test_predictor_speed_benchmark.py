"""``benchmarks/predictor_speed.py``'s report: answers judged by the code game's own comparison, tokens
per second from the tokens each side generated."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "predictor_speed.py"
sys.path.insert(0, str(_PATH.parent))
_spec = importlib.util.spec_from_file_location("predictor_speed", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_answers_are_judged_as_the_game_judges_them():
    cases = [{"task_id": 11, "assert_index": 0, "expected": "42"}, {"task_id": 12, "assert_index": 0, "expected": "[1, 2]"}]
    report = bench._report(cases, ["```output\n42\n```", "```\n[2, 1]\n```"], tokens=30, seconds=2.0)
    assert report["right"] == 1 and report["verdicts"] == {"11/0": True, "12/0": False}
    assert report["tokens_per_s"] == 15.0 and report["answer_tokens"] == 30


def test_the_prompt_is_the_games_predictor_prompt():
    from rlcode.envs.code_game import PREDICTOR_PROMPT

    (message,) = bench.messages("print(1)\n")
    assert message == {"role": "user", "content": PREDICTOR_PROMPT.format(program="print(1)")}
