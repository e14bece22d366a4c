"""Hidden tests: type-aware mutation, templates from the visible asserts, the build over the sandbox,
and the rewards that a program special-casing the visible asserts cannot pass.

MBPP tasks are read from MBPP_DATASET_PATH (three tasks and their reference solutions; the
alternative solutions below are written here, differently from the references)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlcode.rewards import REWARDS, MBPPHiddenTestsFraction, MBPPHiddenTestsPassed, MBPPTestsPassed
from rlcode.rewards.base import Scored, row_metrics
from rlcode.rewards.hidden_build import build_task, cache_dir, read_cache, write_cache, GENERATOR_VERSION
from rlcode.rewards.hidden_inputs import candidate_inputs, seed_for
from rlcode.rewards.hidden_tests import (NO_LITERAL_ARGUMENTS, UNSUPPORTED_ASSERT, NoTemplate, literal_text,
                                         template_of, templates)
from rlcode.rewards.mixture import RewardMixture
from rlcode.rewards.mutation import mutate, size, size_bound
from rlcode.sandbox import SandboxPool

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Task:  # what build_task reads: MBPPTask's fields
    task_id: int
    code: str
    test_list: tuple
    test_setup_code: str = ""
    entry_point: str | None = None


# -- mutation ------------------------------------------------------------------------------------

def test_mutants_keep_their_types_signs_and_record_lengths():
    rng = random.Random(0)
    for _ in range(300):
        assert type(mutate(7, rng, [3, 9])) is int and mutate(7, rng, [3, 9]) >= 0
        assert type(mutate(2.5, rng, [1.25])) is float
        assert isinstance(mutate("abc", rng, ["de"]), str)
        items = mutate([1, 2, 3], rng, [[4, 5]])
        assert items and all(type(x) is int for x in items)
        record = mutate(("a", 1, 2.5), rng, [])
        assert len(record) == 3 and [type(x) for x in record] == [str, int, float]
        assert all(type(x) is str for x in mutate({"x", "y"}, rng, []))
        assert set(mutate({"k": 1, "j": 2}, rng, []).values()) <= set(range(-5, 10))


def test_a_length_every_assert_shares_is_kept():
    """Single characters stay single characters, a matrix keeps its row length."""
    rng = random.Random(1)
    seen_other_lengths = False
    for _ in range(200):
        assert len(mutate("l", rng, ["a", "P"])) == 1
        matrix = mutate([[1, 2, 3], [4, 5, 6]], rng, [])
        assert all(len(row) == 3 for row in matrix)
        seen_other_lengths |= len(mutate("hello", rng, ["abcda"])) != 5 or len(mutate("hello", rng, ["ab"])) != 5
    assert seen_other_lengths  # the rule binds only where every value agrees


def test_size_bound():
    assert size([1, [2, 3], "abcd"]) == 1 + 1 + 3 + 4
    assert size_bound([1, 2]) == 13 and size_bound(list(range(20))) == 42


def test_literal_text_accepts_plain_data_only():
    assert literal_text({1: (2, "x"), "s": {3}}) == "{1: (2, 'x'), 's': {3}}"
    assert literal_text(set()) == "set()"
    for value in (float("inf"), float("nan"), frozenset({1}), object(), 10 ** 5000, "x" * 2000):
        assert literal_text(value) is None


# -- templates -----------------------------------------------------------------------------------

def test_templates_keep_the_task_own_view_and_tolerance():
    equal = template_of("assert set(f((1, 2), 'a')) == set((2,))", "f")
    assert equal.form == "equal" and equal.probe("f(3)") == "set(f(3))"
    assert equal.assert_for("f(3)", {4}) == "assert set(f(3)) == {4}"
    flipped = template_of("assert 5 == f(2)", "f")
    assert flipped.assert_for("f(4)", 7) == "assert 7 == f(4)"
    close = template_of("assert math.isclose(area(2.0), 12.566, rel_tol=0.001)", "area")
    assert close.form == "isclose"
    assert close.assert_for("area(3.0)", 28.27) == "assert math.isclose(area(3.0), 28.27, rel_tol=0.001)"
    assert close.assert_for("area(3.0)", "x") is None
    truth = template_of("assert not check('ab')", "check")
    assert truth.expected == "False" and template_of("assert check('a')", "check").expected == "True"
    assert equal.expected == "set((2,))" and flipped.expected == "5"
    assert truth.probe("check('b')") == "(not not (check('b')))"
    assert truth.assert_for("check('b')", True) == "assert check('b')"
    assert truth.assert_for("check('c')", False) == "assert not check('c')"
    arithmetic = template_of("assert p(10, 1.0/3, [0]*3) == 0.5", "p")
    assert arithmetic.args == (("value", 10), ("value", 1.0 / 3), ("value", [0, 0, 0]))
    unevaluated = template_of("assert p(1, 10**10**10, [0]*10000000, 1e400) == 0.5", "p")
    assert unevaluated.args[1:] == (("source", "10 ** 10 ** 10"), ("source", "[0] * 10000000"), ("source", "1e309"))


@pytest.mark.parametrize("test, reason", [
    ("assert f(1) < 3", UNSUPPORTED_ASSERT),
    ("assert f(1) == f(2)", UNSUPPORTED_ASSERT),
    ("assert f(*xs) == 1", UNSUPPORTED_ASSERT),
    ("assert g(1) == 2", UNSUPPORTED_ASSERT),  # not the entry point
    ("assert f(root) == False", NO_LITERAL_ARGUMENTS),
])
def test_asserts_without_a_template_say_why(test, reason):
    with pytest.raises(NoTemplate) as refused:
        template_of(test, "f")
    assert refused.value.reason == reason
    assert templates([test], "f") == ([], reason)


TESTS = ("assert words({'b', 'a'}, ['x', 'yy'], 3) == 1", "assert words({'c'}, ['zz'], 5) == 2")


def _calls(seed):
    found, _ = templates(TESTS, "words")
    return [call for _, call in candidate_inputs(found, random.Random(seed_for(7, seed)), 20)]


def test_inputs_are_deterministic_for_a_seed_and_new():
    first = _calls(0)
    assert first == _calls(0) and len(first) == 20
    assert first != _calls(1)
    assert len(set(first)) == len(first)
    assert not {"words({'b', 'a'}, ['x', 'yy'], 3)", "words({'c'}, ['zz'], 5)"} & set(first)


def test_a_length_argument_follows_its_sequence():
    """``f(arr, n)`` with n == len(arr) in every assert: n is set to the new length, never mutated."""
    found, _ = templates(["assert f([1, 2, 3], 3, 7) == 1", "assert f([4, 5], 2, 9) == 2"], "f")
    calls = [call for _, call in candidate_inputs(found, random.Random(0), 30)]
    assert len(calls) == 30
    for call in calls:
        items, n, _ = eval(call.replace("f(", "(", 1))
        assert n == len(items)
    written, _ = templates(["assert f([P(1), P(2)], 2, 5) == 1", "assert f([P(3)], 1, 6) == 2"], "f")
    assert all(", 2, " in call or ", 1, " in call for _, call in candidate_inputs(written, random.Random(0), 10))


def test_inputs_do_not_depend_on_the_process_string_hashes():
    """Sets of strings iterate in another order under another PYTHONHASHSEED: the mutator sorts."""
    script = ("import random, json; from tests.test_hidden_tests import _calls; print(json.dumps(_calls(0)))")
    outputs = set()
    for hash_seed in ("1", "2", "3"):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)},
                              check=True)
        outputs.add(done.stdout)
    assert len(outputs) == 1 and json.loads(outputs.pop()) == _calls(0)


# -- the build over the sandbox ------------------------------------------------------------------

@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, timeout=10.0) as pool:
        yield pool


@pytest.fixture(scope="module")
def mbpp():
    from rlcode.data.mbpp import load_mbpp

    return {t.task_id: t for t in load_mbpp(split="all") if t.task_id in (3, 11, 17, 367)}


@pytest.fixture(scope="module")
def built(pool, mbpp):
    return {task_id: build_task(pool, task) for task_id, task in mbpp.items()}


# Written here, differently from MBPP's references (a loop, str.find, a sum).
ALTERNATIVES = {
    3: "import math\ndef is_not_prime(n):\n    return any(n % d == 0 for d in range(2, math.isqrt(n) + 1))\n",
    11: ("def remove_Occ(s, ch):\n    i = s.find(ch)\n    if i >= 0:\n        s = s[:i] + s[i + 1:]\n"
         "    j = s.rfind(ch)\n    if j >= 0:\n        s = s[:j] + s[j + 1:]\n    return s\n"),
    17: "def square_perimeter(a):\n    return sum([a] * 4)\n",
}


def _special_casing(task) -> str:
    """A program that returns each visible assert's expected value for its input, else None."""
    lines = [f"def {task.entry_point}(*args):"]
    for test in task.test_list:
        template = template_of(test, task.entry_point)
        call = template.call(template.args, template.keywords)
        lines.append(f"    if args == ({call[len(task.entry_point) + 1:-1]},): return {template.expected}")
    lines.append("    return None")
    return "\n".join(lines) + "\n"


