"""Split a test assert into what the trusted parent evaluates and what a sandbox child must compute.

A test such as ``assert sorted(f([3, 1])) == [1, 3]`` must never be decided by the candidate's
process: the candidate could make ``==`` always hold, exit before the assert, or read the expected
value. So the parent parses the assert with :mod:`ast` and evaluates everything it can itself with a
small evaluator over plain data (``rlcode.sandbox.plain_eval``: constants, displays, arithmetic,
comparisons, boolean logic, a whitelist of pure builtins and ``math`` functions, and pure methods
of exact builtin types). Every
maximal subexpression it cannot evaluate (``f([3, 1])`` above) becomes a :class:`Probe`: an
expression a child evaluates and returns as plain data (see ``rlcode.sandbox.plain_data``). The
parent substitutes the returned values and evaluates the assert; the expected side (``[1, 3]``)
never leaves the parent.

Probes that name only builtins and stdlib modules (MBPP's ``sys.getsizeof((...))`` expected sides)
are marked ``reference``: they run in a process that never ran candidate code, so no expected value
enters a process running candidate code. On the expected side this holds even when the program
rebinds ``sys`` or a builtin (see :func:`plan_assert`).

Truth tests. ``assert f(x)`` and ``assert not f(x)`` have no expected side: the test *is* the
truthiness of a candidate value, which for non-builtin types is the candidate's own ``__bool__``.
Such probes are sent as ``(not not (f(x)))`` and must come back as an exact ``bool``. When a whole
assert is a single probe (the weaker path: the child computes the verdict of that assert, checked to
be exactly ``True``), :attr:`AssertPlan.is_fallback` is set so callers can count them; on MBPP this
happens only for bare truth tests (``assert f(x)``), which carry no expected value to protect.

Stdlib only: imported by the parent's light paths (``rlcode-eval``, rewards).
"""

from __future__ import annotations

import ast
import builtins
import collections
import functools
import re
import sys
import warnings
from dataclasses import dataclass, field

from rlcode.sandbox.plain_eval import (MATH_CONSTANTS, MISSING, SAFE_FUNCTIONS, SAFE_MATH,
                                      SAFE_METHODS, EvalFailure, Outcome, evaluate_plan)

__all__ = ["MISSING", "AssertParseError", "AssertPlan", "EvalFailure", "Outcome", "Probe",
           "bound_names", "bound_names_among", "called_function_name", "called_function_names", "evaluate_plan",
           "overridable_names", "parse_assert", "plan_assert"]

# Nodes whose value is not data (a function, an iterator): a parent call cannot take them as
# arguments, so the whole enclosing expression goes to the child instead.
_NOT_DATA = (ast.Lambda, ast.GeneratorExp, ast.Starred)
_STDLIB = frozenset(sys.stdlib_module_names)
_BUILTIN_NAMES = frozenset(dir(builtins))
# True, False, None and __debug__ are keywords or constants: no program can bind them (the tests of
# 59 MBPP tasks spell True or False, which would otherwise make every program that does be parsed).
_OVERRIDABLE = (_BUILTIN_NAMES | _STDLIB) - {"True", "False", "None", "__debug__"}
# The most program text the parent parses (docs/sandbox.md: the limits table). ast.parse costs the
# parent ~400 bytes of memory per character (an 8 MB program took 4.1 GB); for non-ASCII text the
# parser also NFKC-normalises each identifier, which is quadratic in a run of combining marks
# (80,000 of them: 13 s). At these sizes a parse costs at most ~8 MB and a few tens of milliseconds;
# a model's answer to an MBPP task is ~0.2-4 KB.
MAX_PARSED_ASCII = 16 * 1024
MAX_PARSED_OTHER = 2 * 1024
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class AssertParseError(ValueError):
    """The test string is not a single ``assert`` statement."""


@dataclass(frozen=True)
class Probe:
    source: str       # expression text the child evaluates
    reference: bool   # True: evaluated without candidate code (names only builtins / stdlib modules)
    imports: tuple[str, ...] = ()  # stdlib modules a reference probe needs imported


@dataclass
class AssertPlan:
    test: str
    expression: ast.expr
    probes: list[Probe] = field(default_factory=list)
    probe_of_node: dict[int, int] = field(default_factory=dict)  # id(ast node) -> probe index

    @property
    def is_fallback(self) -> bool:
        """The child computes this whole assert (no parent-side split was possible)."""
        return id(self.expression) in self.probe_of_node


def parse_assert(test: str) -> ast.expr:
    try:
        module = ast.parse(test.strip())
    except SyntaxError as e:
        raise AssertParseError(f"test is not valid Python ({e.msg}): {test[:80]!r}") from None
    if len(module.body) != 1 or not isinstance(module.body[0], ast.Assert):
        raise AssertParseError(f"test is not a single assert statement: {test[:80]!r}")
    return module.body[0].test


