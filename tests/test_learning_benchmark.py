"""The learning benchmark's statistics: McNemar's exact test and the before/after comparison."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "learning_mbpp.py"
_spec = importlib.util.spec_from_file_location("learning_mbpp", _PATH)
learning_mbpp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning_mbpp)


@pytest.mark.parametrize(("b", "c", "p"), [(0, 0, 1.0), (0, 5, 2 / 32), (5, 0, 2 / 32), (2, 8, 2 * 56 / 1024),
                                           (4, 4, 1.0), (1, 2, 1.0)])
def test_mcnemar_exact_p_values(b, c, p):
    assert learning_mbpp.mcnemar_exact(b, c) == pytest.approx(p)


def test_compare_lists_the_flips_each_way(tmp_path):
    def report(step, passed):
        path = tmp_path / "runs" / "x" / "version_0" / "eval" / f"step_{step}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"problems": [{"task_id": t, "passed": t in passed} for t in range(11, 17)]}))

    report(0, {11, 12, 13})
    report(40, {12, 13, 14, 15})
    [row] = learning_mbpp.summarize([(0, tmp_path)], baseline=None)
    assert (row["steps"], row["passed_before"], row["passed_after"]) == (40, 3, 4)
    assert (row["lost"], row["gained"]) == ([11], [14, 15])
    assert row["mcnemar_p"] == pytest.approx(1.0)


def test_evals_of_different_problems_are_refused():
    with pytest.raises(ValueError, match="different problems"):
        learning_mbpp.compare({1: True, 2: False}, {1: True})


def test_a_baseline_run_without_a_start_eval_is_refused(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "step_60.json").write_text(json.dumps({"problems": []}))
    with pytest.raises(FileNotFoundError, match="no eval/step_0.json"):
        learning_mbpp.baseline_eval(tmp_path)
    (tmp_path / "eval" / "step_0.json").write_text(json.dumps({"problems": []}))
    assert learning_mbpp.baseline_eval(tmp_path).name == "step_0.json"


def test_humaneval_before_and_after_are_compared_beside_mbpp(tmp_path):
    """A run's ``humaneval/`` test verdicts against the base model's: flips each way and McNemar p."""
    def write(path, passed):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"problems": [{"task_id": f"HumanEval/{t}", "passed": t in passed}
                                                 for t in range(6)]}))

    run = tmp_path / "recipe-seed0"
    write(run / "runs/x/version_0/eval/step_0.json", set())
    write(run / "runs/x/version_0/eval/step_60.json", set())
    write(tmp_path / "humaneval-base/x/version_0/eval/test_step_0.json", {0, 1})
    write(run / "humaneval/x/version_0/eval/test_step_0.json", {1, 2, 3, 4, 5})
    base = learning_mbpp.humaneval_file(tmp_path / "humaneval-base")
    [row] = learning_mbpp.summarize([(0, run)], baseline=None, humaneval_baseline=base)
    held_out = row["humaneval"]
    assert (held_out["passed_before"], held_out["passed_after"]) == (2, 5)
    assert (held_out["lost"], held_out["gained"]) == (["HumanEval/0"], ["HumanEval/2", "HumanEval/3", "HumanEval/4",
                                                                       "HumanEval/5"])
    assert held_out["mcnemar_p"] == pytest.approx(2 * (1 + 5) / 32)  # 2 P(X <= 1), X ~ Bin(5, 1/2)
    with pytest.raises(FileNotFoundError, match="no eval/test_step"):
        learning_mbpp.humaneval_file(tmp_path / "nothing")


def test_summarizing_finished_runs_with_no_humaneval_skips_an_unfinished_humaneval(tmp_path, monkeypatch, capsys):
    """``--from-runs ... --no-humaneval`` reports MBPP alone, even when a run's HumanEval scoring never
    wrote its verdicts (it was stopped, or still running)."""
    def write(path, passed):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"problems": [{"task_id": t, "passed": t in passed} for t in range(4)]}))

    run = tmp_path / "recipe-seed0"
    write(run / "x/version_0/eval/step_0.json", {0})
    write(run / "x/version_0/eval/step_60.json", {0, 1})
    write(tmp_path / "humaneval-base/x/version_0/eval/test_step_0.json", {0})  # the base model was scored
    (run / "humaneval").mkdir()  # this run's scoring started, no verdicts yet
    monkeypatch.setattr("sys.argv", ["learning_mbpp.py", "--from-runs", str(run), "--no-humaneval"])
    learning_mbpp.main()
    [row] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    assert (row["passed_before"], row["passed_after"], "humaneval" in row) == (1, 2, False)


def test_a_trained_models_humaneval_verdicts_are_refused_as_the_baseline(tmp_path):
    """Each seed's HumanEval verdicts and the base model's share a file name; the file says which
    checkpoint it scored, and only the base model's (none) is taken as the baseline."""
    trained, base = tmp_path / "trained.json", tmp_path / "base.json"
    trained.write_text(json.dumps({"ckpt_path": "run/checkpoints/last.ckpt", "problems": []}))
    base.write_text(json.dumps({"ckpt_path": None, "problems": []}))
    with pytest.raises(SystemExit, match="scored the checkpoint run/checkpoints/last.ckpt, a trained model"):
        learning_mbpp.base_model_verdicts(trained)
    assert learning_mbpp.base_model_verdicts(base) == base