def test_a_task_the_generator_cannot_read_costs_that_task_alone(pool):
    from rlcode.rewards.hidden_build import build

    odd = Task(1, "def f(x): return x", (None,), entry_point="f")
    fine = Task(2, "def f(x): return x", ("assert f(3) == 3",), entry_point="f")
    cache = build(pool, [odd, fine])
    assert cache["tasks"]["1"] == {"tests": [], "reason": "generator_error"}
    assert cache["tasks"]["2"]["tests"] and cache["generator_version"] == GENERATOR_VERSION


def test_mbpp_tasks_get_hidden_tests_or_a_reason(built):
    for task_id in (3, 11, 17):
        tests, reason = built[task_id]
        assert 5 <= len(tests) <= 10 and reason is None, (task_id, reason)
    assert built[367] == ([], NO_LITERAL_ARGUMENTS)  # its argument is a tree the setup code builds


def test_every_kept_hidden_test_passes_on_the_reference(pool, mbpp, built):
    reward = MBPPHiddenTestsPassed(pool=pool)
    ids = [3, 11, 17]
    rows = _rows(mbpp, built, ids)
    assert reward(completions=[mbpp[i].code for i in ids], **rows) == [1.0, 1.0, 1.0]


def _rows(mbpp, built, ids):
    return {"test_list": [list(mbpp[i].test_list) for i in ids], "entry_point": [mbpp[i].entry_point for i in ids],
            "hidden_tests": [built[i][0] for i in ids], "task_id": ids}


