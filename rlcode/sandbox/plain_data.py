"""Decoding plain data in the trusted parent: the values a sandbox child sent, rebuilt as fresh builtins.

The encoding and its rules live with the encoder, which runs inside the sandbox
(``rlcode.sandbox.inside.plain_encode``); ``encode``/``dumps`` are re-exported here for the parent's
tests and tools. Everything this module reads was written by candidate code.
"""

from __future__ import annotations

import decimal as _decimal
import fractions as _fractions
import json as _json

from .inside.plain_encode import dumps, encode

__all__ = ["DecodeError", "Opaque", "decode", "dumps", "encode", "loads"]


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


_SCALARS = (bool, int, float, str)  # JSON scalars that decode to themselves


def decode(data: object) -> object:
    """Rebuild fresh builtin objects from plain data. Raises DecodeError on anything malformed."""
    if data is None or type(data) in _SCALARS:
        return data
    if type(data) is not dict or set(data) != {"t", "v"}:
        raise DecodeError(f"not plain data: {data!r:.80}")
    tag, v = data["t"], data["v"]
    if tag in ("list", "tuple", "set", "frozenset"):
        _expect(v, list)
        # scalars inline: most items are, and a call per item is most of the decoding time
        items = [x if x is None or type(x) in _SCALARS else decode(x) for x in v]
        if tag == "list":
            return items
        if tag == "tuple":
            return tuple(items)
        try:
            return set(items) if tag == "set" else frozenset(items)
        except TypeError as e:
            raise DecodeError(f"unhashable set item: {e}") from None
    if tag == "dict":
        _expect(v, list)
        out = {}
        for pair in v:
            _expect(pair, list)
            if len(pair) != 2:
                raise DecodeError("dict item is not a pair")
            try:
                out[decode(pair[0])] = decode(pair[1])
            except TypeError as e:
                raise DecodeError(f"unhashable dict key: {e}") from None
        return out
    if tag == "int":
        _expect(v, str)
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
        return complex(v[0], v[1])
    if tag in ("decimal", "fraction"):
        _expect(v, str)
        try:
            return _decimal.Decimal(v) if tag == "decimal" else _fractions.Fraction(v)
        except (ValueError, ArithmeticError):
            raise DecodeError(f"bad {tag}") from None
    if tag in ("opaque", "raised"):
        _expect(v, str)
        return Opaque(v, raised=tag == "raised")
    raise DecodeError(f"unknown tag {tag!r:.40}")


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
