"""The pool's public API: futures, statuses, probes, tags, list/count/stop, wait, recovery."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from rlcode.sandbox import ExecResult, Program, SandboxPool, Status, wait
from rlcode.sandbox import plain_data


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, timeout=5.0) as p:
        yield p


def _values(result: ExecResult) -> dict[int, object]:
    out = {}
    for line in result.probe_lines:
        record = json.loads(line)
        out[record["i"]] = plain_data.decode(record["v"])
    return out


def test_ok_program_with_stdout_and_probes(pool):
    program = Program(code="def add(a, b):\n    return a + b\nprint('hello')",
                      setup="EXPECTED_HELPER = 3", probes=("add(1, 2)", "add([1], [2])", "add(1, 'x')",
                                                          "EXPECTED_HELPER"))
    result = pool.submit(program).result()
    assert result.status is Status.OK and result.returncode == 0 and result.error_type is None
    assert result.stdout == "hello\n" and result.stderr == ""
    values = _values(result)
    assert values[0] == 3 and values[1] == [1, 2] and values[3] == 3
    assert isinstance(values[2], plain_data.Opaque) and values[2].raised
    assert "TypeError" in values[2].type_name


def test_probe_values_are_plain_data_not_objects(pool):
    code = "class Liar:\n    def __eq__(self, other): return True\ndef f(): return Liar()"
    result = pool.submit(Program(code=code, probes=("f()",))).result()
    value = _values(result)[0]
    assert isinstance(value, plain_data.Opaque) and value != 0 and value != "anything"


def test_statuses(pool):
    cases = {
        "x = (": (Status.SYNTAX_ERROR, "SyntaxError"),
        "if True:\nprint(1)": (Status.SYNTAX_ERROR, "IndentationError"),
        "raise KeyError('k')": (Status.ERROR, "KeyError"),
        "import sys; sys.exit(3)": (Status.ERROR, "SystemExit"),
        "import sys; sys.exit(0)": (Status.OK, None),
        "x = bytearray(4 << 30)": (Status.MEMORY, "MemoryError"),
        "import ctypes; ctypes.string_at(0)": (Status.KILLED, None),
    }
    futures = {code: pool.submit(code) for code in cases}
    for code, (status, error_type) in cases.items():
        result = futures[code].result()
        assert (result.status, result.error_type) == (status, error_type), (code, result)
    crashed = futures["import ctypes; ctypes.string_at(0)"].result()
    assert crashed.returncode == -signal.SIGSEGV
    assert pool.submit("import sys; sys.exit(3)").result().returncode == 3


def test_traceback_shows_candidate_lines(pool):
    result = pool.submit("def f():\n    return 1 / 0\nf()").result()
    assert "return 1 / 0" in result.stderr and "ZeroDivisionError" in result.stderr
    assert "child_harness" not in result.stderr


def test_exit_before_probes_gives_fewer_lines(pool):
    result = pool.submit(Program(code="import os\nos._exit(0)", probes=("1", "2"))).result()
    assert result.status is Status.OK and result.probe_lines == []
    result = pool.submit(Program(code="def f(): raise SystemExit(0)", probes=("1", "f()", "3"))).result()
    assert [json.loads(line)["i"] for line in result.probe_lines] == [0]


def test_setup_error_is_an_error(pool):
    result = pool.submit(Program(code="x = 1", setup="assert x == 2", probes=("x",))).result()
    assert result.status is Status.ERROR and result.error_type == "AssertionError"
    assert result.probe_lines == []


def test_timeout_kills(pool):
    result = pool.submit("import time\ntime.sleep(60)", timeout=0.5).result()
    assert result.status is Status.TIMEOUT and result.returncode == -signal.SIGKILL
    result = pool.submit("while True: pass", timeout=0.5).result()
    assert result.status is Status.TIMEOUT


def test_map_keeps_order(pool):
    programs = [f"import time\ntime.sleep({0.05 * (5 - i)})\nprint({i})" for i in range(6)]
    results = pool.map(programs)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]


def test_wait_for_first_n(pool):
    futures = [pool.submit("import time\ntime.sleep(30)", tags={"case": "wait"})]
    futures += [pool.submit("print(1)") for _ in range(2)]
    done, not_done = wait(futures, num_returns=1, timeout=20)
    assert len(done) == 1 and len(not_done) == 2 and done[0].result().status is Status.OK
    done, not_done = wait(futures[:1], num_returns=1, timeout=0.2)
    assert done == [] and not_done == futures[:1]
    assert pool.stop({"case": "wait"}) == 1
    done, not_done = wait(futures, timeout=20)
    assert len(done) == 3 and not not_done
    assert futures[0].result().status is Status.CANCELLED
    with pytest.raises(ValueError):
        wait(futures, num_returns=4)


def test_tags_list_count_stop(pool):
    sleeper = "import time\ntime.sleep(30)"
    step1 = [pool.submit(sleeper, tags={"run": "r", "step": "1"}) for _ in range(3)]
    step2 = [pool.submit(sleeper, tags={"run": "r", "step": "2"}) for _ in range(2)]
    deadline = time.monotonic() + 10
    while pool.count({"run": "r"})["running"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.count({"run": "r"}) == {"running": 2, "pending": 3}
    listed = pool.list({"step": "2"})
    assert len(listed) == 2 and all(info.tags["step"] == "2" for info in listed)
    assert {info.state for info in pool.list({"run": "r"})} == {"running", "pending"}
    assert pool.stop({"step": "1"}) == 3
    assert [f.result(timeout=10).status for f in step1] == [Status.CANCELLED] * 3
    assert pool.stop({"run": "r"}) == 2
    assert [f.result(timeout=10).status for f in step2] == [Status.CANCELLED] * 2
    assert pool.count({"run": "r"}) == {"running": 0, "pending": 0}
    assert pool.submit("print('after stop')").result().stdout == "after stop\n"


def test_stop_reaches_an_execution_queued_at_a_worker():
    with SandboxPool(workers=1, timeout=20) as pool:
        # A slot queues a second execution at its worker only if one waits in the pool as it sends
        # the first (once it waits for a result, later ones wait in the pool). So: submitted
        # together, while the slot spawns a worker (the adopted isolation-probe worker is closed).
        pool._slots[0].worker.close()
        first = pool.submit("import time\ntime.sleep(30)", tags={"n": "1"})
        queued = pool.submit("import time\ntime.sleep(30)", tags={"n": "2"})
        third = pool.submit("print('third')")
        deadline = time.monotonic() + 10
        while pool.count()["running"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # the slot hands `queued` to its worker behind `first`
        assert pool.count() == {"running": 1, "pending": 2}
        assert len(pool._slots[0].inflight) == 2  # really queued at the worker, not in the pool
        assert pool.stop({"n": "2"}) == 1
        assert queued.result(timeout=5).status is Status.CANCELLED
        assert pool.stop({"n": "1"}) == 1
        assert first.result(timeout=10).status is Status.CANCELLED
        assert third.result(timeout=10).stdout == "third\n"  # the worker skipped the stopped one


def test_pool_tags_are_merged(pool):
    result = pool.submit("pass", tags={"k": "v"}).result()
    assert result.tags == {"k": "v"}
    with SandboxPool(workers=1, tags={"run": "abc"}) as tagged:
        assert tagged.submit("pass", tags={"step": "1"}).result().tags == {"run": "abc", "step": "1"}


def test_reference_worker_is_separate(pool):
    blockers = [pool.submit("import time\ntime.sleep(30)", tags={"case": "ref"}) for _ in range(2)]
    reference = pool.submit(Program(code="def f(): return 42", probes=("f()",)), reference=True)
    assert _values(reference.result(timeout=20)) == {0: 42}
    assert not any(f.done() for f in blockers)  # it did not wait for a candidate worker
    pool.stop({"case": "ref"})


def test_worker_crash_gives_internal_error_and_respawns():
    with SandboxPool(workers=1, timeout=10) as pool:
        future = pool.submit("import time\ntime.sleep(30)")
        deadline = time.monotonic() + 10
        while (pool.count()["running"] < 1 or pool._slots[0].worker is None) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # let the request reach the worker
        worker = pool._slots[0].worker
        os.killpg(worker.pid, signal.SIGKILL)
        result = future.result(timeout=20)
        assert result.status is Status.INTERNAL_ERROR and result.message
        assert pool.submit("print('again')").result().stdout == "again\n"


def test_bad_input_is_a_clear_error(pool):
    with pytest.raises(TypeError, match="Program or a str"):
        pool.submit(b"print(1)")
    with pytest.raises(ValueError, match="timeout"):
        pool.submit("pass", timeout=0)
    with pytest.raises(ValueError, match="isolation"):
        SandboxPool(isolation="docker")


def test_context_exit_leaves_no_process():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with SandboxPool(workers=2) as pool:
        pool.submit("import time\ntime.sleep(30)")
        assert pool.submit("print(1)").result().status is Status.OK
        started = {p.pid for p in psutil.Process().children(recursive=True)} - before
        assert started
    time.sleep(0.2)
    alive = [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert alive == []


def test_isolation_report(pool):
    report = pool.isolation
    assert report.level in ("bwrap", "bwrap-userns", "process")
    text = report.describe()
    assert report.level in text and "seccomp" in text


def test_a_result_out_of_order_fails_the_worker_at_once():
    # A desynchronised protocol must surface as a worker failure (respawn + internal_error), not
    # hold the future until its deadline.
    import time as _time

    from rlcode.sandbox.worker_process import WorkerFailure, WorkerProcess

    worker = WorkerProcess.__new__(WorkerProcess)
    messages = iter([{"op": "log"}, {"op": "result", "id": "b"}])
    worker._read_message = lambda deadline: next(messages)
    with pytest.raises(WorkerFailure, match="'b'"):
        worker.receive("a", deadline=_time.monotonic() + 5)
