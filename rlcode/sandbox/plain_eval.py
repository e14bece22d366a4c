"""Evaluate an assert in the trusted parent, over plain data only.

The assert's structure (comparisons, arithmetic, displays, calls to a whitelist of pure builtins,
``math`` functions and methods of exact builtin types) is evaluated here; the values of its probes
come from sandbox children as plain data (``rlcode.sandbox.plain_data``). Any value that is not
plain data (an ``Opaque``) compares to nothing and makes the assert fail, and arithmetic that
would let a candidate value blow up the parent's memory is refused. Planning lives in
``rlcode.sandbox.asserts``.

The parent's work is bounded, because it runs on the pool's one completion thread (a slow assert
would stall every verdict in flight): operations whose cost grows with a value are checked before
they run (sizes of products and powers, hash collisions of sets and dicts built from candidate data)
and their results after (a decimal's exponent, a fraction's size: ``int(Decimal("1e999999"))`` costs
half a minute), and one check's asserts share a time budget, EVAL_BUDGET_S.
"""

from __future__ import annotations

import ast
import builtins
import decimal
import fractions
import math
import operator
import reprlib
import time
from dataclasses import dataclass

from rlcode.sandbox.plain_data import MAX_DECIMAL_EXPONENT, LimitExceeded, Opaque, check_hash_spread

# Pure builtins the parent may call on plain data (arguments are plain values, never callables).
SAFE_FUNCTIONS = {name: getattr(builtins, name) for name in (
    "set", "frozenset", "sorted", "list", "tuple", "dict", "abs", "round", "len", "min", "max", "sum",
    "str", "int", "float", "bool", "complex", "any", "all", "reversed", "enumerate", "zip", "divmod",
    "pow", "repr", "ord", "chr", "hex", "oct", "bin", "bytes", "bytearray")}
SAFE_MATH = {name: getattr(math, name) for name in (
    "isclose", "sqrt", "floor", "ceil", "fabs", "log", "log2", "log10", "exp", "pow", "sin", "cos",
    "tan", "asin", "acos", "atan", "atan2", "hypot", "gcd", "isfinite", "isinf", "isnan", "trunc",
    "degrees", "radians", "prod", "fsum", "copysign", "fmod", "isqrt", "comb", "perm", "factorial")}
MATH_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf, "nan": math.nan}
SAFE_METHODS = {
    str: {"lower", "upper", "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "count",
          "index", "find", "join", "replace", "isdigit", "isalpha", "title", "capitalize"},
    list: {"count", "index"}, tuple: {"count", "index"},
    dict: {"keys", "values", "items", "get"}, set: {"issubset", "issuperset", "union", "intersection"},
    frozenset: {"issubset", "issuperset", "union", "intersection"},
}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor, ast.BitAnd: operator.and_}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert,
          ast.Not: operator.not_}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_,
            ast.IsNot: operator.is_not, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b}
_MAX_SIZE = 10_000_000  # largest sequence / int bit length the parent will build
_MAX_FRACTION_BITS = 100_000  # a fraction's numerator and denominator (their gcd is quadratic)
EVAL_BUDGET_S = 2.0  # all asserts of one check, in the parent (MBPP's take microseconds)
# Builtins and methods that hash every item of their arguments into a new set or dict.
_HASHING = {builtins.set, builtins.frozenset, builtins.dict, set.union, set.intersection,
            set.issubset, set.issuperset, frozenset.union, frozenset.intersection,
            frozenset.issubset, frozenset.issuperset}


class EvalFailure(Exception):
    """The parent could not evaluate the assert (a probe raised, was missing or was not plain data)."""


@dataclass(frozen=True)
class Outcome:
    passed: bool
    detail: str  # "" when passed; else e.g. "got [1, 2], expected [2, 1]" or "error: ValueError: ..."


def evaluate_plan(plan, probe_values: list, deadline: float | None = None) -> Outcome:
    """Decide the assert given the probes' decoded values (``MISSING`` for a probe that never came).
    ``deadline`` (time.monotonic()): when the check's budget ends (default: EVAL_BUDGET_S from now)."""
    evaluator = _Evaluator(plan, probe_values, deadline)
    try:
        if plan.is_fallback:
            value = evaluator.value(plan.expression)
            if value is True:  # the weaker path: the child's truth test must be exactly True
                return Outcome(True, "")
            return Outcome(False, f"got {_short(value)}")
        value = evaluator.value(plan.expression)
        if _truth(value):
            return Outcome(True, "")
        return Outcome(False, _describe_failure(plan.expression, evaluator))
    except EvalFailure as e:
        return Outcome(False, str(e))


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


