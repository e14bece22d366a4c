"""The trusted parent's work on candidate-controlled values is bounded.

Probe values are decoded and asserts evaluated on the pool's one completion thread: a costly decode
there stalls every verdict in flight. Each test below feeds a value that used to cost seconds to
minutes (hash-colliding sets, exponent-notation fractions, huge decimals) and checks that it is now
refused with a reason, and that honest samples running alongside are judged as without it.
"""

from __future__ import annotations

import decimal
import json
import subprocess
import sys
import time

import pytest

from rlcode.sandbox import SandboxPool, plain_data
from rlcode.sandbox.asserts import plan_assert
from rlcode.sandbox.plain_data import MAX_HASH_REPEATS, LimitExceeded, dumps, loads
from rlcode.sandbox.plain_eval import evaluate_plan
from rlcode.sandbox.verdict import check_against_tests
from rlcode.sandbox.worker_process import WorkerProcess

MERSENNE_61 = 2**61 - 1  # every multiple of it hashes to 0: a set of them is quadratic to build


def _colliding_set_line(count: int) -> str:
    items = ",".join(str(i * MERSENNE_61) for i in range(count))
    return '{"t":"set","v":[%s]}' % items


def test_hash_flooding_sets_and_dicts_are_refused():
    """Guards decoding of sets/dict keys whose hashes collide (quadratic insertion on the GIL)."""
    with pytest.raises(LimitExceeded, match="collide"):
        loads(_colliding_set_line(MAX_HASH_REPEATS * 4))
    keys = ",".join(f"[{i * MERSENNE_61},0]" for i in range(MAX_HASH_REPEATS * 4))
    with pytest.raises(LimitExceeded, match="collide"):
        loads('{"t":"dict","v":[%s]}' % keys)
    assert loads(json.dumps({"t": "set", "v": list(range(5000))})) == set(range(5000))  # spread: fine


@pytest.mark.parametrize("line, limit", [
    ('{"t":"fraction","v":"1e100"}', "n/d"),              # Fraction() would compute 10**exponent
    ('{"t":"fraction","v":"%s/3"}' % ("7" * 5000), "n/d"),
    ('{"t":"decimal","v":"1e1000000"}', "exponent"),      # int() of it: 27 s; 4e6: minutes
    ('{"t":"decimal","v":"%s"}' % ("9" * 5000), "digits"),
    ('{"t":"int","v":"%s"}' % ("9" * 5000), "digits"),
    ('[' * 150 + ']' * 150, "nested"),
])
def test_costly_numbers_and_nesting_are_refused_naming_the_limit(line, limit):
    """Guards the digit, exponent and nesting limits of the parent's decoder."""
    if line.startswith("["):
        line = json.dumps(json.loads(line), separators=(",", ":"))
        line = line.replace("[", '{"t":"list","v":[').replace("]", "]}")
    with pytest.raises(LimitExceeded, match=limit):
        loads(line)


def _decoder_calls(line: str) -> int:
    """Python-level calls made inside plain_data while decoding ``line``."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        calls += event == "call" and frame.f_code.co_filename == plain_data.__file__

    sys.setprofile(profile)
    try:
        loads(line)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.slow
def test_decoding_makes_one_python_call_per_container_not_per_item():
    """Guards the decoder's cost on the completion thread: scalars are checked by C-level passes, so
    999,000 ints, floats or strings cost as many Python calls as 1,000; containers cost one each."""
    for item in (7, 2.5, "abcdefgh", None, True, -2**40):  # (ints past 2**52 travel tagged)
        small, large = dumps([item] * 1_000), dumps([item] * 999_000)
        assert _decoder_calls(large) == _decoder_calls(small) <= 10, item
    pairs, fifties = (_decoder_calls(dumps([[i] * k for i in range(5_000)])) for k in (2, 50))
    assert pairs == fifties <= 6 * 5_000 + 10  # decode, its checks and _items: per container
    mapping = {n: _decoder_calls(dumps({i: str(i) for i in range(n)})) for n in (1_000, 100_000)}
    assert mapping[100_000] == mapping[1_000]


def test_decimal_arithmetic_cannot_grow_a_value_the_parent_then_converts():
    """Guards the result check: int() of a decimal made huge by the test's own arithmetic."""
    plan = plan_assert("assert int(f(1) ** 300) == 5")
    outcome = evaluate_plan(plan, [decimal.Decimal("1e3000")])
    assert not outcome.passed and "too large" in outcome.detail