def test_special_casing_passes_the_visible_asserts_only_and_is_flagged(pool, mbpp, built):
    ids = [3, 11, 17]
    cheats = [_special_casing(mbpp[i]) for i in ids]
    rows = _rows(mbpp, built, ids)
    assert MBPPTestsPassed(pool=pool)(completions=cheats, **rows) == [1.0, 1.0, 1.0]
    hidden = MBPPHiddenTestsPassed(pool=pool)
    assert hidden(completions=cheats, **rows) == [0.0, 0.0, 0.0]
    assert [item.hardcoded for item in hidden.last_scored] == [True, True, True]
    assert all(detail.startswith("hardcoded: hidden test ") for detail in hidden.last_details)
    assert hidden.last_metrics["hardcoded_share"] == 1.0
    fraction = MBPPHiddenTestsFraction(pool=pool)
    scores = fraction(completions=cheats, **rows)
    for score, i in zip(scores, ids):  # the visible three pass, plus hidden ones whose answer is None
        assert 3 / (3 + len(built[i][0])) <= score < 1.0


def test_a_correct_alternative_passes_both(pool, mbpp, built):
    ids = [3, 11, 17]
    rows = _rows(mbpp, built, ids)
    alternatives = [ALTERNATIVES[i] for i in ids]
    assert MBPPTestsPassed(pool=pool)(completions=alternatives, **rows) == [1.0, 1.0, 1.0]
    hidden = MBPPHiddenTestsPassed(pool=pool)
    assert hidden(completions=alternatives, **rows) == [1.0, 1.0, 1.0]
    assert [item.hardcoded for item in hidden.last_scored] == [False, False, False]
    assert hidden.last_metrics["hardcoded_share"] == 0.0


def test_the_float_tolerance_comes_from_the_asserts(pool):
    """An isclose template's rel_tol carries over; a plain == stays exact. The approximate answer
    (pi as 3.1416, relative error 2.3e-6) is within the asserts' 1e-3 and not exact."""
    reference = "import math\ndef area(r):\n    return math.pi * r * r\n"
    close = Task(1, reference, ("assert math.isclose(area(2.0), 12.566, rel_tol=0.001)",
                                "assert math.isclose(area(1.5), 7.0686, rel_tol=0.001)"), "import math", "area")
    exact = Task(2, reference, ("assert area(2.0) == 12.566370614359172", "assert area(1.5) == 7.0685834705770345"),
                 "", "area")
    close_tests, _ = build_task(pool, close)
    exact_tests, _ = build_task(pool, exact)
    assert close_tests and all("rel_tol=0.001" in test for test in close_tests)
    assert exact_tests and not any("isclose" in test for test in exact_tests)
    approximate = "def area(r):\n    return 3.1416 * r * r\n"
    reward = MBPPHiddenTestsPassed(pool=pool)
    # Both rows' visible asserts are ones the approximation passes: only the hidden tests differ.
    rows = {"test_list": [list(close.test_list), list(close.test_list)], "hidden_tests": [close_tests, exact_tests],
            "entry_point": ["area", "area"]}
    assert reward(completions=[approximate, approximate], **rows) == [1.0, 0.0]