class _Evaluator:
    def __init__(self, plan, probe_values: list, deadline: float | None = None):
        self.plan, self.probe_values, self.cache = plan, probe_values, {}
        self.deadline = time.monotonic() + EVAL_BUDGET_S if deadline is None else deadline

    def value(self, node: ast.expr):
        if type(node) is ast.Constant:  # never a probe (the planner keeps constants parent-side)
            return node.value
        if time.monotonic() > self.deadline:
            raise EvalFailure(f"error: the parent's evaluation took over {EVAL_BUDGET_S:g}s")
        key = id(node)
        if key not in self.cache:
            self.cache[key] = self._compute(node)
        return self.cache[key]

    def _compute(self, node: ast.expr):
        index = self.plan.probe_of_node.get(id(node))
        if index is not None:
            return self._probe(index)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [self.value(e) for e in node.elts]
            kind = {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)]
            return self._apply(kind, items)
        if isinstance(node, ast.Dict):
            return self._apply(lambda pairs: dict(pairs),
                               [(self.value(k), self.value(v)) for k, v in zip(node.keys, node.values)])
        if isinstance(node, ast.UnaryOp):
            return self._apply(_UNARY[type(node.op)], self.value(node.operand))
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left), self.value(node.right)
            _check_size(node.op, left, right)
            return self._apply(_BINARY[type(node.op)], left, right)
        if isinstance(node, ast.BoolOp):
            for operand in node.values:
                result = self.value(operand)
                if _truth(result) == isinstance(node.op, ast.Or):
                    return result
            return result
        if isinstance(node, ast.Compare):
            left = self.value(node.left)
            for op, comparator in zip(node.ops, node.comparators):
                right = self.value(comparator)
                if not _truth(self._apply(_COMPARE[type(op)], left, right)):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.value(node.body) if _truth(self.value(node.test)) else self.value(node.orelse)
        if isinstance(node, ast.Subscript):
            return self._apply(operator.getitem, self.value(node.value), self.value(node.slice))
        if isinstance(node, ast.Slice):
            parts = [None if p is None else self.value(p) for p in (node.lower, node.upper, node.step)]
            return slice(*parts)
        if isinstance(node, ast.Attribute):  # only math constants reach here
            return MATH_CONSTANTS[node.attr]
        if isinstance(node, ast.Call):
            return self._call(node)
        raise EvalFailure(f"error: cannot evaluate {type(node).__name__}")  # planner never allows it

    def _call(self, node: ast.Call):
        args = [self.value(a) for a in node.args]
        kwargs = {k.arg: self.value(k.value) for k in node.keywords}
        func = node.func
        if isinstance(func, ast.Name):
            function = SAFE_FUNCTIONS[func.id]
        elif isinstance(func.value, ast.Name) and func.value.id == "math" and func.attr in SAFE_MATH:
            function = SAFE_MATH[func.attr]
            if func.attr in ("factorial", "comb", "perm") and any(
                    type(a) is int and a > 100_000 for a in args):
                raise EvalFailure("error: argument too large for the parent to evaluate")
        else:
            target = self.value(func.value)
            kind = type(target)
            if func.attr not in SAFE_METHODS.get(kind, ()):
                raise EvalFailure(f"error: {kind.__name__} has no pure method {func.attr!r}")
            function, args = getattr(kind, func.attr), [target, *args]
        if function in (builtins.pow, math.pow) and len(args) >= 2:
            _check_size(ast.Pow(), args[0], args[1])
        if function in (builtins.bytes, builtins.bytearray) and args and type(args[0]) is int \
                and args[0] > _MAX_SIZE:
            raise EvalFailure("error: result too large for the parent to evaluate")
        if function is str.replace and len(args) >= 3 and isinstance(args[2], str) \
                and len(args[0]) * max(1, len(args[2])) > _MAX_SIZE:
            raise EvalFailure("error: result too large for the parent to evaluate")
        return self._apply(function, *args, **kwargs)

    def _apply(self, function, *args, **kwargs):
        for value in (*args, *kwargs.values()):
            _require_plain(value)
        try:
            if function in _HASHING:
                for value in args:
                    _check_hashing(value, pairs=function is builtins.dict)
            result = function(*args, **kwargs)
        except EvalFailure:
            raise
        except LimitExceeded as e:
            raise EvalFailure(f"error: value beyond the parent's limits ({e})") from None
        except Exception as e:  # the test's own expression raised, as it would have in Python
            raise EvalFailure(f"error: {type(e).__name__}: {_text(e)[:80]}") from None
        _check_result(result)
        return result

    def _probe(self, index: int):
        value = self.probe_values[index] if index < len(self.probe_values) else MISSING
        if value is MISSING:
            raise EvalFailure("exited before tests ran")
        if isinstance(value, Opaque) and value.raised:
            raise EvalFailure(f"error: {value.type_name[:70]}")
        return value


