"""The assert splitter: what stays in the parent, what becomes a probe, how the parent decides."""

from __future__ import annotations

import ast

import pytest

from rlcode.sandbox.asserts import (MISSING, AssertParseError, bound_names, bound_names_among,
                                    called_function_name, evaluate_plan, overridable_names,
                                    plan_assert)
from rlcode.sandbox.plain_data import Opaque
from mbpp_location import mbpp_file  # noqa: E402

MBPP_DIR = mbpp_file().parent


def _sources(plan):
    return [p.source for p in plan.probes]


def test_expected_side_stays_in_parent():
    plan = plan_assert("assert sorted(f([3, 1])) == [1, 3]", frozenset({"f"}))
    assert _sources(plan) == ["f([3, 1])"]
    assert evaluate_plan(plan, [[3, 1]]).passed
    outcome = evaluate_plan(plan, [[3, 2]])
    assert not outcome.passed and outcome.detail == "got [2, 3], expected [1, 3]"


def test_isclose_and_set_wrappers_are_parent_side():
    plan = plan_assert("assert math.isclose(area(2), 12.56, rel_tol=0.001)", frozenset({"area"}))
    assert _sources(plan) == ["area(2)"]
    assert evaluate_plan(plan, [12.5664]).passed
    assert evaluate_plan(plan, [13.0]).detail == "got 13.0, expected 12.56"
    plan = plan_assert("assert set(f(1)) == set([1, 2])", frozenset({"f"}))
    assert evaluate_plan(plan, [(2, 1, 1)]).passed


def test_opaque_values_never_compare():
    for test in ("assert f(1) == 3", "assert f(1) != 3", "assert not f(1) == 3", "assert [f(1)] != [3]"):
        plan = plan_assert(test, frozenset({"f"}))
        assert not evaluate_plan(plan, [Opaque("Weird")]).passed, test


def test_raised_and_missing_probes_fail():
    plan = plan_assert("assert f(1) == 3", frozenset({"f"}))
    assert evaluate_plan(plan, [Opaque("ValueError: bad", raised=True)]).detail == "error: ValueError: bad"
    assert evaluate_plan(plan, [MISSING]).detail == "exited before tests ran"
    assert evaluate_plan(plan, []).detail == "exited before tests ran"


def test_truth_tests_are_probed_as_exact_bools():
    plan = plan_assert("assert f(1)", frozenset({"f"}))
    assert plan.is_fallback and _sources(plan) == ["(not not (f(1)))"]
    assert evaluate_plan(plan, [True]).passed
    assert not evaluate_plan(plan, [1]).passed  # only an exact True counts on the weaker path
    plan = plan_assert("assert not f(1)", frozenset({"f"}))
    assert not plan.is_fallback and _sources(plan) == ["(not not (f(1)))"]
    assert evaluate_plan(plan, [False]).passed and not evaluate_plan(plan, [True]).passed


def test_probes_without_candidate_names_run_in_reference():
    plan = plan_assert("assert size((1, 2)) == sys.getsizeof((1, 2))", frozenset({"size"}))
    assert [(p.source, p.reference, p.imports) for p in plan.probes] == [
        ("size((1, 2))", False, ()), ("sys.getsizeof((1, 2))", True, ("sys",))]
    assert evaluate_plan(plan, [56, 56]).passed and not evaluate_plan(plan, [48, 56]).passed


def test_expected_side_ignores_rebound_names():
    # The program binds sys, math and len: on the expected side they still mean the real ones.
    names = frozenset({"sys", "math", "len", "size"})
    plan = plan_assert("assert size((1,)) == sys.getsizeof((1,))", names)
    assert [p.reference for p in plan.probes] == [False, True]
    plan = plan_assert("assert math.isclose(size(2), 3.0)", names)
    assert _sources(plan) == ["size(2)"]
    plan = plan_assert("assert size([1]) == len([1])", names)
    assert _sources(plan) == ["size([1])"]


def test_redefined_whitelisted_name_is_probed():
    # MBPP task 126 defines its own `sum`: the parent must not call the builtin in its place.
    plan = plan_assert("assert sum(10, 15) == 6", frozenset({"sum"}))
    assert _sources(plan) == ["sum(10, 15)"]
    assert called_function_name("assert sum(10, 15) == 6", frozenset({"sum"})) == "sum"
    assert called_function_name("assert set(f(1)) == {1}") == "f"


def test_lambda_arguments_move_the_whole_call_to_the_child():
    plan = plan_assert("assert sorted(f(1), key=lambda t: t[1]) == [(1, 2)]", frozenset({"f"}))
    assert _sources(plan) == ["sorted(f(1), key=lambda t: t[1])"]


def test_method_calls_only_on_exact_builtin_values():
    plan = plan_assert("assert f(1).startswith('ab')", frozenset({"f"}))
    assert _sources(plan) == ["f(1)"]
    assert evaluate_plan(plan, ["abc"]).passed and not evaluate_plan(plan, ["xbc"]).passed
    assert not evaluate_plan(plan, [Opaque("StrSubclass")]).passed


