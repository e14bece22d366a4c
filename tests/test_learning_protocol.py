"""The learning protocol: a confirmation runs only a registered recipe, unchanged, on registered seeds
that no earlier results file used, and every confirmation is on record; selection's paired test."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "learning_protocol.py"
sys.path.insert(0, str(_PATH.parent))
_spec = importlib.util.spec_from_file_location("learning_protocol", _PATH)
protocol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(protocol)

RECIPE = [Path("benchmarks/configs/learn_mbpp_cpu.yaml")]


def printer(text: str):
    return lambda configs, extra: text


@pytest.fixture
def results(tmp_path) -> Path:
    folder = tmp_path / "results"
    folder.mkdir()
    # an earlier benchmark's file, seeds recorded as learning_mbpp.py writes them
    (folder / "learning_mbpp_2026-11-26.json").write_text(json.dumps(
        {"recipes": {"wide": [{"seed": 0, "passed_before": 26}, {"seed": 1}]}}))
    return folder


def test_a_recipe_that_was_never_registered_is_refused(results):
    with pytest.raises(protocol.Refused, match="is not registered: run learning_protocol.py register"):
        protocol.registration_for(RECIPE, [], [10], results, printer("model: {}\n"))


def test_a_registered_recipe_on_its_seeds_is_accepted(results):
    written = protocol.register(RECIPE, ["--trainer.max_steps", "90"], [10, 11], results, printer("a: 1\n"))
    record = json.loads(written.read_text())
    assert record["config_sha256"] == protocol.config_hash("a: 1\n") and record["reserved"] == [10, 11]
    assert protocol.registration_for(RECIPE, ["--trainer.max_steps", "90"], [10, 11], results,
                                     printer("a: 1\n")) == written
    with pytest.raises(protocol.Refused, match="not registered"):  # other fit arguments: another recipe
        protocol.registration_for(RECIPE, [], [10], results, printer("a: 1\n"))


def test_a_config_changed_since_registration_is_refused(results):
    protocol.register(RECIPE, [], [10], results, printer("learning_rate: 5.0e-06\n"))
    with pytest.raises(protocol.Refused, match="config changed since registration_.*register the changed recipe anew"):
        protocol.registration_for(RECIPE, [], [10], results, printer("learning_rate: 1.0e-05\n"))


def test_seeds_an_earlier_results_file_used_are_refused_at_registration_and_confirmation(results):
    with pytest.raises(protocol.Refused, match="seed 1 was used by learning_mbpp_2026-11-26.json"):
        protocol.register(RECIPE, [], [5, 1], results, printer("a: 1\n"))
    protocol.register(RECIPE, [], [5, 6], results, printer("a: 1\n"))
    (results / "confirmation_x_2026-11-29.json").write_text(json.dumps({"kind": "confirmation", "seeds": [6]}))
    with pytest.raises(protocol.Refused, match="seed 6 was used by confirmation_x"):
        protocol.registration_for(RECIPE, [], [5, 6], results, printer("a: 1\n"))
    assert protocol.registration_for(RECIPE, [], [5], results, printer("a: 1\n"))


def test_seeds_outside_the_registration_are_refused(results):
    protocol.register(RECIPE, [], [10], results, printer("a: 1\n"))
    with pytest.raises(protocol.Refused, match=r"seeds \[12\] are not in registration_"):
        protocol.registration_for(RECIPE, [], [10, 12], results, printer("a: 1\n"))


def test_the_repositorys_results_files_use_seeds_0_to_2():
    used = protocol.used_seeds(protocol.RESULTS)
    assert {0, 1, 2} <= set(used)


def test_a_confirmation_is_on_record_whatever_happens(results, tmp_path, monkeypatch):
    """A fit that fails, then one that is interrupted: the results file says so, with its seeds."""
    protocol.register(RECIPE, [], [10, 11], results, printer("a: 1\n"))
    monkeypatch.setattr(protocol, "print_config", lambda configs, extra: "a: 1\n")
    calls = []

    def fit(configs, seed, run, threads, at_start, extra):
        calls.append((seed, at_start, extra))
        if seed == 11:
            raise KeyboardInterrupt
        return 1.0, 1

    monkeypatch.setattr(protocol.measure, "fit", fit)
    with pytest.raises(KeyboardInterrupt):
        protocol.main(["confirm", "--config", *map(str, RECIPE), "--seeds", "10", "11", "--no-humaneval",
                       "--results", str(results), "--root", str(tmp_path / "runs")])
    (written,) = results.glob("confirmation_*.json")
    record = json.loads(written.read_text())
    assert record["seeds"] == [10, 11] and record["failed"] == {"10": "rlcode fit exited 1"}
    assert record["status"].startswith("stopped: KeyboardInterrupt") and record["config_sha256"]
    assert "--data.eval_split" in calls[0][2] and calls[0][2][calls[0][2].index("--data.eval_split") + 1] == "test"
    with pytest.raises(protocol.Refused, match="seed 10 was used by confirmation_"):  # no second look
        protocol.registration_for(RECIPE, [], [10], results, printer("a: 1\n"))


def test_the_paired_permutation_test():
    before = {task: 0.0 for task in range(20)}
    assert protocol.paired_permutation_p(before, dict(before)) == 1.0
    better = {task: 0.5 for task in range(20)}  # every problem up: p near 2 / 2**20
    assert protocol.paired_permutation_p(before, better) < 0.001
    mixed = {task: (0.5 if task % 2 else -0.5) for task in range(20)}
    assert protocol.paired_permutation_p(before, mixed) > 0.5
    with pytest.raises(protocol.Refused, match="different problems"):
        protocol.paired_permutation_p(before, {1: 0.0})


def test_selection_scores_sampled_pass_at_1_on_the_selection_split_only(tmp_path):
    def write(step, passed):
        path = tmp_path / "runs/x/version_0/eval" / f"step_{step}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        problems = [{"task_id": t, "passed": False, "samples": 4, "samples_passed": passed(t)}
                    for t in (*range(1, 11), *range(511, 601))]
        path.write_text(json.dumps({"generation": {"num_samples": 4}, "problems": problems}))

    write(0, lambda t: 0)
    write(60, lambda t: 1 if t % 3 == 0 else 0)
    row = protocol.selection_row(0, tmp_path, None)
    assert row["problems"] == 100 and row["sampled_pass_at_1_before"] == 0.0
    assert row["sampled_pass_at_1_after"] == pytest.approx(33 / 4 / 100)
    assert row["permutation_p"] < 0.001 and row["greedy"]["mcnemar_p"] == 1.0
    with pytest.raises(protocol.Refused, match="drop --data.eval_split"):
        protocol.select(type("Args", (), {"samples": 8, "temperature": 0.8})(), ["--data.eval_split", "test"])


@pytest.mark.slow
def test_the_hash_is_of_rlcode_fits_resolved_config():
    text = protocol.print_config(RECIPE, [])
    assert "eval_split: test" in text and protocol.print_config(RECIPE, []) == text
    longer = protocol.print_config(RECIPE, ["--trainer.max_steps", "61"])
    assert protocol.config_hash(longer) != protocol.config_hash(text)


def test_selection_with_a_baseline_scored_before_runs_no_start_eval(results, tmp_path, monkeypatch):
    """``select --baseline FILE``: recipes run side by side share one base-model eval; every seed's fit
    skips its start eval and is compared with that file, whose path the record keeps."""
    baseline = tmp_path / "base/eval/validate_step_0.json"
    problems = [{"task_id": t, "passed": False, "samples": 4, "samples_passed": 0} for t in (*range(1, 11), *range(511, 601))]
    _write_eval(baseline, 4, problems)
    calls = []
    after = [{**p, "samples_passed": 2} for p in problems]
    monkeypatch.setattr(protocol.measure, "fit", _fit_writing("step_5.json", 4, after, calls))
    protocol.main(["select", "--config", *map(str, RECIPE), "--seeds", "30", "31", "--baseline", str(baseline),
                   "--results", str(results), "--root", str(tmp_path / "runs")])
    (written,) = results.glob("selection_*.json")
    record = json.loads(written.read_text())
    assert calls == [False, False], "no seed ran a start eval"
    assert record["baseline"] == str(baseline) and [row["sampled_pass_at_1_before"] for row in record["rows"]] == [0, 0]
    assert all(row["sampled_pass_at_1_after"] == 0.5 for row in record["rows"])


def test_a_confirmation_seed_with_a_baseline_runs_no_start_eval(results, tmp_path, monkeypatch):
    """``confirm --baseline FILE`` (a later seed as its own invocation, beside the first): no start eval,
    compared with the first seed's step-0 verdicts."""
    protocol.register(RECIPE, [], [40], results, printer("a: 1\n"))
    monkeypatch.setattr(protocol, "print_config", lambda configs, extra: "a: 1\n")
    baseline = tmp_path / "first/eval/step_0.json"
    problems = [{"task_id": t, "passed": t % 2 == 0} for t in range(11, 511)]
    _write_eval(baseline, 0, problems)
    calls = []
    after = [{**p, "passed": True} for p in problems]
    monkeypatch.setattr(protocol.measure, "fit", _fit_writing("step_90.json", 0, after, calls))
    protocol.main(["confirm", "--config", *map(str, RECIPE), "--seeds", "40", "--baseline", str(baseline),
                   "--no-humaneval", "--results", str(results), "--root", str(tmp_path / "runs")])
    (written,) = results.glob("confirmation_*.json")
    (row,) = json.loads(written.read_text())["rows"]
    assert calls == [False], "no start eval"
    assert (row["passed_before"], row["passed_after"], len(row["gained"])) == (250, 500, 250)


def _write_eval(path: Path, samples: int, problems: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"generation": {"num_samples": samples}, "problems": problems}))


def _fit_writing(name: str, samples: int, problems: list[dict], calls: list):
    """A stand-in ``measure.fit`` that records whether it was asked for a start eval and writes an end eval."""
    def fit(configs, seed, run, threads, at_start, extra):
        calls.append(at_start)
        _write_eval(run / "runs/x/version_0/eval" / name, samples, problems)
        return 1.0, 0
    return fit
