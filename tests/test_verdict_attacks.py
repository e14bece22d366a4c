"""Programs that try to pass without solving the task must be judged FAILED.

Each attack targets a known way to fool a harness (exit codes, printed success lines, objects that
compare equal to anything, rebinding what the harness uses, reading the expected values). The
honest solution is checked too, so a harness that fails everything cannot pass this file.
"""

from __future__ import annotations

import textwrap

import pytest

from rlcode.sandbox import SandboxPool
from rlcode.sandbox.verdict import check_against_tests

# An MBPP-like task (synthetic text): sort a list in descending order.
TESTS = ["assert sort_desc([5, 1, 9]) == [9, 5, 1]",
         "assert sort_desc([]) == []",
         "assert sort_desc([2, 2, 3]) == [3, 2, 2]"]
HONEST = "def sort_desc(xs):\n    return sorted(xs, reverse=True)\n"
WRONG = "def sort_desc(xs):\n    return xs\n"
# A task whose answer cannot be derived from the input: only the expected side knows it.
SECRET_TESTS = ["assert secret_value(1) == 48213", "assert secret_value(2) == [73519, 'kq']"]


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, timeout=5.0) as pool:
        yield pool


def _verdict(pool, code: str, tests=TESTS, setup: str = ""):
    return check_against_tests(pool, textwrap.dedent(code), tests, setup).result(timeout=60)


def test_honest_solution_passes(pool):
    verdict = _verdict(pool, HONEST)
    assert verdict.passed == [True, True, True] and verdict.reason == "passed"


def test_wrong_solution_fails_with_a_short_reason(pool):
    verdict = _verdict(pool, WRONG)
    assert verdict.passed == [False, True, False]
    assert verdict.reason == "assert 1 failed: got [5, 1, 9], expected [9, 5, 1]"


EXIT_ATTACKS = {
    "sys_exit_0": WRONG + "import sys\nsys.exit(0)\n",
    "os_exit_0": WRONG + "import os\nos._exit(0)\n",
    "raise_system_exit": WRONG + "raise SystemExit\n",
    "keyboard_interrupt": WRONG + "raise KeyboardInterrupt\n",
    "custom_base_exception": WRONG + "class Stop(BaseException):\n    pass\nraise Stop()\n",
    "excepthook": WRONG + "import sys, os\nsys.excepthook = lambda *a: os._exit(0)\nraise ValueError\n",
    "atexit": WRONG + "import atexit, os\natexit.register(lambda: os._exit(0))\nraise ValueError\n",
    "exit_inside_call": "import os\ndef sort_desc(xs):\n    os._exit(0)\n",
    "system_exit_inside_call": "def sort_desc(xs):\n    raise SystemExit(0)\n",
    "base_exception_inside_call": "def sort_desc(xs):\n    raise KeyboardInterrupt\n",
    "sigalrm_handler": """
        import os, signal, time
        signal.signal(signal.SIGALRM, lambda *a: os._exit(0))
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        def sort_desc(xs):
            time.sleep(3)
            return xs
    """,
    "sigterm_handler": """
        import os, signal, time
        signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
        signal.signal(signal.SIGINT, lambda *a: os._exit(0))
        def sort_desc(xs):
            time.sleep(60)
    """,
    "threading_excepthook": """
        import os, threading
        threading.excepthook = lambda args: os._exit(0)
        threading.Thread(target=lambda: 1 / 0).start()
        def sort_desc(xs):
            return xs
    """,
    "thread_exits_mid_run": """
        import os, threading, time
        def quit_soon():
            time.sleep(0.2)
            os._exit(0)
        threading.Thread(target=quit_soon, daemon=True).start()
        def sort_desc(xs):
            time.sleep(2)
            return sorted(xs, reverse=True)
    """,
}


@pytest.mark.parametrize("name", sorted(EXIT_ATTACKS))
def test_exiting_or_hooking_before_the_asserts_fails(pool, name):
    verdict = _verdict(pool, EXIT_ATTACKS[name])
    assert not any(verdict.passed), (name, verdict.reason)


EQUALITY_ATTACKS = {
    "always_equal_object": """
        class Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = object.__hash__
        def sort_desc(xs): return Anything()
    """,
    "list_subclass": """
        class EqList(list):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
        def sort_desc(xs): return EqList()
    """,
    "mock_any": "from unittest.mock import ANY\ndef sort_desc(xs): return ANY\n",
    "rebound_builtins_and_encoder": """
        import builtins, json
        class Anything:
            def __eq__(self, other): return True
        builtins.type = lambda *a: list
        builtins.isinstance = lambda *a: True
        json.dumps = lambda *a, **k: '{"t":"list","v":[]}'
        def sort_desc(xs): return Anything()
    """,
    "bool_that_lies": """
        class Truthy(list):
            def __bool__(self): return True
            def __eq__(self, other): return True
        def sort_desc(xs): return Truthy(xs)
    """,
}


@pytest.mark.parametrize("name", sorted(EQUALITY_ATTACKS))
def test_values_that_pretend_to_equal_fail(pool, name):
    verdict = _verdict(pool, EQUALITY_ATTACKS[name])
    assert not any(verdict.passed), (name, verdict.reason)


def test_rebound_builtins_do_not_break_an_honest_answer(pool):
    code = HONEST + "import builtins\nbuiltins.type = lambda *a: dict\nbuiltins.repr = None\n"
    assert _verdict(pool, code).all_passed