def test_parent_refuses_huge_arithmetic():
    plan = plan_assert("assert [0] * f(1) == []", frozenset({"f"}))
    assert "too large" in evaluate_plan(plan, [10**12]).detail
    plan = plan_assert("assert 10 ** f(1) == 1", frozenset({"f"}))
    assert "too large" in evaluate_plan(plan, [10**9]).detail
    plan = plan_assert("assert bytes(f(1)) == b''", frozenset({"f"}))
    assert "too large" in evaluate_plan(plan, [10**12]).detail
    plan = plan_assert("assert f(1).replace('a', f(2)) == ''", frozenset({"f"}))
    assert "too large" in evaluate_plan(plan, ["a" * 10**4, "b" * 10**4]).detail


def test_bound_names():
    code = ("import sys\nimport os as o\nfrom re import sub\nclass A:\n    inner = 1\n"
            "def f():\n    local = 2\nx, y = 1, 2\nif x:\n    z = 3\ntry:\n    pass\nexcept E as err:\n    pass")
    assert bound_names(code) == {"o", "sub", "A", "f", "x", "y", "z", "err"}
    assert bound_names("def (") == frozenset()


def test_program_bindings_are_read_only_for_builtin_and_stdlib_names_the_tests_use():
    tests = ["assert sum(f(1), 2) == len([1])", "assert size(1) == sys.getsizeof(1)", "assert ("]
    assert overridable_names(tests) == {"sum", "len", "sys"}
    code = "def f(x): return x\ndef sum(a, b): return a\nimport os as sys\nlen = 3"
    assert bound_names_among(code, overridable_names(tests)) == {"sum", "sys", "len"}
    assert bound_names_among("def f(x): return len(x)", frozenset({"len"})) == frozenset()
    # a non-ASCII program may spell a name in a form NFKC folds into it: always parsed
    assert bound_names_among("def ｓｕｍ(a, b): return a", frozenset({"sum"})) == {"sum"}


def test_not_an_assert_is_rejected():
    with pytest.raises(AssertParseError):
        plan_assert("print(1)")
    with pytest.raises(AssertParseError):
        plan_assert("assert (")


@pytest.mark.skipif(not (MBPP_DIR / "mbpp.jsonl").is_file(), reason="MBPP data not found")
def test_every_mbpp_assert_splits_with_expected_values_in_the_parent():
    """Over full + sanitized MBPP: no probe contains a literal expected side; the only whole-assert
    probes are bare truth tests (``assert f(x)``), which have no expected value."""
    from rlcode.data import load_mbpp

    asserts = fallbacks = reference = 0
    for variant in ("full", "sanitized"):
        for task in load_mbpp(MBPP_DIR, "all", variant=variant):
            names = bound_names(task.code) | bound_names(task.test_setup_code)
            for test in task.test_list + task.challenge_test_list:
                plan = plan_assert(test, names)
                asserts += 1
                fallbacks += plan.is_fallback
                reference += sum(p.reference for p in plan.probes)
                if plan.is_fallback:
                    assert "==" not in test, test
                expression = plan.expression
                if isinstance(expression, ast.Compare):  # the expected side is in no child probe
                    expected = expression.comparators[0]
                    for node in ast.walk(expression):
                        index = plan.probe_of_node.get(id(node))
                        if index is not None and not plan.probes[index].reference:
                            assert all(n is not expected for n in ast.walk(node)), test
    assert asserts == 4262 and fallbacks == 12 and reference == 6


def _probe_trees_match(plan) -> bool:
    """Each probe's source parses back to exactly the subtree it stands for."""
    for node in ast.walk(plan.expression):
        index = plan.probe_of_node.get(id(node))
        if index is None:
            continue
        source = plan.probes[index].source
        tree = ast.parse(source, mode="eval").body
        if source.startswith("(not not (") and source.endswith("))"):
            tree = tree.operand.operand
        if ast.dump(tree) != ast.dump(node):
            return False
    return True


def test_probe_sources_parse_back_to_their_subtree():
    # Probes are cut from the test's own text where that is exact; other shapes are unparsed.
    for test in ("assert f(1, 'é') == 2", "assert (f\n(1)) == 2", "assert f(1,\n  2) == 3",
                 "assert [*f(1), 2] == [1, 2]", "assert g(x)[1:2] == 'a'  # comment",
                 "  assert f(1) == 1", "assert ﬁ(1) == 2"):
        plan = plan_assert(test, frozenset({"f", "g", "x", "fi"}))
        assert plan.probes and _probe_trees_match(plan), test
    assert _sources(plan_assert("assert ﬁ(1) == 2", frozenset({"fi"}))) == ["ﬁ(1)"]


@pytest.mark.skipif(not (MBPP_DIR / "mbpp.jsonl").is_file(), reason="MBPP data not found")
def test_every_mbpp_probe_parses_back_to_its_subtree():
    from rlcode.data import load_mbpp

    for variant in ("full", "sanitized"):
        for task in load_mbpp(MBPP_DIR, "all", variant=variant):
            names = bound_names(task.code) | bound_names(task.test_setup_code)
            for test in task.test_list + task.challenge_test_list:
                assert _probe_trees_match(plan_assert(test, names)), test
