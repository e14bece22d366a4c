"""Nothing an execution leaves in the kernel reaches another, and no host-wide budget is shared.

Classes and the levels each is tested at:
  * unix sockets held in flight (SCM_RIGHTS cycles): their abstract names and the memory queued in
    them. Names: bwrap, process (root) and bwrap-userns (as a test user). Memory: bwrap and process
    (root), where a slot memory cgroup exists; bwrap-userns has none (memory is RLIMIT_AS per process,
    which in-flight memfds do not count), so an honest sample there cannot be starved through it.
  * file locks, a host-wide table (/proc/locks, F_GETLK): every level (seccomp denies them all).
  * Linux AIO, a host-wide budget (fs.aio-max-nr): every level (seccomp).
The process level as another user (children in the host's network namespace) is not covered for
unix names: sockets there cannot be told from the host's (see inside/unix_drain.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import shutil
import struct
import textwrap
import threading
import time

import pytest

from rlcode.data.mbpp import load_mbpp
from rlcode.sandbox import SandboxPool, Status
from rlcode.sandbox.verdict import check_against_tests
from unprivileged_user import run_as_user

ROOT = os.geteuid() == 0
ROOT_LEVELS = [pytest.param("bwrap", marks=pytest.mark.skipif(not (ROOT and shutil.which("bwrap")),
                                                             reason="bwrap as root")),
               pytest.param("process", marks=pytest.mark.skipif(not ROOT, reason="a netns of its own needs root"))]
SECRET = 48213  # only the colluding writer knows it
SECRET_TESTS = [f"assert secret_value(1) == {SECRET}"]
HONEST = "def secret_value(n):\n    return 48213\n"  # stands for a sample that computes it

# --- unix names: a cycle of sockets whose fds are in each other's queues, one bound to the answer ----
NAME_WRITER = textwrap.dedent("""
    import array, socket
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    named = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    named.bind(b"\\0rlcode-answer-%d" % 48213)
    fds = array.array("i", [a.fileno(), b.fileno(), named.fileno()])
    for end in (a, b):  # each end travels inside the other: only in-flight references hold them
        end.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    print("bound")
""")
NAME_READER = textwrap.dedent("""
    import errno, socket
    def secret_value(n):
        try:
            table = open("/proc/net/unix").read()
        except OSError:
            table = ""
        for line in table.splitlines():
            if "@rlcode-answer-" in line:
                return int(line.rsplit("-", 1)[1])
        for guess in range(48000, 48500):  # where /proc is closed: a name in use refuses bind()
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                probe.bind(b"\\0rlcode-answer-%d" % guess)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return guess
            finally:
                probe.close()
""")


def _unix_names_run(pool) -> dict:
    """Writer, reader, honest sample, in order, on the pool's one worker; plus the control."""
    together = check_against_tests(pool, NAME_WRITER + NAME_READER, SECRET_TESTS).result(timeout=60)
    writer = pool.submit(NAME_WRITER).result()
    reader = check_against_tests(pool, NAME_READER, SECRET_TESTS).result(timeout=60)
    honest = check_against_tests(pool, HONEST, SECRET_TESTS).result(timeout=60)
    return {"together": together.all_passed, "writer": [writer.status.value, writer.stdout],
            "reader": [reader.all_passed, reader.reason], "honest": honest.all_passed}


def _check_unix_names(run: dict) -> None:
    # The control: within one execution the reader finds the writer's name, so it can find one.
    assert run["together"], run
    assert run["writer"] == ["ok", "bound\n"], run
    assert not run["reader"][0] and "assert 1 failed" in run["reader"][1], run
    assert run["honest"], run


@pytest.mark.parametrize("level", ROOT_LEVELS)
def test_unix_names_left_in_flight_do_not_reach_the_next_execution(level):
    """Guards the drain: a writer leaves the answer as an abstract name on a socket only a cycle of
    in-flight fds holds; the next execution on the worker cannot read it (/proc/net/unix, bind())."""
    with SandboxPool(workers=1, timeout=10.0, isolation=level) as pool:
        assert pool.isolation.layers["unix_sockets_drained"]
        _check_unix_names(_unix_names_run(pool))


