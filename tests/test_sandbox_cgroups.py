"""Memory and process limits hold per execution, not per process or per uid.

RLIMIT_AS bounds each process alone (forked children or a memfd exceed it together) and
RLIMIT_NPROC counts every process of a uid on the machine (one sample's processes, all children
running as uid 65534, starved another worker's). Where a writable cgroup exists (root here) both
limits are per execution; without one, each worker slot's children run as a uid of their own.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from rlcode.sandbox import SandboxPool, Status, cgroups
from rlcode.sandbox.cgroups import WORKER_MEMORY_BYTES

CHUNK_MB = 200
FORKED_HOGS = textwrap.dedent(f"""
    import os, sys, time
    together = time.monotonic() + 4  # every surviving child holds its block at this instant
    for _ in range(3):  # 3 x {CHUNK_MB} MiB: each child is under RLIMIT_AS, together they are not
        if os.fork() == 0:
            block = b"\\x01" * ({CHUNK_MB} << 20)  # written, so really resident
            if time.monotonic() > together:
                os._exit(2)  # too late to overlap the others: not counted
            time.sleep(max(0.0, together - time.monotonic()))
            os._exit(0)
    survived = 0
    while True:
        try:
            _, status = os.wait()
        except ChildProcessError:
            break
        survived += os.waitstatus_to_exitcode(status) == 0
    print("survived", survived)
""")
MEMFD_HOG = textwrap.dedent("""
    import os
    files = []
    for _ in range(7):  # 7 x 60 MiB, each under RLIMIT_FSIZE, none mapped: no address space at all
        files.append(os.memfd_create("hog"))
        for _ in range(60):
            os.write(files[-1], b"\\x01" * (1 << 20))
    print("memfd filled")
""")


@pytest.fixture(scope="module", params=["bwrap", "process"])
def pool(request):
    with SandboxPool(workers=2, timeout=20.0, memory_mb=256, max_processes=32, isolation=request.param) as p:
        if not p.isolation.layers["cgroup_limits"]:
            pytest.skip("no writable cgroup here: rlimits only (see the isolation report)")
        yield p


def test_memory_of_all_processes_of_an_execution_stays_under_its_limit(pool):
    """Guards the memory cgroup: three forked children cannot hold 3 x 200 MiB under a 256 MiB
    limit (plus the idle worker's headroom in the same group) at the same time.

    It counts the children that still hold their block at one common instant, not the children
    that ever filled one: a first child done before the others start is the OOM killer's pick (the
    largest) once they grow, after it had filled its block, and a second child then fills one too
    (the limit held; counting fills failed this test in CI at the process level, and every time
    with the other children delayed by 0.4 s)."""
    result = pool.submit(FORKED_HOGS).result()
    limit_mb = 256 + (WORKER_MEMORY_BYTES >> 20)
    assert result.stdout.startswith("survived "), result
    assert int(result.stdout.split()[1]) * CHUNK_MB <= limit_mb, result


def test_a_memfd_counts_against_the_execution(pool):
    """Guards the memory cgroup against memory no rlimit sees (420 MiB of memfds under 256 MiB)."""
    result = pool.submit(MEMFD_HOG).result()
    assert "memfd filled" not in result.stdout
    assert result.status in (Status.MEMORY, Status.ERROR), result


HOG = textwrap.dedent("""
    import os, time
    started = time.monotonic()
    while time.monotonic() - started < 3:
        try:
            pid = os.fork()
        except OSError:  # the execution's process limit
            break
        if pid == 0:
            time.sleep(8)
            os._exit(0)
    time.sleep(6)
""")
THREADS = textwrap.dedent("""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(16) as ex:
        print(sum(ex.map(lambda x: x * x, range(100))))
""")


@pytest.mark.slow
def test_a_fork_hog_does_not_stop_a_concurrent_execution_from_starting_threads(pool):
    """Guards per-execution process limits: before, RLIMIT_NPROC counted every uid-65534 process,
    so a hog on one worker made a concurrent honest program fail to start a thread."""
    with SandboxPool(workers=2, timeout=20.0, max_processes=32,  # 1 GiB: room for 16 thread stacks
                     isolation=pool.isolation.level) as hog_pool:
        hog = hog_pool.submit(HOG)
        time.sleep(2.0)  # the hog holds its processes from here for several seconds
        honest = hog_pool.submit(THREADS).result()
        assert honest.status is Status.OK and honest.stdout == "328350\n", honest
        assert hog.result().status is Status.OK


HOLD_ALL = textwrap.dedent("""
    import os, time
    held = 1
    while True:  # every process the execution's limit allows, held for seconds
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(8)
            os._exit(0)
        held += 1
    print("held", held, "uid", os.getuid())
    time.sleep(6)
""")
HONEST_THREADS = textwrap.dedent("""
    import os, threading
    from concurrent.futures import ThreadPoolExecutor
    done = []
    thread = threading.Thread(target=done.append, args=("thread",))
    thread.start()
    thread.join()
    barrier = threading.Barrier(16, timeout=10)  # all 16 pool threads alive at once
    with ThreadPoolExecutor(16) as pool:
        waited = list(pool.map(lambda _: barrier.wait() >= 0, range(16)))
    print(done, sum(waited), "uid", os.getuid())
""")


@pytest.fixture
def no_cgroups(monkeypatch):
    """The fallback where no cgroup is writable (not root, a read-only /sys/fs/cgroup, a container)."""
    monkeypatch.setattr(cgroups, "setup", lambda owner_pid=None: cgroups.CgroupLimits(note="off: a test"))


@pytest.mark.slow
@pytest.mark.parametrize("level", ["bwrap", "process"])
def test_without_cgroups_a_fork_hog_does_not_stop_another_worker_from_starting_threads(level, no_cgroups):
    """Guards the RLIMIT_NPROC fallback: each worker slot's children run as a uid of their own, so a
    sample holding every process its limit allows leaves a concurrent sample on another worker free
    to start threads. Before, all children shared uid 65534 and the honest sample could not start
    one ("can't start new thread")."""
    max_processes = 32
    with SandboxPool(workers=2, timeout=20.0, max_processes=max_processes, isolation=level) as pool:
        assert not pool.isolation.layers["cgroup_limits"]
        hog = pool.submit(HOLD_ALL)
        time.sleep(2.0)  # the hog holds its processes from here for several seconds
        honest = pool.submit(HONEST_THREADS).result()
        hogged = hog.result()
        assert hogged.status is Status.OK, hogged
        held = int(hogged.stdout.split()[1])
        assert max_processes - 2 <= held <= max_processes, hogged.stdout  # it reached its limit
        assert honest.status is Status.OK and honest.stdout.startswith("['thread'] 16 uid"), honest
        assert honest.stdout.split()[-1] != hogged.stdout.split()[-1]  # two uids
        assert pool.isolation.process_limit == "slot-uid", pool.isolation.describe()
        assert pool.isolation.layers["process_limit_per_execution"]