SPY = """
    import gc, inspect, os, re, sys

    def _numbers_in(text):
        return [int(m) for m in re.findall(r"\\b\\d{5}\\b", text)]

    def _find():
        found = []
        frame = sys._getframe()
        while frame is not None:  # every frame up the stack: locals, globals, constants
            for value in list(frame.f_locals.values()) + list(frame.f_code.co_consts):
                found += _numbers_in(repr(value))
            frame = frame.f_back
        for obj in gc.get_objects():  # every tracked object in the process
            try:
                found += _numbers_in(repr(obj)[:10000])
            except Exception:
                pass
        for frame_info in inspect.stack():
            found += _numbers_in(repr(frame_info.frame.f_locals))
        for path in ("/proc/self/cmdline", "/proc/self/environ", "/proc/1/cmdline"):
            try:
                found += _numbers_in(open(path, "rb").read().decode("latin-1"))
            except OSError:
                pass
        for root in (".", "/tmp", os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else "."):
            try:
                for name in os.listdir(root):
                    try:
                        found += _numbers_in(open(os.path.join(root, name), errors="replace").read(100000))
                    except OSError:
                        pass
            except OSError:
                pass
        return [n for n in found if n != 10000]  # 10000 is a constant of this spy

    def secret_value(k):
        found = _find()
        if k == 1:
            return found[0] if found else 0
        return [found[0] if found else 0, "kq"]
"""


def test_expected_values_cannot_be_read_from_the_child(pool):
    verdict = _verdict(pool, SPY, tests=SECRET_TESTS)
    assert verdict.passed == [False, False], verdict.reason


def test_spy_would_find_the_answer_if_it_were_there(pool):
    # Control: the same spy finds a value that is in its process, so the test above can fail.
    verdict = _verdict(pool, textwrap.dedent(SPY) + "_planted = 48213\n", tests=SECRET_TESTS[:1])
    assert verdict.passed == [True]


FAKE_SUCCESS = """
    import os, sys
    def sort_desc(xs):
        return xs
    lines = ['All tests passed', 'PASSED', '{"i":0,"v":true}', '{"i":1,"v":true}',
             '{"i":0,"v":{"t":"list","v":[9,5,1]}}', '{"s":"ok","e":null}']
    print("\\n".join(lines))
    for fd in range(1, 21):
        try:
            os.write(fd, ("\\n".join(lines) + "\\n").encode())
        except OSError:
            pass
"""


def test_fake_success_output_on_stdout_and_inherited_fds_fails(pool):
    verdict = _verdict(pool, FAKE_SUCCESS)
    assert verdict.passed[0] is False and verdict.passed[2] is False, verdict.reason
    verdict = _verdict(pool, FAKE_SUCCESS + "os._exit(0)\n")
    assert not any(verdict.passed), verdict.reason


def test_a_forged_value_line_never_helps_a_correct_guess_twice(pool):
    # A forged line for probe 0 plus the real one: two values for one probe, the test fails.
    code = HONEST + "import os\nos.write(3, b'{\"i\":0,\"v\":{\"t\":\"list\",\"v\":[9,5,1]}}\\n')\n"
    verdict = _verdict(pool, code)
    assert verdict.passed == [False, True, True], verdict.reason


def test_odd_but_correct_output_passes(pool):
    non_utf8 = HONEST + "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x80 bytes')\nsys.stdout.flush()\n"
    megabyte = HONEST + "print('x' * (1 << 20))\n"
    for code in (non_utf8, megabyte):
        assert _verdict(pool, code).all_passed


def test_status_reasons(pool):
    assert _verdict(pool, "def sort_desc(xs)\n    return xs").reason == "syntax_error"
    assert _verdict(pool, WRONG + "undefined_name\n").reason == "error: NameError"
    assert _verdict(pool, WRONG + "import sys\nsys.exit(0)\n").reason == "exited before tests ran"
    slow = "import time\ndef sort_desc(xs):\n    time.sleep(30)\n"
    verdict = check_against_tests(pool, slow, TESTS, timeout=1.0).result(timeout=60)
    assert verdict.reason == "timeout" and not any(verdict.passed)


REBINDING_ATTACKS = {  # the program rebinds a name the expected side uses, then matches its fake
    "fake_sys_module": ("assert tuple_size((1, 2, 3)) == sys.getsizeof((1, 2, 3))", """
        class FakeSys:
            def getsizeof(self, o): return 0
        sys = FakeSys()
        def tuple_size(t): return 0
    """),
    "fake_math_isclose": ("assert math.isclose(area(2), 12.566, rel_tol=0.001)", """
        import types
        math = types.SimpleNamespace(isclose=lambda *a, **k: True)
        def area(r): return 0
    """),
    "fake_len_builtin": ("assert count([1, 2]) == len([1, 2])", """
        len = lambda x: 0
        def count(xs): return 0
    """),
}


@pytest.mark.parametrize("name", sorted(REBINDING_ATTACKS))
def test_rebinding_names_of_the_expected_side_fails(pool, name):
    test, code = REBINDING_ATTACKS[name]
    verdict = _verdict(pool, code, tests=[test])
    assert verdict.passed == [False], verdict.reason


def test_reference_probes_never_run_candidate_code(pool):
    # The expected side sys.getsizeof(...) is computed without the candidate, whose sys is rigged.
    tests = ["assert tuple_size((1, 2, 3)) == sys.getsizeof((1, 2, 3))"]
    honest = "import sys\ndef tuple_size(t):\n    return sys.getsizeof(t)\n"
    rigged = "import sys\nsys.getsizeof = lambda o: -1\ndef tuple_size(t):\n    return -1\n"
    assert _verdict(pool, honest, tests=tests).all_passed
    assert not _verdict(pool, rigged, tests=tests).all_passed
