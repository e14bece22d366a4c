"""Counters and caches that could carry answers from one execution to the next (red team 5).

A *writer* is a sample that leaves its answer somewhere; a *reader* computes nothing and passes only
by finding it. Each pair runs writer then reader on one worker (the reader also alone); the reader
must fail. Where the pair's mechanism works inside one execution, that program ("together") passes:
the reader's decoding is sound, so only the sandbox's reset can make the separate reader fail.

Classes and levels:
  * tmpfs inode numbers (O_TMPFILE until the next number spells the answer): bwrap and process (root:
    the worker replaces the tmpfs), bwrap-userns (as a test user: a fresh worker follows).
  * PIDs (threads until the next child's PID spells it; /proc/self): bwrap (fixed ns_last_pid,
    hidepid), process (root: a /proc per child), bwrap-userns (a fresh worker follows; /proc closed).
  * the host's page cache (fadvise DONTNEED, then RWF_NOWAIT probes): every level with seccomp (the
    advice is ignored, the probe refused); a host process's cached pages stay cached meanwhile.
Not covered: the process level as another user (no PID namespace, the temp dir on the host's /tmp:
docs/sandbox.md says what holds there).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
import threading
import time

import pytest

from rlcode.sandbox import SandboxPool, Status
from rlcode.sandbox.verdict import check_against_tests
from unprivileged_user import run_as_user

ROOT = os.geteuid() == 0
BWRAP = shutil.which("bwrap") is not None
ROOT_LEVELS = [pytest.param("bwrap", marks=pytest.mark.skipif(not (ROOT and BWRAP), reason="bwrap as root")),
               pytest.param("process", marks=pytest.mark.skipif(not ROOT, reason="mounts need root"))]
SECRET = 48213  # 11 * 4096 + 3157: the readers know the high part, the channel must carry the rest
TESTS = [f"assert secret_value(1) == {SECRET}"]
LOW = SECRET % 4096

# TMPDIR, not tempfile.gettempdir(): its first call writes a file to check the directory, an inode.
INODE_WRITER = textwrap.dedent(f"""
    import os
    def next_number(path):
        fd = os.open(path, os.O_TMPFILE | os.O_RDWR, 0o600)
        try:
            return os.fstat(fd).st_ino + 1
        finally:
            os.close(fd)
    for path in (os.environ["TMPDIR"], "/dev/shm"):  # nothing is left in either directory
        while next_number(path) % 4096 != {LOW}:
            pass
""")
INODE_READER = textwrap.dedent("""
    import os
    def secret_value(n):
        fd = os.open(os.environ["TMPDIR"], os.O_TMPFILE | os.O_RDWR, 0o600)
        try:
            return 45056 + os.fstat(fd).st_ino % 4096
        finally:
            os.close(fd)
""")
PID_WRITER = textwrap.dedent(f"""
    import os, threading
    me = int(os.readlink("/proc/self"))  # this child's PID in the worker's namespace
    for _ in range(({LOW} - me - 1) % 4096):  # each thread takes the next PID; the next child the one after
        thread = threading.Thread(target=int)
        thread.start()
        thread.join()
""")
PID_READER = textwrap.dedent("""
    import os
    def secret_value(n):
        return 45056 + int(os.readlink("/proc/self")) % 4096
""")
# Within one execution the next PID goes to the next process the writer starts: a fork reads it.
PID_TOGETHER = PID_WRITER + textwrap.dedent("""
    def secret_value(n):
        reading, writing = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(writing, os.readlink("/proc/self").encode())
            os._exit(0)
        os.waitpid(pid, 0)
        return 45056 + int(os.read(reading, 32)) % 4096
""")
# Which PIDs a child sees in /proc besides its own (the worker's and template's entries moved with
# what the previous execution did); an error string where /proc cannot be listed.
PROC_LISTING = textwrap.dedent("""
    import json, os
    try:
        others = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()
                        and p != os.readlink("/proc/self"))
    except OSError as e:
        others = e.strerror
    print(json.dumps(others))
