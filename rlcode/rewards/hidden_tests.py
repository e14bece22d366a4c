"""Hidden tests for a task: new inputs by type-aware mutation of its asserted ones, expected outputs
from its reference solution, written as asserts in the form of the task's own: the templates.

A task's prompt shows its asserts, and a reward that runs only those pays a program that returns
the asserted values for the asserted inputs. EvalPlus (MBPP+, HumanEval+) adds tests the model
never saw; this is its method, scaled down:

1. Each visible assert is read as a *template*: ``G == E`` (either side may hold the call),
   ``math.isclose(G, E, rel_tol=...)`` or a truth test ``G`` / ``not G``, where ``G`` holds the one
   call of the task's function (``set(f(x))``, ``int(f(x))``: the task's own view of the result)
   and ``E`` is the expected side. The call's arguments are literal values (constant arithmetic
   such as ``1.0/3`` is evaluated); a non-literal argument (a name the setup code binds) is kept
   as it is, and a call with no literal argument gives no template.
2. Inputs: ``rlcode.rewards.hidden_inputs`` mutates literal arguments of the templates
   (``rlcode.rewards.mutation``), deterministically for a seed derived from the task id and the
   build's global seed.
3. The reference solution computes ``G`` for each input in the sandbox (``hidden_build``); inputs where
   it raises, times out, or whose value is not plain data with a literal form are dropped. The
   hidden test is the template with the new call and the reference's value as ``E`` (truth tests:
   ``G`` or ``not G`` by the reference's truth value), so the tolerance is the task's own: an
   ``isclose`` template keeps its ``rel_tol``, a ``round(f(x), 2)`` template its rounding, and a
   plain ``==`` on a float is exact, as in the visible assert.

Simplifications: one function call per assert (an assert that calls the task's function twice, or
compares with ``<``, gives no template); no input contracts (see ``mutation``).
"""

from __future__ import annotations

import ast
import copy
import math
from dataclasses import dataclass

from rlcode.sandbox.asserts import AssertParseError, parse_assert

MAX_HIDDEN = 10  # kept per task: 13 asserts per execution instead of 3
MAX_EXPECTED_CHARS = 1000  # an expected value's literal; longer ones are dropped (a verdict holds them)
MAX_ARGUMENT_CHARS = 4000  # an argument's literal (MBPP's longest assert is under 2,000 characters)
_LARGEST_FACTOR = 10 ** 6  # constant arithmetic in an asserted argument: no huge products or powers
_CALL, _EXPECTED = "__rlcode_hidden_call__", "__rlcode_hidden_expected__"  # placeholders in templates
_CONSTANT_NODES = (ast.Expression, ast.Constant, ast.BinOp, ast.UnaryOp, ast.List, ast.Tuple, ast.Set,
                   ast.Dict, ast.Load, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.unaryop)

# Why a task has no hidden tests (the cache records one per such task; the coverage counts them).
UNSUPPORTED_ASSERT = "unsupported_assert"  # not ==, isclose or a truth test of one call
NO_LITERAL_ARGUMENTS = "no_literal_arguments"  # every argument is a name bound by the setup code
NO_NEW_INPUTS = "no_new_inputs"  # mutation found nothing new (no arguments, or only None)
REFERENCE_REJECTED = "reference_rejected_all"  # the reference raised, timed out or was not
# deterministic on every new input, or its values were not plain data
SANDBOX_ERROR = "sandbox_error"  # the pool refused or failed the reference's execution
GENERATOR_ERROR = "generator_error"  # this module raised on the task (a record it cannot read)