# --- memory queued in sockets held in flight ----------------------------------------------------------
MEMORY_ATTACK = textwrap.dedent("""
    import array, os, socket
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ends = array.array("i", [a.fileno(), b.fileno()])
    for end in (a, b):
        end.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, ends)])
    held = 0
    chunk = b"\\1" * (1 << 20)
    while True:  # memfds queued in the cycle, filled 1 MiB at a time until the slot's cgroup is full
        fd = os.memfd_create("hold")
        a.sendmsg([b"m"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        for _ in range(16):
            os.write(fd, chunk)
            held += 1
            print(held, flush=True)
        os.close(fd)
""")
MEMORY_MB = 192  # the slot's cgroup holds this + the worker's 64 MiB: the attack fills it in ~1 s
# An honest sample using half of its memory (RLIMIT_AS counts the interpreter's ~30 MiB of address space too).
HALF_MEMORY = ("def allocated(mib):\n    return len(bytearray(mib << 20)) >> 20\n",
               [f"assert allocated({MEMORY_MB // 2}) == {MEMORY_MB // 2}"], "")


@pytest.mark.parametrize("level", ROOT_LEVELS)
def test_honest_samples_pass_right_after_memory_is_left_in_flight(level):
    """Guards the drain's memory side: a sample fills its slot's memory cgroup with memfds queued in
    a socket cycle and is killed for it; MBPP references run next on the same worker all pass,
    beside one using half of its memory (before the drain the charge stayed until the kernel's
    collector happened to run, and they failed with memory or killed)."""
    honest = [HALF_MEMORY] + [(t.code, t.test_list, t.test_setup_code) for t in load_mbpp(None, "test")[:5]]
    with SandboxPool(workers=1, timeout=10.0, memory_mb=MEMORY_MB, isolation=level) as pool:
        assert pool.isolation.layers["cgroup_limits"], "needs the slot's memory cgroup"
        attack = pool.submit(MEMORY_ATTACK).result()
        verdicts = [check_against_tests(pool, *sample).result(timeout=60) for sample in honest]
    held = int(attack.stdout.split()[-1])
    assert attack.status in (Status.MEMORY, Status.KILLED) and held >= MEMORY_MB, (attack.status, held)
    assert [v.reason for v in verdicts] == ["passed"] * len(honest)


def _fake_memory_cgroup(folder, usage: int, file_pages: int = 0) -> None:
    """The kernel writes a cgroup file whole; a regular file rewritten by a thread (truncate, then
    write) can be read empty in between: each file is overwritten in place at a fixed width instead."""
    _overwrite(folder / "memory.usage_in_bytes", f"{usage:020d}\n")
    _overwrite(folder / "memory.stat", f"cache {file_pages:020d}\nrss 0\ninactive_file {file_pages:020d}\nactive_file 0\n")


