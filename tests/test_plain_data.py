"""The plain-data encoding: exact builtin types only, and robust to a program rebinding builtins."""

import builtins
import collections
import decimal
import fractions
from unittest import mock

import pytest

from rlcode.sandbox.plain_data import DecodeError, Opaque, dumps, loads


@pytest.mark.parametrize("value", [
    None, True, 0, -7, 2**90, 1.5, "é\x00", b"\xff\x00", bytearray(b"ab"), 3 + 4j,
    [1, (2, 3)], {1: "a", (1, 2): [3]}, {1, 2}, frozenset({"x"}), (), [],
    decimal.Decimal("1.10"), fractions.Fraction(1, 3),
])
def test_round_trip_gives_equal_builtin_values(value):
    back = loads(dumps(value))
    assert back == value and type(back) is type(value)


def test_stdlib_dict_types_arrive_as_plain_dicts():
    assert loads(dumps(collections.Counter("aab"))) == {"a": 2, "b": 1}
    assert type(loads(dumps(collections.OrderedDict(a=1)))) is dict


class AlwaysEqual(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize("value", [AlwaysEqual(3), mock.ANY, [mock.ANY], iter([1]), object()])
def test_non_plain_values_equal_nothing(value):
    back = loads(dumps(value))
    flat = back[0] if isinstance(back, list) else back
    assert isinstance(flat, Opaque) and flat != flat and flat != 3


def test_encoding_survives_rebound_builtins():
    # A candidate may rebind builtins before the harness encodes its probe values.
    saved = builtins.isinstance, builtins.type
    builtins.isinstance = builtins.type = None
    try:
        text = dumps([1, {2: 3.5}, "x"])
    finally:
        builtins.isinstance, builtins.type = saved
    assert loads(text) == [1, {2: 3.5}, "x"]


@pytest.mark.parametrize("line", ['{"t": "list"}', '{"t": "nope", "v": 1}', '{"t": "set", "v": [[1]]}',
                                  '{"t": "int", "v": "1e3"}', "not json", '{"t": "dict", "v": [[1]]}'])
def test_malformed_plain_data_is_rejected(line):
    with pytest.raises(DecodeError):
        loads(line)