def bound_names(code: str) -> frozenset[str]:
    """Names a program binds at module level (defs, classes, assignments, imports under other
    names), looking into if/try/with/for blocks but not into function or class bodies.

    ``import sys`` binds the real module under its own name, so it does not count. Unparsable code
    binds nothing (it fails anyway).
    """
    try:
        with warnings.catch_warnings():  # invalid escapes in candidate code are not our concern
            warnings.simplefilter("ignore")
            tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # MemoryError: the parser's own
        # limit on nesting (``x = ------...1``), which the child's compiler meets as well
        return frozenset()
    names: set[str] = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                own_module = isinstance(node, ast.Import) and bound == alias.name.split(".")[0]
                if not (own_module and bound in _STDLIB):
                    names.add(bound)
            continue
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt) or isinstance(child, ast.excepthandler):
                pending.append(child)
            elif isinstance(child, ast.expr):  # targets, walrus, comprehension variables
                names.update(n.id for n in ast.walk(child)
                             if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)))
        if isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return frozenset(names)


def called_function_names(test: str) -> list[str]:
    """Names of the functions a test calls, outermost first (``set(f(x)) == ...`` -> set, f)."""
    try:
        expression, _ = _parse_cached(test)
    except AssertParseError:
        return []
    return [node.func.id for node in _walk_skipping_constants(expression)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]


def _walk_skipping_constants(node: ast.AST):
    """``ast.walk``'s nodes in its (breadth-first) order, minus constants, which are most of the
    nodes of an MBPP assert and can be neither calls nor hold any."""
    pending = collections.deque([node])
    while pending:
        current = pending.popleft()
        for child in ast.iter_child_nodes(current):
            if type(child) is not ast.Constant:
                pending.append(child)
        yield current


def called_function_name(test: str, defined: frozenset[str] = frozenset()) -> str | None:
    """The task's entry point: the first called name the solution defines (``defined``), else the
    first called name that is not a builtin (MBPP task 126 defines its own ``sum``)."""
    names = called_function_names(test)
    for name in names:
        if name in defined:
            return name
    return next((name for name in names if name not in _BUILTIN_NAMES), None)


def plan_assert(test: str, candidate_names: frozenset[str] = frozenset()) -> AssertPlan:
    """Split one assert into parent-evaluated structure and probes.

    ``candidate_names``: names the candidate program and the setup bind (:func:`bound_names`). They
    matter only for builtin names on the *got* side (MBPP task 126's solution defines its own
    ``sum``, which its tests call): there the candidate's function is probed instead of the parent
    calling the builtin. The expected side (the comparators of a comparison, the arguments after
    the first of a parent-evaluated call such as ``math.isclose``) always means the real builtins
    and stdlib modules, so a program that rebinds ``sys`` or ``len`` cannot pull an expected value
    into its own process; ``math`` is never the candidate's.

    Plans are cached and shared (they are read-only once built).
    """
    expression, names_in_test = _parse_cached(test)
    return _plan_cached(test, frozenset(candidate_names) & names_in_test)


@functools.lru_cache(maxsize=8192)
def _parse_cached(test: str) -> tuple[ast.expr, frozenset[str]]:
    """The assert's expression and the builtin / stdlib names it may use: the only names through
    which a program's bindings change a plan (see :func:`plan_assert`).

    The name set is a superset: it only ever meets ``candidate_names & ...`` and is then tested
    against real Name ids, so extra identifiers (attributes, words in strings) change nothing. For
    ASCII text a regex over the source finds every Name id (NFKC is the identity there) far cheaper
    than walking the tree; other text may spell a name in a form NFKC changes, so it gets the walk."""
    expression = parse_assert(test)
    names = _IDENTIFIER.findall(test) if test.isascii() else _names_in(expression)
    return expression, _OVERRIDABLE.intersection(names)


def overridable_names(tests) -> frozenset[str]:
    """Builtin and stdlib names the tests use (unparsable tests add none): a program's bindings
    matter to :func:`plan_assert` only through these."""
    names: set[str] = set()
    for test in tests:
        try:
            names |= _parse_cached(test)[1]
        except AssertParseError:
            pass
    return frozenset(names)


def bound_names_among(code: str, names: frozenset[str]) -> frozenset[str]:
    """``bound_names(code) & names``, or a superset of it, in time and memory linear in the code.

    An ASCII program that never spells a name cannot bind it, so it is not parsed. A program longer
    than the parent parses (``MAX_PARSED_ASCII``, or ``MAX_PARSED_OTHER`` for other text, which may
    spell a name in a form NFKC changes) is not parsed either: every name it spells counts as bound
    (every name, for other text). A superset is safe: it only sends more of an assert's *got* side
    to the child (see :func:`plan_assert`), never an expected value, and an honest program's values
    are the same either way."""
    if not names:
        return frozenset()
    if code.isascii():
        spelled = frozenset(name for name in names if name in code)
        return bound_names(code) & spelled if spelled and len(code) <= MAX_PARSED_ASCII else spelled
    return bound_names(code) & names if len(code) <= MAX_PARSED_OTHER else names


@functools.lru_cache(maxsize=8192)
def _plan_cached(test: str, overrides: frozenset[str]) -> AssertPlan:
    expression, _ = _parse_cached(test)
    plan = AssertPlan(test=test, expression=expression)
    _Splitter(plan, overrides, test.strip()).visit(expression, truth=True, expected=False)
    return plan