def _overwrite(path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        os.pwrite(fd, text.encode(), 0)
    finally:
        os.close(fd)


def test_the_next_execution_waits_for_the_slot_memory_the_sockets_carried(tmp_path, monkeypatch):
    """The memory side's second half (inside/slot_memory.py), on a folder standing for the slot's
    cgroup: the sockets are gone but what they carried is uncharged later (delayed fput). After
    leftovers the worker waits until it is, however little the usage moved; page cache counts as
    free; memory still charged at the end of the bound gives a reason (the worker retires)."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "rlcode", "sandbox", "inside"))
    import slot_memory
    monkeypatch.setattr(slot_memory, "SETTLE_BUDGET_S", 30.0)  # the wait ends when the timer uncharges, not here
    idle = 2 << 20
    _fake_memory_cgroup(tmp_path, idle)
    memory = slot_memory.SlotMemory(str(tmp_path))
    assert memory.settle(False, 0) is None  # the usual case: nothing moved
    _fake_memory_cgroup(tmp_path, idle + (200 << 20), file_pages=200 << 20)
    assert memory.settle(False, 0) is None  # page cache: the kernel reclaims it for the next one
    _fake_memory_cgroup(tmp_path, idle + (200 << 20))
    uncharged = threading.Timer(0.05, _fake_memory_cgroup, (tmp_path, idle))
    uncharged.start()
    started = time.monotonic()
    assert memory.settle(True, 0) is None
    assert time.monotonic() - started >= 0.05, "it waited for the uncharge, not returned at once"
    uncharged.join()
    _fake_memory_cgroup(tmp_path, idle + (200 << 20))
    monkeypatch.setattr(slot_memory, "SETTLE_BUDGET_S", 0.3)
    reason = memory.settle(True, 0)
    assert reason and "200 MiB" in reason and "retires" in reason, reason
    _fake_memory_cgroup(tmp_path, idle + (8 << 20))  # a result of 8 MiB held by the worker: its own
    assert memory.settle(False, 4 << 20) is None


# --- file locks -------------------------------------------------------------------------------------
F_OFD_GETLK, F_OFD_SETLK, F_RDLCK, F_WRLCK, F_UNLCK = 36, 37, 0, 1, 2
FLOCK = "hhqqixxxx"  # struct flock on x86_64 and aarch64: type, whence, start, len, pid
LOCK_WRITER = textwrap.dedent("""
    import fcntl, os, struct, time
    fd = os.open(os.__file__, os.O_RDONLY)  # a shared read-only file every sandbox can open
    try:
        fcntl.fcntl(fd, 37, struct.pack("hhqqixxxx", 0, 0, 48213, 1, 0))  # F_OFD_SETLK, F_RDLCK
        print("locked", flush=True)
    except OSError as e:
        print("refused", e.errno, flush=True)
    time.sleep(2.5)
""")
LOCK_READER = textwrap.dedent("""
    import fcntl, os, struct, time
    def secret_value(n):
        fd = os.open(os.__file__, os.O_RDONLY)
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            try:
                table = open("/proc/locks").read()
            except OSError:
                table = ""
            for line in table.splitlines():
                fields = line.split()
                if len(fields) >= 8 and 40000 <= int(fields[-2]) < 60000:
                    return int(fields[-2])
            try:  # F_OFD_GETLK for a write lock over the range: a conflicting lock answers
                got = fcntl.fcntl(fd, 36, struct.pack("hhqqixxxx", 1, 0, 40000, 20000, 0))
                kind, _, start, _, _ = struct.unpack("hhqqixxxx", got)
                if kind != 2:
                    return start
            except OSError:
                pass
            time.sleep(0.05)
""")


def _lock_run(pool) -> dict:
    writer = pool.submit(LOCK_WRITER)
    reader = check_against_tests(pool, LOCK_READER, SECRET_TESTS).result(timeout=60)
    writer = writer.result()
    return {"writer": [writer.status.value, writer.stdout], "reader": [reader.all_passed, reader.reason]}


def _check_locks(run: dict) -> None:
    assert run["writer"] == ["ok", "refused 37\n"], run  # ENOLCK
    assert not run["reader"][0] and "assert 1 failed" in run["reader"][1], run


def test_the_lock_reader_finds_a_lock_where_one_is_visible():
    """The control for the test below: on the host, with a lock held by another process, the
    reader's code finds it (so the reader failing in the sandbox means it saw nothing)."""
    import fcntl
    read_fd, write_fd = os.pipe()
    holder = os.fork()
    if holder == 0:
        fd = os.open(os.__file__, os.O_RDONLY)
        fcntl.fcntl(fd, F_OFD_SETLK, struct.pack(FLOCK, F_RDLCK, 0, SECRET, 1, 0))
        os.write(write_fd, b"x")
        time.sleep(10)
        os._exit(0)
    try:
        os.read(read_fd, 1)
        scope: dict = {}
        exec(LOCK_READER, scope)
        assert scope["secret_value"](1) == SECRET
    finally:
        os.kill(holder, 9)
        os.waitpid(holder, 0)


@pytest.mark.parametrize("level", ROOT_LEVELS)
def test_a_lock_on_a_shared_file_carries_nothing_to_another_sandbox(level):
    """Guards the lock denial: a writer holding an OFD lock at the answer's offset of a read-only
    stdlib file while a reader on another worker reads /proc/locks and probes with F_OFD_GETLK."""
    with SandboxPool(workers=2, timeout=10.0, isolation=level) as pool:
        _check_locks(_lock_run(pool))


# --- Linux AIO ---------------------------------------------------------------------------------------
IO_SETUP, IO_DESTROY = {"x86_64": (206, 207), "aarch64": (0, 1)}.get(platform.machine(), (None, None))
AIO_HOARDER = textwrap.dedent(f"""
    import ctypes, time
    libc = ctypes.CDLL(None, use_errno=True)
    results = []
    for events in (65534, 4096, 64):
        context = ctypes.c_ulong(0)
        results.append(libc.syscall({IO_SETUP}, events, ctypes.byref(context)) or 0)
        results.append(ctypes.get_errno())
    print(results, flush=True)
    time.sleep(2.0)  # holding whatever it got
""")


def _host_io_setup(events: int = 64) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    context = ctypes.c_ulong(0)
    if libc.syscall(IO_SETUP, events, ctypes.byref(context)) != 0:
        return False
    libc.syscall(IO_DESTROY, context)
    return True


@pytest.mark.skipif(IO_SETUP is None, reason="AIO syscall numbers known for x86_64 and aarch64")
@pytest.mark.parametrize("level", ROOT_LEVELS)
def test_a_host_process_gets_aio_while_a_sample_tries_to_exhaust_it(level):
    """Guards the AIO denial: fs.aio-max-nr (65,536) is one count for the whole host; a sample
    asking for 65,534 events used to leave a host process's io_setup(64) failing."""
    with SandboxPool(workers=1, timeout=10.0, isolation=level) as pool:
        future = pool.submit(AIO_HOARDER)
        while not pool.list() or pool.list()[0].state != "running":
            time.sleep(0.01)
        host = []
        while not future.done():
            host.append(_host_io_setup())
            time.sleep(0.02)
        result = future.result()
    assert result.status is Status.OK, result.stderr
    assert json.loads(result.stdout) == [-1, 1] * 3  # EPERM each time
    assert host and all(host), host


# --- all three at bwrap-userns, as an unprivileged user -----------------------------------------------
USERNS_RUNNER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import test_sandbox_kernel_objects as t
    from rlcode.sandbox import SandboxPool
    with SandboxPool(workers=1, timeout=10.0, isolation="bwrap-userns") as pool:
        names, drained = t._unix_names_run(pool), pool.isolation.layers["unix_sockets_drained"]
        aio = pool.submit(t.AIO_HOARDER).result().stdout
    with SandboxPool(workers=2, timeout=10.0, isolation="bwrap-userns") as pool:
        locks = t._lock_run(pool)
    print(json.dumps({"names": names, "drained": drained, "locks": locks, "aio": aio}))
""")


@pytest.mark.slow
def test_unix_names_locks_and_aio_at_bwrap_userns():
    """The three guards above at bwrap-userns (run as an unprivileged test user)."""
    if not ROOT or not shutil.which("bwrap") or IO_SETUP is None:
        pytest.skip("runs bwrap-userns as an unprivileged test user (needs root here, and bubblewrap)")
    done = run_as_user(USERNS_RUNNER, os.path.dirname(__file__), home="/nonexistent",
                       path=os.environ.get("PATH", "/usr/bin:/bin"))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["drained"], report
    _check_unix_names(report["names"])
    _check_locks(report["locks"])
    assert json.loads(report["aio"]) == [-1, 1] * 3, report