def test_a_seed_whose_fit_fails_is_reported_from_what_it_wrote_and_the_others_still_run(tmp_path, monkeypatch):
    """A fit that fails after its end-of-run eval (a last checkpoint that cannot be saved on a full disk)
    keeps its MBPP verdicts in the report, marked and without HumanEval; the next seed still runs; the
    benchmark writes its JSON and exits non-zero."""
    def write(path, passed, task=lambda t: t):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"ckpt_path": None, "problems": [{"task_id": task(t), "passed": t in passed}
                                                                    for t in range(4)]}))

    base_humaneval = tmp_path / "base.json"
    write(base_humaneval, {0}, task=lambda t: f"HumanEval/{t}")
    commands = []

    def run(command, cwd, check=False):
        commands.append(command)
        root = Path(command[command.index("--run.root_dir") + 1])
        if command[3] == "test":  # as rlcode test does: beside the checkpoint's run, named by its step
            run_dir = Path(command[command.index("--ckpt_path") + 1]).parent.parent
            write(run_dir / "eval/test_step_90.json", {0, 1}, task=lambda t: f"HumanEval/{t}")
            return subprocess.CompletedProcess(command, 0)
        seed = int(command[command.index("--data.seed") + 1])
        if seed == 0:
            write(root / "x/version_0/eval/step_0.json", {0})
        write(root / "x/version_0/eval/step_90.json", {0, 1, 2} if seed == 0 else {1})
        if seed == 0:
            (root / "x/version_0/checkpoints").mkdir(parents=True)
            (root / "x/version_0/checkpoints/last.ckpt").touch()
        return subprocess.CompletedProcess(command, 0 if seed == 0 else 1)

    monkeypatch.setattr(learning_mbpp.subprocess, "run", run)
    out = tmp_path / "out.json"
    monkeypatch.setattr("sys.argv", ["learning_mbpp.py", "--seeds", "0", "1", "2", "--root", str(tmp_path / "runs"),
                                     "--humaneval-baseline", str(base_humaneval), "--json", str(out)])
    with pytest.raises(SystemExit, match=r"rlcode fit failed \({1: 'rlcode fit exited 1', 2: 'rlcode fit exited 1'}\)"):
        learning_mbpp.main()
    assert [command[3] for command in commands] == ["fit", "test", "fit", "fit"]  # no HumanEval for a failed fit
    zero, one, two = json.loads(out.read_text())["results"]
    assert (zero["passed_after"], "fit_failed" in zero, zero["humaneval"]["passed_after"]) == (3, False, 2)
    assert (one["passed_before"], one["passed_after"], one["fit_failed"], "humaneval" in one) == (
        1, 1, "rlcode fit exited 1", False)
    assert (one["lost"], one["gained"], two["seed"]) == ([0], [1], 2)


def _generation(**changes) -> dict:
    settings = {"max_new_tokens": 160, "temperature": 0.2, "num_samples": 0, "k": [], "timeout": 5.0,
                "batch_size": 16, "prompt_format": "chat", "model_name": "smollm2-135m-instruct",
                "precision": "32-true", "rollout_backend": "hf", "stop": []}
    return {**settings, **changes}


@pytest.mark.parametrize(("changes", "named"), [({"max_new_tokens": 128}, "max_new_tokens (160 vs 128)"),
                                                ({"prompt_format": "plain"}, "prompt_format"),
                                                ({"precision": "bf16-true"}, "precision")])
def test_verdicts_scored_with_different_generation_settings_are_refused(tmp_path, changes, named):
    run = tmp_path / "runs/x/version_0/eval"
    run.mkdir(parents=True)
    problems = [{"task_id": 11, "passed": True}]
    (run / "step_0.json").write_text(json.dumps({"generation": _generation(), "problems": problems}))
    (run / "step_60.json").write_text(json.dumps({"generation": _generation(**changes), "problems": problems}))
    with pytest.raises(ValueError, match=r"different .*" + named.split(" ")[0]) as refused:
        learning_mbpp.summarize([(0, tmp_path)], baseline=None)
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_the_batch_size_matters_only_to_sampled_verdicts(tmp_path):
    """Greedy completions do not depend on the batch size; sampled ones draw a seed per batch."""
    run = tmp_path / "runs/x/version_0/eval"
    run.mkdir(parents=True)
    problems = [{"task_id": 11, "passed": True}]
    for sampled, refused in ((0, False), (8, True)):
        (run / "step_0.json").write_text(json.dumps({"generation": _generation(num_samples=sampled),
                                                     "problems": problems}))
        (run / "step_60.json").write_text(json.dumps({"generation": _generation(num_samples=sampled, batch_size=4),
                                                      "problems": problems}))
        if refused:
            with pytest.raises(ValueError, match="batch_size"):
                learning_mbpp.summarize([(0, tmp_path)], baseline=None)
        else:
            assert learning_mbpp.summarize([(0, tmp_path)], baseline=None)[0]["passed_after"] == 1