def test_building_a_set_from_a_colliding_list_in_an_assert_is_refused():
    """Guards parent-side set()/dict() calls over candidate lists (the decode check alone misses them)."""
    plan = plan_assert("assert set(f(1)) == {1, 2}")
    outcome = evaluate_plan(plan, [[i * MERSENNE_61 for i in range(MAX_HASH_REPEATS * 4)]])
    assert not outcome.passed and "collide" in outcome.detail
    pairs = [(1, i) for i in range(MAX_HASH_REPEATS * 4)]  # same first item, distinct tuples: fine
    assert not evaluate_plan(plan, [pairs]).passed and "collide" not in evaluate_plan(plan, [pairs]).detail


def test_a_deadline_is_never_declared_passed_before_reading():
    """Guards WorkerProcess: a slot thread starved past its deadline (GIL held by a costly decode)
    must still take an answer already waiting in the pipe, not kill the worker."""
    worker = WorkerProcess.__new__(WorkerProcess)
    worker._buffer = bytearray()
    worker._process = subprocess.Popen(["echo", '{"op":"result","id":"x"}'], stdout=subprocess.PIPE,
                                       start_new_session=True)
    worker._process.wait()
    try:
        assert worker._read_message(time.monotonic() - 5.0) == {"op": "result", "id": "x"}
    finally:
        worker._process.stdout.close()


TESTS = ["assert f(3) == 6", "assert f(0) == 0"]
HONEST = "def f(x):\n    return 2 * x\n"
WRONG = "def f(x):\n    return x\n"
# Still running when an attacker's value is decoded, and its answer (64 KiB of output, more than
# a pipe holds) takes the parent more than one read: the case a stalled parent used to kill as
# "did not answer in time".
BUSY_HONEST = "import time\ntime.sleep(0.5)\nprint('x' * 70000)\n" + HONEST


def _forging(value_json: str) -> str:
    """A candidate that writes its own probe line (fd 3 is the values pipe) and exits."""
    return f"import os\nos.write(3, b'{{\"i\":0,\"v\":' + {value_json!r}.encode() + b'}}\\n')\nos._exit(0)\n"


ATTACKERS = {
    "colliding set": _forging(_colliding_set_line(60_000)),
    "fraction exponent": _forging('{"t":"fraction","v":"1e30000000"}'),
    "huge decimal": _forging('{"t":"decimal","v":"4e6"}').replace("4e6", "4e1000000"),
}


def test_attackers_alongside_honest_samples_change_no_verdict():
    """Guards the whole path: costly values from attackers are refused with a reason, and honest and
    wrong samples in flight at the same time get exactly the verdicts they get alone (before the
    bounds, a stalled completion thread flipped them to internal_error)."""
    with SandboxPool(workers=2, timeout=2.0) as pool:
        alone = [check_against_tests(pool, code, TESTS).result(timeout=60) for code in (HONEST, WRONG, BUSY_HONEST)]
        futures = []
        for name, attack in ATTACKERS.items():
            futures.append((name, check_against_tests(pool, attack, TESTS)))
            futures += [("busy", check_against_tests(pool, BUSY_HONEST, TESTS)),
                        ("honest", check_against_tests(pool, HONEST, TESTS)),
                        ("wrong", check_against_tests(pool, WRONG, TESTS))]
        verdicts = [(name, future.result(timeout=600)) for name, future in futures]
    expected = {"honest": alone[0], "wrong": alone[1], "busy": alone[2]}
    assert alone[0].all_passed and not alone[1].all_passed and alone[2].all_passed
    for name, verdict in verdicts:
        if name in expected:
            assert (verdict.passed, verdict.reason) == (expected[name].passed, expected[name].reason), name
        else:
            assert not verdict.passed[0] and "limits" in verdict.details[0], (name, verdict.details)