def _require_plain(value) -> None:
    """Refuse values that carry an Opaque anywhere: they have no value to compare."""
    stack, budget = [value], 1_000_000
    while stack and budget > 0:
        item = stack.pop()
        budget -= 1
        if isinstance(item, Opaque):
            raise EvalFailure(f"got {item!r}" if item is value else f"got {_short(value)}")
        kind = type(item)
        if kind in (list, tuple, set, frozenset):
            stack.extend(item)
        elif kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())


def _check_hashing(value, pairs: bool) -> None:
    """Before hashing a value's items into a set or dict (``pairs``: dict(), which hashes the first
    of each pair): refuse hash flooding (see plain_data)."""
    if type(value) is dict:
        check_hash_spread(value.keys(), "dict")
    elif type(value) in (list, tuple, set, frozenset):
        keys = [item[0] for item in value if type(item) in (list, tuple) and item] if pairs else value
        check_hash_spread(keys, "dict" if pairs else "set")


def _check_result(result) -> None:
    """Results whose later use costs more than their making (decimal arithmetic is cheap at any
    exponent; ``int()`` of it is not): refused while still cheap to refuse."""
    kind = type(result)
    if kind is decimal.Decimal and result.is_finite() and abs(result.adjusted()) > 2 * MAX_DECIMAL_EXPONENT:
        raise EvalFailure("error: decimal exponent too large for the parent to evaluate")
    if kind is fractions.Fraction and max(result.numerator.bit_length(),
                                          result.denominator.bit_length()) > _MAX_FRACTION_BITS:
        raise EvalFailure("error: fraction too large for the parent to evaluate")


def _check_size(op: ast.operator, left, right) -> None:
    """Refuse arithmetic that would make the parent build a huge object from candidate values."""
    if isinstance(op, ast.Mult) and type(left) is int and type(right) is int \
            and left.bit_length() + right.bit_length() > _MAX_SIZE:
        raise EvalFailure("error: result too large for the parent to evaluate")
    if isinstance(op, ast.Mult):
        for seq, count in ((left, right), (right, left)):
            if type(count) is int and isinstance(seq, (str, bytes, list, tuple)) \
                    and len(seq) * count > _MAX_SIZE:
                raise EvalFailure("error: result too large for the parent to evaluate")
    if isinstance(op, (ast.Pow, ast.LShift)) and type(left) is int and type(right) is int:
        bits = left.bit_length() * right if isinstance(op, ast.Pow) else right
        if abs(left) > 1 and bits > _MAX_SIZE:
            raise EvalFailure("error: result too large for the parent to evaluate")


def _truth(value) -> bool:
    _require_plain(value)
    return bool(value)


def _describe_failure(expression: ast.expr, evaluator: _Evaluator) -> str:
    if isinstance(expression, ast.Compare) and len(expression.ops) == 1:
        got, expected = evaluator.value(expression.left), evaluator.value(expression.comparators[0])
        return f"got {_short(got)}, expected {_short(expected)}"
    if isinstance(expression, ast.Call) and len(expression.args) >= 2:  # math.isclose(got, expected)
        got, expected = evaluator.value(expression.args[0]), evaluator.value(expression.args[1])
        return f"got {_short(got)}, expected {_short(expected)}"
    return f"got {_short(evaluator.value(expression))}"


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 80
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = _SHORT.maxfrozenset = _SHORT.maxdict = 20


def _short(value, limit: int = 80) -> str:
    """A repr bounded in work too (reprlib stops at 20 items a level): failure reasons are built
    from candidate values."""
    text = _text(value, _SHORT.repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _text(value, render=str) -> str:
    try:
        return render(value)
    except Exception:  # an int beyond the int/str conversion limit, say
        return f"<{type(value).__name__} that cannot be shown>"