def test_truth_tests_become_truth_tests(pool):
    """Bare truth asserts give ``assert f(x)`` / ``assert not f(x)`` by the reference's truth value:
    a program returning a truthy non-bool passes them as it passes the visible ones."""
    task = Task(3, "def even(n):\n    return n % 2 == 0\n", ("assert even(4)", "assert not even(7)", "assert even(10)"),
                entry_point="even")
    tests, reason = build_task(pool, task)
    assert reason is None and tests
    assert {test.startswith("assert not ") for test in tests} == {True, False}
    truthy = "def even(n):\n    return 'yes' if n % 2 == 0 else ''\n"
    cheat = "def even(n):\n    return n in (4, 10)\n"
    rows = {"test_list": [list(task.test_list)] * 3, "hidden_tests": [tests] * 3}
    reward = MBPPHiddenTestsPassed(pool=pool)
    assert reward(completions=[task.code, truthy, cheat], **rows) == [1.0, 1.0, 0.0]
    assert [item.hardcoded for item in reward.last_scored] == [False, False, True]


# -- never raising, warnings ---------------------------------------------------------------------

def test_the_reward_never_raises(pool):
    reward = MBPPHiddenTestsPassed(pool=pool)
    tests = [["assert f(1) == 2"]] * 4
    hidden = [["assert f(2) == 3"], [], None, "not json"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scores = reward(completions=["def f(x): return x + 1", "garbage ((", "def f(x): return x + 1", 3],
                        test_list=tests, hidden_tests=hidden)
    assert scores == [1.0, 0.0, 1.0, 0.0]
    assert sum("no hidden tests" in str(w.message) for w in caught) == 1  # once per reward
    with pytest.warns(UserWarning, match="no 'test_list' column"):
        assert reward(completions=["def f(x): return x"], prompts=["p"]) == [0.0]  # no test_list at all
    assert reward.last_scored[0].status == "internal_error"
    fresh = MBPPHiddenTestsPassed(pool=pool)
    with pytest.warns(UserWarning, match="no 'hidden_tests' column"):
        assert fresh(completions=["def f(x): return x + 1"], test_list=[["assert f(1) == 2"]]) == [1.0]
    assert fresh.last_scored[0].hardcoded is False


# -- metrics and registration --------------------------------------------------------------------

def test_hardcoded_share_is_a_row_metric():
    rows = [Scored(0.0, "hardcoded: ...", "ok", False, True), Scored(1.0, "passed", "ok", True, False),
            Scored(0.0, "timeout", "timeout", False, False), Scored(0.0, "internal_error: x", "internal_error", False)]
    assert row_metrics(rows)["hardcoded_share"] == 0.25
    assert "hardcoded_share" not in row_metrics([Scored(1.0, "passed", "ok", True)])  # other rewards


def test_registered_and_logged_under_its_name(pool):
    assert REWARDS["mbpp_hidden_tests"] is MBPPHiddenTestsPassed
    assert REWARDS["mbpp_hidden_tests_fraction"] is MBPPHiddenTestsFraction
    mixture = RewardMixture([MBPPHiddenTestsPassed(pool=pool)])
    outcome = mixture.start(["p"], ["def f(x):\n    return 2 if x == 1 else 0\n"], test_list=[["assert f(1) == 2"]],
                            hidden_tests=[["assert f(3) == 4"]]).result()
    assert outcome.total == [0.0] and outcome.metrics["mbpp_hidden_tests/hardcoded_share"] == 1.0
    assert outcome.details[0].startswith("hardcoded: hidden test 1 failed: got 0, expected 4")


def test_a_program_too_slow_for_the_hidden_inputs_is_not_flagged(pool):
    """Out of time after passing the shown asserts: slow, not special-casing (scored 0 all the same)."""
    reward = MBPPHiddenTestsPassed(pool=pool, timeout=1.0)
    slow = "import time\ndef f(x):\n    if x != 1:\n        time.sleep(30)\n    return x + 1\n"
    assert reward(completions=[slow], test_list=[["assert f(1) == 2"]], hidden_tests=[["assert f(3) == 4"]]) == [0.0]
    assert reward.last_scored[0].status == "timeout" and reward.last_scored[0].hardcoded is False


# -- the cache -----------------------------------------------------------------------------------

def test_cache_round_trip_and_datamodule_column(tmp_path, monkeypatch):
    from rlcode.data.datamodule import MBPPDataModule
    from rlcode.data.hidden_tests import data_file, hidden_tests_by_task
    from rlcode.rewards.hidden_build import file_sha256

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache" / "rlcode" / "hidden_tests"
    data = tmp_path / "mbpp.jsonl"
    data.write_text("".join(json.dumps({"task_id": i, "text": "t", "code": "def f(x): return x",
                                        "test_list": [f"assert f({i}) == {i}"], "test_setup_code": "",
                                        "challenge_test_list": []}) + "\n" for i in (601, 602, 603, 604)))
    assert data_file(tmp_path) == data and hidden_tests_by_task(data) is None
    module = MBPPDataModule(source=str(data), train_split="all", prompts_per_step=2)
    module.setup("fit")
    assert "hidden_tests" not in module.make_batch(module.train_tasks[:2], 0, 0)
    digest = file_sha256(data)
    write_cache(digest, {"generator_version": GENERATOR_VERSION, "tasks": {
        "601": {"tests": ["assert f(7) == 7"], "reason": None}, "602": {"tests": [], "reason": "x"}}})
    assert read_cache(digest)["tasks"]["601"]["tests"] == ["assert f(7) == 7"]
    fresh = MBPPDataModule(source=str(data), train_split="all", prompts_per_step=2)
    fresh.setup("fit")
    batch = fresh.make_batch(fresh.train_tasks[:3], 0, 0)
    assert batch["hidden_tests"] == [["assert f(7) == 7"], [], []]
    write_cache(digest, {"generator_version": GENERATOR_VERSION - 1, "tasks": {}})
    assert read_cache(digest) is None  # another generator's tests read as absent


def test_grpo_hands_the_hidden_tests_column_to_its_rewards():
    """The DataModule's column reaches the reward functions through the GRPO step (each prompt's
    tests repeated for each of its completions)."""
    from types import SimpleNamespace

    from rlcode.modes import GRPO

    seen = {}

    def recording(prompts, completions, **columns):
        seen.update(columns)
        return [0.0] * len(completions)

    mode = GRPO(rewards=["execution"], num_generations=2)
    mode.reward_mixture = RewardMixture([recording])
    learner = SimpleNamespace(render=lambda prompt: prompt, global_step=0,
                              generate=lambda prompts, group, seed: SimpleNamespace(completion_texts=["a"] * 4))
    batch = {"prompt": ["p", "q"], "task_id": [1, 2], "test_list": [["assert f(1) == 1"]] * 2,
             "hidden_tests": [["assert f(2) == 2"], []]}
    mode._groups(learner, batch, seed=0).job.result()
    assert seen["hidden_tests"] == [["assert f(2) == 2"], ["assert f(2) == 2"], [], []]


def test_the_flag_reaches_the_step_record_and_the_rollout_rows(pool):
    """From the reward's Scored rows to StepRecord.hardcoded to rollouts.jsonl's rows; a step
    without a hidden-test reward adds no key."""
    from types import SimpleNamespace

    import torch

    from rlcode.callbacks.rollout_logging import sample_rows
    from rlcode.training.experience import CompletionGroups

    def step(functions):
        completions = ["def f(x):\n    return 2\n", "def f(x):\n    return x + 1\n"]
        outcome = RewardMixture(functions).start(["p", "p"], completions, test_list=[["assert f(1) == 2"]] * 2,
                                                 hidden_tests=[["assert f(5) == 6"]] * 2).result()
        rollout = SimpleNamespace(completion_texts=completions, completion_mask=torch.ones(2, 3),
                                  truncated=torch.zeros(2, dtype=torch.bool))
        groups = CompletionGroups(rollout, ["p"], [601], 2, None, outcome)
        return groups.record(step=0, advantages=torch.zeros(2), updated=True, loss={},
                             totals=SimpleNamespace(metrics=dict), frac_zero_std=0.0, timings={}, extra_metrics={})

    record = step([MBPPTestsPassed(pool=pool), MBPPHiddenTestsPassed(pool=pool)])
    assert record.hardcoded == [True, False]
    assert [row["hardcoded"] for row in sample_rows(record, 2)] == [True, False]
    plain = step([MBPPTestsPassed(pool=pool)])
    assert plain.hardcoded == [] and "hardcoded" not in sample_rows(plain, 2)[0]