def _names_in(node: ast.AST) -> set[str]:
    """Every Name id under ``node`` (what ``ast.walk`` finds), skipping constants cheaply: expected
    sides are mostly long literal lists."""
    names, pending = set(), [node]
    while pending:
        current = pending.pop()
        kind = type(current)
        if kind is ast.Name:
            names.add(current.id)
        elif kind is not ast.Constant:
            for field_name in current._fields:
                value = getattr(current, field_name, None)
                if type(value) is list:
                    pending.extend(item for item in value if isinstance(item, ast.AST)
                                   and type(item) is not ast.Constant)
                elif isinstance(value, ast.AST):
                    pending.append(value)
    return names


def _probe_source(node: ast.expr, text: str) -> str:
    """The probe's expression text: the test's own characters for a call on one line (its span is
    the whole call, so the text parses back to the same tree on its own), else ``ast.unparse``.
    Slicing is ~20x cheaper than unparsing; offsets are UTF-8 bytes, so non-ASCII text goes
    through ``ast.get_source_segment``."""
    if type(node) is ast.Call and node.lineno == node.end_lineno:
        if node.lineno == 1 and text.isascii():
            return text[node.col_offset:node.end_col_offset]
        segment = ast.get_source_segment(text, node)
        if segment:
            return segment
    return ast.unparse(node)


class _Splitter:
    def __init__(self, plan: AssertPlan, overrides: frozenset[str], text: str):
        self.plan, self.overrides, self.text = plan, overrides, text  # text: what parse_assert parsed

    def visit(self, node: ast.expr, truth: bool, expected: bool) -> None:
        children = _value_children(node)
        if not self._parent_can_evaluate(node, children, expected):
            self._add_probe(node, truth, expected)
            return
        # Truth context carries through `not` and through and/or that are themselves tested.
        child_truth = (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)) or (
            truth and isinstance(node, ast.BoolOp))
        if isinstance(node, ast.Compare):
            first_expected = 1  # left is what the program produced; comparators are expected
        elif isinstance(node, ast.Call) and node.args:
            first_expected = children.index(node.args[0]) + 1
        else:
            first_expected = len(children)
        for position, child in enumerate(children):
            if type(child) is not ast.Constant:  # always parent-side, nothing below it
                self.visit(child, truth=child_truth, expected=expected or position >= first_expected)

    def _parent_can_evaluate(self, node: ast.expr, children: list[ast.expr], expected: bool) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp,
                             ast.BoolOp, ast.Compare, ast.IfExp, ast.Subscript, ast.Slice)):
            return not any(isinstance(c, _NOT_DATA) for c in children) \
                and not (isinstance(node, ast.Dict) and None in node.keys)
        if isinstance(node, ast.Attribute):
            return _is_math(node.value) and node.attr in MATH_CONSTANTS
        if isinstance(node, ast.Call):
            if any(isinstance(c, _NOT_DATA) for c in children) \
                    or any(k.arg is None for k in node.keywords):
                return False
            func = node.func
            if isinstance(func, ast.Name):
                return func.id in SAFE_FUNCTIONS and (expected or func.id not in self.overrides)
            if isinstance(func, ast.Attribute):
                if _is_math(func.value):
                    return func.attr in SAFE_MATH
                return any(func.attr in methods for methods in SAFE_METHODS.values())
        return False

    def _add_probe(self, node: ast.expr, truth: bool, expected: bool) -> None:
        source = _probe_source(node, self.text)
        if truth:  # `not not` cannot be rebound and always yields an exact bool
            source = f"(not not ({source}))"
        names = _names_in(node)
        reference = bool(names) and all(n in _BUILTIN_NAMES or n in _STDLIB for n in names) and (
            expected or not names & self.overrides)
        imports = tuple(sorted(n for n in names if n in _STDLIB and n not in _BUILTIN_NAMES))
        self.plan.probe_of_node[id(node)] = len(self.plan.probes)
        self.plan.probes.append(Probe(source=source, reference=reference,
                                      imports=imports if reference else ()))


def _is_math(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "math"


def _value_children(node: ast.expr) -> list[ast.expr]:
    """The expression operands of ``node``, in ``ast.iter_child_nodes`` order (probe order and
    which operands are expected depend on it). Read-only: may be the node's own list."""
    kind = type(node)
    if kind is ast.Constant:
        return []
    if kind is ast.List or kind is ast.Tuple or kind is ast.Set:
        return node.elts
    if kind is ast.Compare:
        return [node.left, *node.comparators]
    if kind is ast.BinOp:
        return [node.left, node.right]
    if isinstance(node, ast.Call):
        children = list(node.args) + [k.value for k in node.keywords]
        if isinstance(node.func, ast.Attribute) and not (
                isinstance(node.func.value, ast.Name) and node.func.value.id == "math"):
            children.insert(0, node.func.value)  # the object a method is called on
        return children
    if isinstance(node, ast.Attribute):
        return []
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if k is not None] + list(node.values)
    return [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
