"""Held-out output-prediction cases from MBPP (CRUXEval-style): programs nobody here wrote.

Each case is one MBPP task's reference solution called on the input of one of its asserts: the
program is the solution (with the task's setup code) followed by ``print(<the assert's call>)``,
and the expected output is what that program prints when run (the caller runs it in the sandbox,
with the code game's validity rule, and keeps the cases the predictor could write). A model that
gets better at predicting what code prints, by reading it, should score higher here; no program
here came from the model or from the game.

The call is the first call of the task's entry point in the assert, taken from its source text
(``assert set(f(x)) == ...`` gives ``f(x)``). Asserts that do not call the entry point are skipped.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from rlcode.data.mbpp import MBPPTask


@dataclass(frozen=True)
class PredictionCase:
    task_id: int
    assert_index: int
    program: str
    """The reference solution, then ``print(call)``."""
    call: str


def entry_point_call(test: str, entry_point: str) -> str | None:
    """Source of the first call of ``entry_point`` in one assert (None: it calls no such function)."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry_point:
            return ast.get_source_segment(test, node)
    return None


def prediction_cases(tasks: list[MBPPTask]) -> list[PredictionCase]:
    """One case per (task, assert) whose assert calls the task's entry point, in task order."""
    cases = []
    for task in tasks:
        if not task.entry_point:
            continue
        prefix = "\n\n".join(part for part in (task.test_setup_code.strip(), task.code.strip()) if part)
        for index, test in enumerate(task.test_list):
            call = entry_point_call(test, task.entry_point)
            if call is not None:
                cases.append(PredictionCase(task.task_id, index, f"{prefix}\n\nprint({call})\n", call))
    return cases