""")
# A stdlib file every level lets a child read, big enough for 17 pages.
PAGE_FILE = "import os\nPATH = os.path.join(os.path.dirname(os.__file__), 'pydoc_data', 'topics.py')\n"
PAGE_WRITER = PAGE_FILE + textwrap.dedent(f"""
    fd = os.open(PATH, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: a read loads its own page only
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # every page of it out of the host's cache
    for bit in range(16):  # then back in: the pages whose bit of the answer is 1, and page 16
        if {SECRET} >> bit & 1:
            os.pread(fd, 1, bit * 4096)
    os.pread(fd, 1, 16 * 4096)
""")
PAGE_READER = PAGE_FILE + textwrap.dedent("""
    def cached(fd, page):
        try:
            os.preadv(fd, [bytearray(1)], page * 4096, os.RWF_NOWAIT)
            return True
        except BlockingIOError:
            return False
    def secret_value(n):
        fd = os.open(PATH, os.O_RDONLY)
        return sum(cached(fd, bit) << bit for bit in range(16))
""")


def _pair(pool, writer: str, reader: str, together: str | None = None) -> dict:
    """Together (``writer + reader`` unless given), writer then reader, and the reader alone, on the
    pool's one worker."""
    together = check_against_tests(pool, together or writer + reader, TESTS).result(timeout=120)
    wrote = pool.submit(writer, timeout=30.0).result()
    read = check_against_tests(pool, reader, TESTS).result(timeout=120)
    alone = check_against_tests(pool, reader, TESTS).result(timeout=120)
    return {"together": together.all_passed, "writer": [wrote.status.value, wrote.stderr[-300:]],
            "reader": [read.all_passed, read.reason], "alone": alone.all_passed}


def _collusion_runs(pool) -> dict:
    listing = pool.submit(PROC_LISTING).result()
    # Both in flight at once: the reader waits in the worker's queue while the writer runs (where the
    # writer retires the worker, the reader must go to a fresh one, not run after it there).
    queued = [pool.submit(PID_WRITER, timeout=30.0), check_against_tests(pool, PID_READER, TESTS)]
    return {"inodes": _pair(pool, INODE_WRITER, INODE_READER), "pids": _pair(pool, PID_WRITER, PID_READER, PID_TOGETHER),
            "pages": _pair(pool, PAGE_WRITER, PAGE_READER), "queued_reader": queued[1].result(timeout=120).all_passed,
            "proc_others": json.loads(listing.stdout) if listing.status is Status.OK else listing.stderr}


def _check_pages(report: dict) -> None:
    """fadvise(DONTNEED) is ignored and RWF_NOWAIT refused: the pair gets nothing, even together."""
    _check_pair(report, together=False)
    assert "Operation not supported" in report["reader"][1], report


def _check_pair(report: dict, *, together: bool = True) -> None:
    assert report["writer"][0] == "ok", report  # the writer ran its course
    assert report["together"] is together, report  # the channel works within one execution
    assert report["reader"][0] is False, report  # ... and carries nothing to the next
    assert report["alone"] is False, report


@pytest.mark.parametrize("level", ROOT_LEVELS)
def test_inode_and_pid_numbers_and_the_page_cache_carry_nothing_to_the_next_execution(level):
    with SandboxPool(workers=1, timeout=10.0, isolation=level) as pool:
        report = _collusion_runs(pool)
        layers = pool.isolation.layers
    _check_pair(report["inodes"])
    _check_pair(report["pids"])
    _check_pages(report["pages"])
    assert report["queued_reader"] is False, report
    assert layers["inode_numbers_private"] and layers["pid_numbers_private"], layers
    # bwrap: hidepid shows a child its own processes only; process: its own /proc, closed by Landlock
    assert report["proc_others"] in ([], "Permission denied"), report


USERNS_RUNNER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import test_sandbox_collusion as t
    from rlcode.sandbox import SandboxPool
    with SandboxPool(workers=1, timeout=10.0, isolation="bwrap-userns") as pool:
        report = t._collusion_runs(pool)
        report["layers"] = pool.isolation.layers
    print(json.dumps(report))
""")


@pytest.mark.slow
def test_inode_and_pid_numbers_and_the_page_cache_at_bwrap_userns():
    """Without mount rights the worker cannot replace bwrap's tmpfs or fix the last PID: an execution
    that moved either counter is followed by a fresh worker, and /proc is closed by Landlock."""
    if not ROOT or not BWRAP:
        pytest.skip("runs bwrap-userns as an unprivileged test user (needs root here, and bubblewrap)")
    done = run_as_user(USERNS_RUNNER, os.path.dirname(__file__), home="/nonexistent",
                       path=os.environ.get("PATH", "/usr/bin:/bin"))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    _check_pair(report["inodes"])
    _check_pair(report["pids"])
    _check_pages(report["pages"])
    assert report["queued_reader"] is False, report
    assert report["layers"]["inode_numbers_private"] and report["layers"]["pid_numbers_private"], report
    assert report["proc_others"] == "Permission denied", report


PAGE_DROPPER = PAGE_FILE + textwrap.dedent("""
    import mmap, time
    fd = os.open(PATH, os.O_RDONLY)
    mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        mapped.madvise(21)  # MADV_PAGEOUT (mmap names it only where Python was built with it)
        mapped.madvise(20)  # MADV_COLD
    print("dropped")
""")


def _cached_pages(path: str) -> list[bool]:
    """Which pages of ``path`` are in the page cache, probed without loading any (RWF_NOWAIT)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pages, found = (os.fstat(fd).st_size + 4095) // 4096, []
        for page in range(pages):
            try:
                os.preadv(fd, [bytearray(1)], page * 4096, os.RWF_NOWAIT)
                found.append(True)
            except BlockingIOError:
                found.append(False)
        return found
    finally:
        os.close(fd)


def _evictions_while(path: str, busy) -> list[int]:
    """Pages of ``path`` found evicted at each probe (every ~10 ms, the host re-reading the file after
    each, as an evicted host would) while ``busy()`` runs."""
    evicted, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            evicted.append(sum(not c for c in _cached_pages(path)))
            with open(path, "rb") as f:
                f.read()
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        busy()
    finally:
        stop.set()
        watcher.join()
    return evicted


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="needs preadv2")
def test_a_host_process_keeps_its_cached_pages_while_a_sample_drops_them():
    """The host reads a stdlib file, a sample drops its pages in a loop (fadvise DONTNEED, madvise
    PAGEOUT and COLD) for 1.5 s while the host probes them, then the host probes 1.5 s with no sample.

    Unfiltered, the loop evicts most of the file between any two probes (measured: 60-185 of its
    ~185 pages at each of ~130 probes). A machine may also reclaim pages on its own: this VM runs
    DAMON's proactive pageout, which evicted 16 pages over one such window during the full test run.
    So the sample's window may show what the quiet window shows plus one whole file's worth (a
    background burst), far below the attack's ~probes x pages. Control: the host's own DONTNEED (no
    sandbox) is seen by the same probe, so the probe can fail."""
    import sysconfig
    path = os.path.join(sysconfig.get_paths()["stdlib"], "pydoc_data", "topics.py")
    with open(path, "rb") as f:
        f.read()
    assert all(_cached_pages(path)), "the host's read did not cache the file"
    pages = len(_cached_pages(path))
    with SandboxPool(workers=1, timeout=10.0) as pool:
        results = []
        with_sample = _evictions_while(path, lambda: results.append(pool.submit(PAGE_DROPPER).result()))
    quiet = _evictions_while(path, lambda: time.sleep(1.5))
    assert results[0].status is Status.OK and results[0].stdout == "dropped\n", results[0]
    assert len(with_sample) >= 10 and len(quiet) >= 10, (with_sample, quiet)
    assert sum(with_sample) <= sum(quiet) + pages, (sum(with_sample), sum(quiet), pages, with_sample)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert not all(_cached_pages(path)), "the probe does not see evictions: this test could not fail"


