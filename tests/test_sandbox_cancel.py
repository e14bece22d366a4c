"""``future.cancel()`` of a sandbox execution works while it waits and while it runs (the execution
is killed), and a cancelled execution leaves ``count()`` and ``list()`` at once."""

import time

import pytest

from rlcode.sandbox import SandboxPool

SLEEP = "import time\ntime.sleep(30)"


def _wait_until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


@pytest.mark.slow
def test_cancel_of_a_running_and_of_a_queued_execution():
    with SandboxPool(workers=1, timeout=60) as pool:
        running = pool.submit(SLEEP, tags={"t": "a"})
        queued = [pool.submit(SLEEP, tags={"t": "a"}) for _ in range(3)]
        assert _wait_until(lambda: pool.count() == {"running": 1, "pending": 3})
        assert queued[-1].cancel() and queued[-1].cancelled()  # still in the pool's queue
        assert pool.count() == {"running": 1, "pending": 2}
        assert queued[0].cancel()  # queued at the worker behind the running one
        assert pool.count() == {"running": 1, "pending": 1}
        started = time.monotonic()
        assert running.cancel() and running.cancelled()  # killed, not left to sleep 30 s
        assert pool.count() == {"running": 0, "pending": 1}
        assert _wait_until(lambda: pool.count() == {"running": 1, "pending": 0})  # the last one starts
        assert time.monotonic() - started < 10
        assert queued[1].cancel() and pool.count() == {"running": 0, "pending": 0} and pool.list() == []
        assert pool.submit("print(7)").result(timeout=30).stdout.strip() == "7"  # the worker still serves


@pytest.mark.slow
def test_cancel_after_the_result_is_false():
    with SandboxPool(workers=1, timeout=10) as pool:
        future = pool.submit("print(1)")
        future.result(timeout=30)
        assert not future.cancel() and not future.cancelled()