class NoTemplate(ValueError):
    """The assert is not of a form hidden tests can copy; ``reason`` is one of the names above."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Template:
    """One visible assert, as a pattern for hidden tests."""

    form: str  # "equal", "isclose" or "truth"
    test: str  # the assert, with the call and the expected side as placeholders (truth: unused)
    got: str  # the expression the reference evaluates, with the call as a placeholder
    entry_point: str
    args: tuple  # per positional argument: ("value", v) or ("source", text)
    keywords: tuple  # (name, ("value", v) | ("source", text)) pairs
    expected: str  # the visible assert's expected side ("True" / "False" for a truth test)
    lengths: tuple = ()  # per positional argument: its length when a sized literal or a display

    def call(self, args, keywords) -> str:
        parts = [_argument_text(a) for a in args] + [f"{k}={_argument_text(v)}" for k, v in keywords]
        return f"{self.entry_point}({', '.join(parts)})"

    def probe(self, call: str) -> str:
        """What the reference computes for this call (a truth test's exact truth value)."""
        got = self.got.replace(_CALL, call)
        return f"(not not ({got}))" if self.form == "truth" else got

    def assert_for(self, call: str, value) -> str | None:
        """The hidden test of this call given the reference's value of ``probe(call)``, or None when
        the value has no literal form the parent evaluates."""
        if self.form == "truth":
            if type(value) is not bool:
                return None
            return f"assert {'' if value else 'not '}{self.got.replace(_CALL, call)}"
        if self.form == "isclose" and (type(value) not in (int, float) or not math.isfinite(value)):
            return None
        text = literal_text(value)
        if text is None:
            return None
        return self.test.replace(_CALL, call).replace(_EXPECTED, text)


def templates(tests, entry_point: str) -> tuple[list[Template], str | None]:
    """The tests' templates, and when there are none the reason of the first test's refusal."""
    found, reason = [], None
    for test in tests:
        try:
            found.append(template_of(test, entry_point))
        except NoTemplate as e:
            reason = reason or e.reason
    return found, (None if found else reason or UNSUPPORTED_ASSERT)


def template_of(test: str, entry_point: str) -> Template:
    try:
        expression = parse_assert(test)
    except AssertParseError as e:
        raise NoTemplate(UNSUPPORTED_ASSERT, str(e)) from None
    calls = [node for node in ast.walk(expression) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == entry_point]
    if len(calls) != 1:
        raise NoTemplate(UNSUPPORTED_ASSERT, f"{len(calls)} calls of {entry_point} in {test[:80]!r}")
    call = calls[0]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise NoTemplate(UNSUPPORTED_ASSERT, f"unpacked arguments in {test[:80]!r}")
    args = tuple(_argument(a) for a in call.args)
    keywords = tuple((k.arg, _argument(k.value)) for k in call.keywords)
    if not any(kind == "value" for kind, _ in (*args, *(v for _, v in keywords))):
        raise NoTemplate(NO_LITERAL_ARGUMENTS, f"no literal argument in {test[:80]!r}")
    form, got, expected = _split(expression, call)
    if expected is not None:
        expected_text = ast.unparse(expected)
    else:  # a truth test holds when its `not`s are even
        node, negations = expression, 0
        while isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            node, negations = node.operand, negations + 1
        expected_text = str(negations % 2 == 0)
    shape = copy.deepcopy(expression)
    # The same walk order in the copy finds the same nodes: swap them for placeholders.
    nodes = list(ast.walk(expression))
    copied = list(ast.walk(shape))
    call_copy = copied[nodes.index(call)]
    got_copy = copied[nodes.index(got)]
    expected_copy = copied[nodes.index(expected)] if expected is not None else None
    got_text = _unparse_replacing(got_copy, {id(call_copy): _CALL})
    test_text = "assert " + _unparse_replacing(shape, {id(call_copy): _CALL, id(expected_copy): _EXPECTED})
    lengths = tuple(len(value) if kind == "value" and isinstance(value, (str, list, tuple, dict, set))
                    else len(node.elts) if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else None
                    for (kind, value), node in zip(args, call.args))
    return Template(form, test_text, got_text, entry_point, args, keywords, expected_text, lengths)


def _split(expression: ast.expr, call: ast.Call) -> tuple[str, ast.expr, ast.expr | None]:
    """(form, the got side, the expected side)."""
    def holds(node):
        return any(n is call for n in ast.walk(node))

    if isinstance(expression, ast.Compare) and len(expression.ops) == 1 and isinstance(expression.ops[0], ast.Eq):
        left, right = expression.left, expression.comparators[0]
        if holds(left) != holds(right):
            return ("equal", left, right) if holds(left) else ("equal", right, left)
    elif isinstance(expression, ast.Call) and ast.unparse(expression.func) == "math.isclose" \
            and len(expression.args) == 2 and holds(expression.args[0]) and not holds(expression.args[1]):
        return "isclose", expression.args[0], expression.args[1]
    elif not isinstance(expression, (ast.Compare, ast.BoolOp)):
        while isinstance(expression, ast.UnaryOp) and isinstance(expression.op, ast.Not):
            expression = expression.operand
        if holds(expression) and not isinstance(expression, (ast.Compare, ast.BoolOp, ast.UnaryOp)):
            return "truth", expression, None
    raise NoTemplate(UNSUPPORTED_ASSERT, f"not ==, math.isclose or a truth test: {ast.unparse(expression)[:80]!r}")


def _unparse_replacing(node: ast.AST, replacements: dict[int, str]) -> str:
    class Replace(ast.NodeTransformer):
        def visit(self, current):
            if id(current) in replacements:
                return ast.Name(id=replacements[id(current)], ctx=ast.Load())
            return super().visit(current)

    return ast.unparse(Replace().visit(node))


def _argument(node: ast.expr):
    """("value", v) for a literal or constant arithmetic whose value has a literal form, else
    ("source", its text): kept as written in every hidden test."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        value = _constant_arithmetic(node)
    if value is not _NOT_CONSTANT and literal_text(value, MAX_ARGUMENT_CHARS) is not None:
        return "value", value
    return "source", ast.unparse(node)


_NOT_CONSTANT = object()


def _constant_arithmetic(node: ast.expr):
    """MBPP's own argument text such as ``1.0/3``, ``14*14``, ``[0]*5``: +, -, *, / , //, % over
    constants and displays, factors at most _LARGEST_FACTOR (no power: ``10**10**10``)."""
    nodes = list(ast.walk(ast.Expression(node)))
    if not all(isinstance(n, _CONSTANT_NODES) for n in nodes) or any(
            isinstance(n, ast.Constant) and type(n.value) is int and abs(n.value) > _LARGEST_FACTOR for n in nodes):
        return _NOT_CONSTANT
    try:
        return eval(compile(ast.Expression(node), "<argument>", "eval"), {"__builtins__": {}})
    except Exception:
        return _NOT_CONSTANT


def _argument_text(argument) -> str:
    kind, value = argument
    return value if kind == "source" else literal_text(value, MAX_ARGUMENT_CHARS)


_LITERAL_TYPES = (type(None), bool, int, float, complex, str, bytes, list, tuple, dict, set)


def literal_text(value, limit: int = MAX_EXPECTED_CHARS) -> str | None:
    """The value's literal (``repr``, set items sorted) when it reads back as an equal value of the
    same types (``ast.literal_eval``, which the parent's evaluator covers) and is at most ``limit``
    characters; else None (non-finite floats, ints beyond the int/str limit, frozensets,
    decimals, objects)."""
    if not _plain(value, 0):
        return None
    try:
        text = _render(value)
    except ValueError:  # an int beyond the int/str conversion limit
        return None
    if len(text) > limit:
        return None
    try:
        back = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return text if back == value and _same_types(back, value) else None


def _render(value) -> str:
    """``repr``, with set items in sorted order: a set of strings iterates in an order that changes
    with the process's string hashes, and the same input must read the same in every build."""
    kind = type(value)
    if kind is set:
        return "{" + ", ".join(sorted(map(_render, value))) + "}" if value else "set()"
    if kind is list:
        return "[" + ", ".join(map(_render, value)) + "]"
    if kind is tuple:
        return "(" + ", ".join(map(_render, value)) + ("," if len(value) == 1 else "") + ")"
    if kind is dict:
        return "{" + ", ".join(f"{_render(k)}: {_render(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _plain(value, depth: int) -> bool:
    kind = type(value)
    if depth > 20 or kind not in _LITERAL_TYPES:
        return False
    if kind is float:
        return math.isfinite(value)
    if kind is complex:
        return math.isfinite(value.real) and math.isfinite(value.imag)
    if kind in (list, tuple, set):
        return all(_plain(item, depth + 1) for item in value)
    if kind is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return True


def _same_types(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same_types(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return all(_same_types(a[k], b[k]) for k in a)
    return True
