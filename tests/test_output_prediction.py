"""Held-out output-prediction cases: the entry point's call taken from each assert, the program built."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlcode.data.mbpp import MBPPTask, load_mbpp
from rlcode.data.output_prediction import entry_point_call, prediction_cases
from mbpp_location import mbpp_file  # noqa: E402


def test_the_call_is_the_entry_points_first_call_in_the_assert():
    assert entry_point_call("assert set(f([1, 2])) == {1, 2}", "f") == "f([1, 2])"
    assert entry_point_call("assert math.isclose(area(2.0), 12.56, rel_tol=0.01)", "area") == "area(2.0)"
    assert entry_point_call("assert g(1) == 2", "f") is None
    assert entry_point_call("assert (", "f") is None  # not Python: skipped, never raised


def test_cases_put_setup_and_solution_before_the_print():
    task = MBPPTask(task_id=7, text="", code="def f(x):\n    return x + K", test_list=("assert f(1) == 3", "assert True"),
                    test_setup_code="K = 2")
    (case,) = prediction_cases([task])
    assert (case.task_id, case.assert_index, case.call) == (7, 0, "f(1)")
    assert case.program == "K = 2\n\ndef f(x):\n    return x + K\n\nprint(f(1))\n"
    namespace: dict = {}
    exec(compile(case.program.replace("print", "result = "), "case", "exec"), namespace)  # noqa: S102
    assert namespace["result"] == 3


@pytest.mark.skipif(not Path(str(mbpp_file())).is_file(), reason="MBPP data not found")
def test_every_assert_of_the_test_split_gives_a_case_that_parses():
    cases = prediction_cases(load_mbpp(str(mbpp_file()), split="test"))
    assert len(cases) == 1500  # 500 tasks x 3 asserts, each calling its entry point
    for case in cases:
        ast.parse(case.program)