VALUES_FLOOD = textwrap.dedent("""
    import os
    def secret_value(n):
        os.write(3, FILL * (8 << 20))  # the values fd, straight: 8 MiB with no newline
        return 0
""")
MEASURE = textwrap.dedent("""
    import json, resource, sys, time
    from rlcode.sandbox import SandboxPool
    from rlcode.sandbox.verdict import check_against_tests
    program, tests = sys.argv[1], json.loads(sys.argv[2])
    with SandboxPool(workers=1, timeout=30.0) as pool:
        check_against_tests(pool, "def secret_value(n): return 0", tests).result()  # warm
        cpu = time.process_time()
        verdicts = [check_against_tests(pool, program, tests).result() for _ in range(3)]
        cpu = time.process_time() - cpu
    print(json.dumps({"rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "cpu_s": cpu,
                      "passed": [v.all_passed for v in verdicts]}))
""")
# The worker drops a non-ASCII values line, so the parent's work for it is a subset of what it does
# for the same bytes in ASCII (which reach it and fail to decode): at most the same memory and CPU.
# The constants cover the run-to-run spread of one such process (allocator and scheduling noise).
RSS_CONSTANT, CPU_CONSTANT, CPU_FLOOR_S = 1.25, 1.5, 0.2


@pytest.mark.slow
def test_non_ascii_values_cost_the_parent_no_more_than_ascii():
    """8 MiB of 0xFF on the values fd had become a 48 MiB protocol line: ~200 MB of the parent's
    memory and ~6 s of its CPU against ~57 MB and ~0.5 s for ASCII. Three samples each way."""
    import subprocess
    runs = {}
    for name, fill in (("ascii", "b'x'"), ("non_ascii", "b'\\xff'")):
        program = VALUES_FLOOD.replace("FILL", fill)
        done = subprocess.run([sys.executable, "-c", MEASURE, program, json.dumps(TESTS)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[name] = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs["ascii"]["passed"] == runs["non_ascii"]["passed"] == [False] * 3, runs
    assert runs["non_ascii"]["rss_kib"] <= RSS_CONSTANT * runs["ascii"]["rss_kib"], runs
    assert runs["non_ascii"]["cpu_s"] <= CPU_CONSTANT * runs["ascii"]["cpu_s"] + CPU_FLOOR_S, runs
