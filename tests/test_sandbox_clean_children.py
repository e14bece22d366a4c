"""A child starts clean: nothing an earlier execution sent or received is readable in its memory.

Children used to be forked from the long-lived worker, whose heap held every earlier request and
result, freed but not overwritten. A sample that computed nothing scanned its own memory for the
previous correct sample's probe values and returned them: judged passed. Children now come from a
template process that never sees a request or a result (inside/template.py).
"""

from __future__ import annotations

import os
import textwrap
import time

import psutil
import pytest

from rlcode.sandbox import SandboxPool, Status
from rlcode.sandbox.verdict import check_against_tests

KEY = os.urandom(8).hex()  # in the expected values only: no sample's code contains it
TESTS = [f"assert secret_fn({n}) == 'ANSWER-{KEY}-{n}'" for n in (3, 5, 7)]
HONEST = f"def secret_fn(n):\n    return 'ANSWER-{KEY}-' + str(n)\n"
# Reads every readable anonymous mapping of its own (from /proc/self/maps; where Landlock hides /proc,
# every page within 256 MiB of a few live objects, probed by writing it to a pipe: EFAULT, not a
# crash, where nothing is mapped) for values of the form ANSWER-<16 hex>-<n>, and returns what it
# found. A canary built at run time proves the scan sees this process's heap.
SCANNER = textwrap.dedent(r'''
    import ctypes, os, re
    PATTERN = re.compile(b"ANSWER" + b"-([0-9a-f]{16})-([0-9]+)")
    PAGE = 4096

    def regions():
        try:
            with open("/proc/self/maps") as maps:
                rows = [line.split() for line in maps]
        except OSError:
            return None
        return [tuple(int(x, 16) for x in row[0].split("-")) for row in rows
                if row[1].startswith("r") and (len(row) < 6 or row[5] in ("[heap]", "[stack]"))]

    def readable_pages(anchors, reach=256 << 20):
        r, w = os.pipe()
        pages = set()
        for anchor in anchors:
            start = (anchor - reach) & ~(PAGE - 1)
            for page in range(max(start, PAGE), anchor + reach, PAGE):
                if page in pages:
                    continue
                try:
                    os.write(w, (ctypes.c_char * PAGE).from_address(page))
                except OSError:
                    continue
                os.read(r, PAGE)
                pages.add(page)
        return [(page, page + PAGE) for page in sorted(pages)]

    canary = b"ANSWER" + b"-" + b"%016x" % 0xFEED + b"-999"
    anchors = [id(canary), id(object()), id(PATTERN), ctypes.cast(ctypes.create_string_buffer(64), ctypes.c_void_p).value]
    FOUND = {}
    for lo, hi in regions() or readable_pages(anchors):
        for match in PATTERN.finditer(ctypes.string_at(lo, hi - lo)):
            FOUND[int(match.group(2))] = match.group(0).decode()
    print("canary seen", 999 in FOUND, "answers seen", sorted(n for n in FOUND if n != 999))

    def secret_fn(n):
        return FOUND.get(n)
''')


@pytest.mark.parametrize("level", ["bwrap", "process"])
def test_a_sample_finds_no_earlier_answers_in_its_own_memory(level):
    """Guards the template: after a correct sample (and with it its probe values) ran on the only
    worker, a sample scanning its own memory finds its canary but none of those values, and fails;
    an honest sample after it still passes."""
    with SandboxPool(workers=1, timeout=30.0, isolation=level) as pool:
        honest = check_against_tests(pool, HONEST, TESTS).result()
        scanned = check_against_tests(pool, SCANNER, TESTS).result()
        again = check_against_tests(pool, HONEST, TESTS).result()
    assert honest.all_passed and again.all_passed, (honest.reason, again.reason)
    assert scanned.result.stdout == "canary seen True answers seen []\n", (scanned.result.stdout,
                                                                            scanned.result.stderr[-2000:])
    assert not any(scanned.passed), scanned.reason
    assert pool.isolation.layers["fresh_child_memory"]


def test_a_child_cannot_open_another_sandbox_process_memory():
    """The worker (which holds requests and results) and the template are not dumpable and run as
    another uid than the child, so /proc/<pid>/mem of every other process stays closed (ptrace
    rights are needed to open it); and /proc is mounted hidepid=invisible, so the child does not
    even see them listed (pid_numbering.py). Every low PID (bwrap's init, the worker, the template)
    is tried by number too."""
    with SandboxPool(workers=1, timeout=30.0, isolation="bwrap") as pool:
        result = pool.submit(textwrap.dedent("""
            import os
            opened, me = [], os.readlink("/proc/self")  # our pid as this /proc numbers it
            listed = [entry for entry in os.listdir("/proc") if entry.isdigit() and entry != me]
            for entry in listed + [str(pid) for pid in range(1, 64) if str(pid) != me]:
                try:
                    with open(f"/proc/{entry}/mem", "rb"):
                        opened.append(entry)
                except OSError:
                    pass
            print(len(listed) > 0, opened)
        """)).result()
    assert result.stdout == "False []\n", (result.stdout, result.stderr)


def test_a_dead_template_costs_one_execution_and_its_worker():
    """The template is the only process that can fork children with a clean memory; a worker whose
    template died answers its execution with internal_error and is retired (a new template from the
    old worker's memory would not be clean), and every later sample runs on a fresh worker."""
    with SandboxPool(workers=1, timeout=20.0, isolation="process") as pool:
        assert pool.submit("print(1)").result().stdout == "1\n"
        worker = pool._slots[0].worker
        (template,) = psutil.Process(worker.pid).children()
        template.kill()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(template):
            time.sleep(0.01)
        results = [pool.submit(f"print({i})").result() for i in range(3)]
        assert pool._slots[0].worker is not worker
    statuses = [r.status for r in results]
    assert statuses in ([Status.INTERNAL_ERROR, Status.OK, Status.OK], [Status.OK] * 3), results
    assert [r.stdout for r in results if r.status is Status.OK] == [f"{i}\n" for i in range(3)][-statuses.count(Status.OK):]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
