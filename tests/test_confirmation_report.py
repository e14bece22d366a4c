"""The confirmation table and its power sentences: exact McNemar thresholds and every seed reported."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from confirmation_report import report  # noqa: E402
from learning_mbpp import mcnemar_exact  # noqa: E402
from mcnemar_power import mcnemar_power, power_sentence, smallest_significant_gain  # noqa: E402


def test_the_smallest_significant_gain_is_the_exact_tests_threshold():
    # 25 discordant: 7 losses give 2 P(X <= 7) = 0.043, 8 give 0.108 (binomial(25, 1/2) tails)
    assert smallest_significant_gain(25) == 18
    assert mcnemar_exact(7, 18) < 0.05 <= mcnemar_exact(8, 17)
    # 6 discordant, all gains: 2 / 2**6 = 0.031; 5 all gains: 2 / 2**5 = 0.0625, never significant
    assert smallest_significant_gain(6) == 6
    assert smallest_significant_gain(5) is None


def test_the_power_is_the_binomial_tail_above_the_threshold():
    assert mcnemar_power(25, 1.0) == 1.0
    assert mcnemar_power(5, 1.0) == 0.0
    # under no effect the one-sided rejection chance is at most half the two-sided alpha
    assert mcnemar_power(25, 0.5) <= 0.025
    tail = sum(math.comb(25, g) * 0.75**g * 0.25 ** (25 - g) for g in range(18, 26))
    assert mcnemar_power(25, 0.75) == tail


def test_the_sentence_names_the_net_gain_it_needed():
    row = {"problems": 500, "lost": list(range(7)), "gained": list(range(18))}
    assert "at least 18 gains (a net +11 of 500)" in power_sentence(row, 0.75)


def test_every_seed_is_in_the_table_scored_or_not():
    scored = {"seed": 301, "steps": 90, "passed_before": 26, "passed_after": 40, "lost": [1] * 5,
              "gained": [2] * 19, "mcnemar_p": mcnemar_exact(5, 19), "problems": 500,
              "humaneval": {"passed_before": 8, "passed_after": 9, "mcnemar_p": 1.0}}
    record = {"kind": "confirmation", "seeds": [301, 302], "rows": [scored], "minutes": {"301": 40.1},
              "failed": {"302": "rlcode fit exited 1"}, "status": "failed", "registration": "registration_x.json",
              "config_sha256": "ab" * 32}
    table = report([record], gain_share=0.75)
    assert "| 301 | 90 | - / 40.1 | 26 -> 40 | 5 / 19 |" in table
    assert "| 302 | - | - / - | not scored: rlcode fit exited 1 |" in table
    assert "Significant in 1 of 2 seeds." in table
    assert "seed 301: 24 discordant problems" in table


def test_training_minutes_come_from_the_runs_step_times(tmp_path):
    metrics = tmp_path / "run/a/version_0/metrics.csv"  # the fit; "a" sorts before "humaneval"
    metrics.parent.mkdir(parents=True)
    metrics.write_text("step,perf/step_s,reward/std\n0,30,0.1\n1,,0.2\n2,90,0.0\n")  # a row without a step time
    (metrics.parent / "eval").mkdir()
    (metrics.parent / "eval/step_2.json").write_text("{}")  # the fit's own end eval: its metrics sit beside it
    humaneval = tmp_path / "run/humaneval/x/version_0"  # a test run's metrics, no step times: not the fit's
    (humaneval / "eval").mkdir(parents=True)
    (humaneval / "eval/test_step_2.json").write_text("{}")
    (humaneval / "metrics.csv").write_text("step,perf/step_s\n0,600\n")
    row = {"seed": 7, "run": str(tmp_path / "run"), "steps": 2, "passed_before": 1, "passed_after": 2, "lost": [],
           "gained": [3], "mcnemar_p": 1.0, "problems": 500}
    record = {"seeds": [7], "rows": [row], "minutes": {"7": 9.0}, "registration": "r", "config_sha256": "0"}
    assert "| 7 | 2 | 2.0 / 9.0 |" in report([record])
