"""Decoding plain data in the trusted parent: the values a sandbox child sent, rebuilt as fresh builtins.

The encoding and its rules live with the encoder, which runs inside the sandbox
(``rlcode.sandbox.inside.plain_encode``); ``encode``/``dumps`` are re-exported here for the parent's
tests and tools. Everything this module reads was written by candidate code, and it is decoded on
the pool's one completion thread: a slow decode would stall every verdict in flight. So decoding is
bounded in work, whatever the line holds: nesting depth, item count, digits of ints, decimals and
fractions, the exponent of a decimal (``int()`` of ``Decimal("1e1000000")`` computes a million
digits), and hash collisions in sets and dicts (ints chosen to share one hash make building a set
quadratic). A value beyond a limit decodes to an ``Opaque`` that fails its test, naming the limit.
"""

from __future__ import annotations

import collections as _collections
import decimal as _decimal
import fractions as _fractions
import json as _json
import re as _re

from .inside.plain_encode import dumps, encode

__all__ = ["DecodeError", "LimitExceeded", "Opaque", "check_hash_spread", "decode", "dumps", "encode",
           "loads"]

# What the parent decodes, at most (docs/sandbox.md: the limits table). With the 8 MiB cap on an
# execution's values, they bound what one execution costs the completion thread: decoding takes
# 1-2.3x ``json.loads`` of the same line (3.5x for sets, which hash every item), measured by
# ``benchmarks/plain_data_decode.py``. Per MiB that is ~1 ms for one string, 20-90 ms for lists of
# scalars, and 0.25-0.4 s for the costliest shape, many small containers (each a JSON object, which
# costs json.loads itself most of that), measured on a shared 2-core machine under load: a full
# 8 MiB line of them holds the thread for 2-3 s there. Python calls are one per container, never
# one per scalar item (a test counts them).
MAX_DEPTH = 100  # nesting of containers
MAX_ITEMS = 1_000_000  # items across one value (an 8 MiB line holds ~4M single-digit ints)
MAX_DIGITS = 4000  # digits of an int, a decimal's coefficient, a fraction's terms
MAX_DECIMAL_EXPONENT = 4000  # |adjusted exponent| of a decimal: int() of it stays <= ~4000 digits
MAX_HASH_REPEATS = 64  # items of one set or dict sharing one hash value
_FRACTION = _re.compile(r"-?[0-9]{1,%d}(/[0-9]{1,%d})?" % (MAX_DIGITS, MAX_DIGITS))


OPAQUE_NAME_CHARS = 200  # an exception's message or a type's name, as the candidate's child wrote it


class Opaque:
    """A value that left the sandbox as something other than plain data. Equal to nothing."""

    __slots__ = ("type_name", "raised")

    def __init__(self, type_name: str, raised: bool = False):
        self.type_name, self.raised = type_name, raised

    def __eq__(self, other):  # never equal, not even to itself: it carries no value
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<raised {self.type_name}>" if self.raised else f"<{self.type_name} object>"


class DecodeError(ValueError):
    pass


class LimitExceeded(DecodeError):
    """Well-formed plain data beyond what the parent will decode (see the limits above)."""


def check_hash_spread(items, what: str = "set") -> None:
    """Refuse a collection whose items pile up on one hash value (hash flooding: ints that are
    multiples of 2**61 - 1 all hash alike, and building a set of n of them costs n**2 compares).
    Strings are safe (randomised hashes) but are counted too: the check is O(n) either way."""
    counts = _collections.Counter(map(hash, items))
    if counts and max(counts.values()) > MAX_HASH_REPEATS:
        raise LimitExceeded(f"{what} items collide on one hash more than {MAX_HASH_REPEATS} times")


_SCALARS = (bool, int, float, str)  # JSON scalars that decode to themselves


def decode(data: object) -> object:
    """Rebuild fresh builtin objects from plain data. Raises DecodeError on anything malformed,
    LimitExceeded (a DecodeError) on a value beyond the parent's limits."""
    return _Decoder().decode(data, 0)


_SCALAR_KINDS = frozenset({type(None), bool, int, float, str})
_ITEM_KINDS = _SCALAR_KINDS | {dict}
_SMALL_INT = 1 << 64  # ints below it in magnitude need no digit check


