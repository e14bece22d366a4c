"""Plain data: the only form in which values leave the sandbox.

A candidate program's return values are untrusted objects: an instance whose ``__eq__`` always
holds, a subclass of ``int`` or ``list``, ``mock.ANY``. So the sandbox never hands objects back. It
encodes a value into JSON-able plain data, accepting only *exact* builtin types (``type(x) is int``,
never ``isinstance``) and reading containers through the builtin types' own methods, then the
trusted parent decodes it into fresh builtin objects and compares them itself.

This module runs inside the sandbox (the child encodes its probe values with it; stdlib only, no
rlcode imports); the parent's decoder is ``rlcode.sandbox.plain_data``. Every type and function
the encoder needs is bound at import time, before any candidate code runs,
so a program that rebinds ``builtins.type`` or ``collections.OrderedDict`` cannot change what the
encoder accepts.

Encoding (JSON):
    None, bool, int, float (nan/inf allowed), str  ->  themselves
    {"t": "list" | "tuple" | "set" | "frozenset", "v": [items]}
    {"t": "dict", "v": [[key, value], ...]}          (also OrderedDict, defaultdict, Counter)
    {"t": "bytes" | "bytearray", "v": "<hex>"}
    {"t": "complex", "v": [real, imag]}
    {"t": "decimal" | "fraction", "v": "<str>"}
    {"t": "opaque", "v": "<type name>"}             anything else: equal to nothing
    {"t": "raised", "v": "<ExcType: message>"}      the expression raised (never equal to anything)
"""

from __future__ import annotations

import collections as _collections
import decimal as _decimal
import fractions as _fractions
import json.encoder as _json_encoder

# Bound once, before candidate code can rebind anything.
_type = type
_len = len
_str = str
_int_to_str = int.__repr__
_list_iter = list.__iter__
_tuple_iter = tuple.__iter__
_set_iter = set.__iter__
_frozenset_iter = frozenset.__iter__
_dict_items = dict.items
_bytes_hex = bytes.hex
_bytearray_hex = bytearray.hex
_complex_real = complex.real.__get__
_complex_imag = complex.imag.__get__
_decimal_str = _decimal.Decimal.__str__
_fraction_str = _fractions.Fraction.__str__
# The C encoder itself, not json.dumps: dumps() runs Python code that looks up builtins such as
# isinstance at call time, which a candidate program may have rebound.
_c_encode = _json_encoder.c_make_encoder(None, None, _json_encoder.encode_basestring_ascii, None,
                                         ":", ",", False, False, True)
_join = "".join
_type_name = type.__dict__["__qualname__"].__get__

_DICT_TYPES = (dict, _collections.OrderedDict, _collections.defaultdict, _collections.Counter)
_SEQUENCES = {list: ("list", _list_iter), tuple: ("tuple", _tuple_iter),
              set: ("set", _set_iter), frozenset: ("frozenset", _frozenset_iter)}

MAX_ITEMS = 1_000_000  # total items across one value; beyond it the value is "opaque"
MAX_INT_DIGITS = 4000  # below CPython's int/str conversion limit


class _TooLarge(Exception):
    pass


def encode(value: object) -> object:
    """Return ``value`` as JSON-able plain data (see the module docstring)."""
    budget = [MAX_ITEMS]
    try:
        return _encode(value, budget, 0)
    except _TooLarge:
        return {"t": "opaque", "v": "value too large"}
    except RecursionError:
        return {"t": "opaque", "v": "value nested too deeply"}


def _encode(value, budget, depth):
    budget[0] -= 1
    if budget[0] < 0 or depth > 200:
        raise _TooLarge
    kind = _type(value)
    if value is None or kind is bool or kind is _str:
        return value
    if kind is int:
        text = _int_to_str(value) if _len_digits_ok(value) else None
        if text is None:
            raise _TooLarge
        return {"t": "int", "v": text} if _len(text) > 15 else value
    if kind is float:
        return value
    if kind in _SEQUENCES:
        name, iterate = _SEQUENCES[kind]
        return {"t": name, "v": [_encode(item, budget, depth + 1) for item in iterate(value)]}
    if kind in _DICT_TYPES:
        pairs = [[_encode(k, budget, depth + 1), _encode(v, budget, depth + 1)] for k, v in _dict_items(value)]
        return {"t": "dict", "v": pairs}
    if kind is bytes:
        return {"t": "bytes", "v": _bytes_hex(value)}
    if kind is bytearray:
        return {"t": "bytearray", "v": _bytearray_hex(value)}
    if kind is complex:
        return {"t": "complex", "v": [_complex_real(value), _complex_imag(value)]}
    if kind is _decimal.Decimal:
        return {"t": "decimal", "v": _decimal_str(value)}
    if kind is _fractions.Fraction:
        return {"t": "fraction", "v": _fraction_str(value)}
    return {"t": "opaque", "v": _type_name(kind)}


def _len_digits_ok(value: int) -> bool:
    return value.bit_length() < MAX_INT_DIGITS * 3  # ~ 3.3 bits per decimal digit


def dumps(value: object) -> str:
    """Encode and serialise to one line of JSON."""
    return _join(_c_encode(encode(value), 0))
