"""Every MBPP reference solution passes its own tests through the real verdict path.

Timeout policy: the default (10 s, as in ``rlcode-eval``) covers every task on a quiet 2-core
machine; task 123 (``amicable_numbers_sum(9999)``) alone takes about 8 s there, so it gets 120 s
here, where other tests may be loading the machine: this file checks correctness, not speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rlcode.data import load_mbpp
from rlcode.sandbox import SandboxPool
from rlcode.sandbox.verdict import check_against_tests
from mbpp_location import mbpp_file  # noqa: E402

MBPP_DIR = mbpp_file().parent
pytestmark = pytest.mark.skipif(not (MBPP_DIR / "mbpp.jsonl").is_file(), reason="MBPP data not found")
SLOW_TASK, SLOW_TASK_TIMEOUT = 123, 120.0


@pytest.mark.slow
@pytest.mark.parametrize("variant, count", [("full", 974), ("sanitized", 427)])
def test_every_reference_solution_passes(variant, count):
    tasks = load_mbpp(MBPP_DIR, "all", variant=variant)
    assert len(tasks) == count
    with SandboxPool(timeout=10.0) as pool:
        futures = [(task, check_against_tests(
            pool, task.code, task.test_list + task.challenge_test_list, task.test_setup_code,
            timeout=SLOW_TASK_TIMEOUT if task.task_id == SLOW_TASK else None)) for task in tasks]
        verdicts = [(task, future.result()) for task, future in futures]
    failures = [(task.task_id, verdict.reason) for task, verdict in verdicts if not verdict.all_passed]
    assert failures == []
    assert sum(len(v.passed) for _, v in verdicts) == sum(
        len(t.test_list) + len(t.challenge_test_list) for t in tasks)
    if variant == "full":
        assert sum(len(t.challenge_test_list) > 0 for t in tasks) == 11
        assert sum(bool(t.test_setup_code) for t in tasks) == 2


def test_wrong_solutions_fail():
    """Control: swapping every task's code for the next task's code fails (almost) every task."""
    tasks = load_mbpp(MBPP_DIR, "validation")
    with SandboxPool(timeout=10.0) as pool:
        futures = [check_against_tests(pool, other.code, task.test_list, task.test_setup_code)
                   for task, other in zip(tasks, tasks[1:] + tasks[:1])]
        passed = [f.result().all_passed for f in futures]
    assert sum(passed) == 0


def test_rlcode_eval_passes_the_test_split_references(tmp_path):
    """All 499 test-split references except task 123, through the command as a subprocess."""
    tasks = [t for t in load_mbpp(MBPP_DIR, "test") if t.task_id != SLOW_TASK]
    samples = tmp_path / "references.jsonl"
    samples.write_text("".join(json.dumps({"task_id": t.task_id, "completion": t.code}) + "\n"
                               for t in tasks))
    env = dict(os.environ, MBPP_DATASET_PATH=str(MBPP_DIR / "mbpp.jsonl"))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rlcode.eval.cli", str(samples)], env=env,
                          capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary == {"pass@1": 1.0, "tasks": 499, "samples": 499, "passed": 499}
    results = [json.loads(line) for line in (tmp_path / "references_results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in results] == [t.task_id for t in tasks]
    assert all(r["passed"] and r["result"] == "passed" for r in results)
    print(f"rlcode-eval on 499 references: {elapsed:.2f}s wall")  # a figure, never an assertion