class _Decoder:
    """One value's decoding. The per-item work is done by C-level passes (``set(map(type, items))``,
    ``min``/``max``, ``zip``) and only tagged items (dicts) cost a Python call each: most items are
    scalars, which are kept as the decoder made them."""

    def __init__(self):
        self.items = 0

    def decode(self, data: object, depth: int) -> object:
        if data is None or type(data) in _SCALARS:
            if type(data) is int:
                _check_int(data)
            return data
        if depth > MAX_DEPTH:
            raise LimitExceeded(f"value nested deeper than {MAX_DEPTH}")
        if type(data) is not dict or len(data) != 2 or "t" not in data or "v" not in data:
            raise DecodeError(f"not plain data: a {type(data).__name__}")
        tag, v = data["t"], data["v"]
        if tag in ("list", "tuple", "set", "frozenset"):
            _expect(v, list)
            self._count(len(v))
            items = self._items(v, depth)
            if tag == "list":
                return items
            if tag == "tuple":
                return tuple(items)
            return self._hashed(set if tag == "set" else frozenset, items, tag)
        if tag == "dict":
            _expect(v, list)
            self._count(2 * len(v))
            if not v:
                return {}
            if set(map(type, v)) != {list} or set(map(len, v)) != {2}:
                raise DecodeError("dict item is not a pair")
            keys, values = (self._items(list(column), depth) for column in zip(*v))
            try:
                check_hash_spread(keys, "dict")
            except TypeError as e:
                raise DecodeError(f"unhashable dict key: {e}") from None
            return dict(zip(keys, values))
        if tag == "int":
            _expect(v, str)
            if len(v.lstrip("-")) > MAX_DIGITS:
                raise LimitExceeded(f"int with more than {MAX_DIGITS} digits")
            try:
                return int(v)
            except ValueError:
                raise DecodeError("bad int") from None
        if tag in ("bytes", "bytearray"):
            _expect(v, str)
            try:
                raw = bytes.fromhex(v)
            except ValueError:
                raise DecodeError("bad hex") from None
            return raw if tag == "bytes" else bytearray(raw)
        if tag == "complex":
            _expect(v, list)
            if len(v) != 2 or not all(type(x) in (int, float) for x in v):
                raise DecodeError("bad complex")
            for part in v:
                if type(part) is int:
                    _check_int(part)
            return complex(v[0], v[1])
        if tag == "decimal":
            _expect(v, str)
            return _decimal_of(v)
        if tag == "fraction":
            _expect(v, str)
            if not _FRACTION.fullmatch(v):  # never exponent notation: Fraction("1e9999999") is 10**9999999
                raise LimitExceeded(f"fraction not of the form n/d with at most {MAX_DIGITS} digits each")
            try:
                return _fractions.Fraction(v)
            except (ValueError, ArithmeticError):
                raise DecodeError("bad fraction") from None
        if tag in ("opaque", "raised"):
            _expect(v, str)
            return Opaque(v[:OPAQUE_NAME_CHARS], raised=tag == "raised")  # it reaches failure reasons
        raise DecodeError(f"unknown tag {tag!r:.40}")

    def _items(self, v: list, depth: int) -> list:
        """A container's items decoded: scalars as they are (the list itself when all are: the JSON
        decoder made it, nothing else holds it), tagged values (dicts) one level deeper."""
        kinds = set(map(type, v))
        if not kinds <= _ITEM_KINDS:
            raise DecodeError(f"not plain data: a {min(k.__name__ for k in kinds - _ITEM_KINDS)} item")
        if int in kinds:
            _check_ints(v, only_ints=kinds == {int})
        if dict not in kinds:
            return v
        return [self.decode(x, depth + 1) if type(x) is dict else x for x in v]

    def _count(self, n: int) -> None:
        self.items += n
        if self.items > MAX_ITEMS:
            raise LimitExceeded(f"value with more than {MAX_ITEMS} items")

    @staticmethod
    def _hashed(kind, items, tag):
        try:
            check_hash_spread(items, tag)
            return kind(items)
        except TypeError as e:
            raise DecodeError(f"unhashable {tag} item: {e}") from None


def _check_ints(values: list, only_ints: bool) -> None:
    """The digit limit over a list's ints: one C-level min/max when they are all ints and small."""
    if only_ints and -_SMALL_INT < min(values) and max(values) < _SMALL_INT:
        return
    for value in values:
        if type(value) is int and not -_SMALL_INT < value < _SMALL_INT:
            _check_int(value)


def _check_int(value: int) -> None:
    if value.bit_length() > MAX_DIGITS * 3.33:
        raise LimitExceeded(f"int with more than {MAX_DIGITS} digits")


def _decimal_of(text: str):
    try:
        value = _decimal.Decimal(text)
    except (ValueError, ArithmeticError):
        raise DecodeError("bad decimal") from None
    if value.is_finite():
        if len(value.as_tuple().digits) > MAX_DIGITS:
            raise LimitExceeded(f"decimal with more than {MAX_DIGITS} digits")
        if abs(value.adjusted()) > MAX_DECIMAL_EXPONENT:
            raise LimitExceeded(f"decimal with an exponent beyond +-{MAX_DECIMAL_EXPONENT}")
    return value


def loads(line: str | bytes) -> object:
    """Parse one JSON line and decode it. Raises DecodeError on anything malformed."""
    try:
        data = _json.loads(line)
    except (ValueError, RecursionError) as e:
        raise DecodeError(f"bad JSON: {e}") from None
    try:
        return decode(data)
    except RecursionError:
        raise DecodeError("nested too deeply") from None


def _expect(value: object, kind: type) -> None:
    if type(value) is not kind:
        raise DecodeError(f"expected {kind.__name__}, got {type(value).__name__}")
