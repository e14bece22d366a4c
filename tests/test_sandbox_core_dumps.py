"""No core dump leaves an execution, whatever kernel.core_pattern is (see rlcode/sandbox/core_dumps.py).

RLIMIT_CORE=0 does not stop a dump to a pipe core_pattern (apport's, systemd-coredump's), and a
child could call prctl(PR_SET_DUMPABLE, 1): one execution handed nine 61 MB cores to a root helper.
The host's pattern cannot be changed in a test (it is the machine's), so the tests check what the
kernel's rules rest on: the limit is 1 and stays 1, the child is not dumpable and stays so, and a
crash (forked, or after an exec) reports no core.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from rlcode.sandbox import SandboxPool, Status, core_dumps

CRASHER = textwrap.dedent("""
    import ctypes, json, os, resource, sys
    libc = ctypes.CDLL(None, use_errno=True)
    PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
    out = {"limit": resource.getrlimit(resource.RLIMIT_CORE), "dumpable": libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0),
           "made_dumpable": libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0}
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # 0: what a pipe core_pattern dumps at
        out["lowered"] = True
    except (OSError, ValueError):
        out["lowered"] = False
    out["limit_after"] = resource.getrlimit(resource.RLIMIT_CORE)

    def crash(argv=None):
        pid = os.fork()
        if pid == 0:
            if argv:
                os.execv(argv[0], argv)  # an exec makes a process dumpable again
            libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            os.abort()
        _, status = os.waitpid(pid, 0)
        return [os.WIFSIGNALED(status) and os.WTERMSIG(status), os.WCOREDUMP(status)]
    out["forked_crash"] = crash()
    out["exec_crash"] = crash([sys.executable, "-I", "-S", "-c", "import os; os.abort()"])
    out["cores_here"] = [name for name in os.listdir(".") if name.startswith("core")]
    print(json.dumps(out))
""")


@pytest.mark.parametrize("level", ["bwrap", "process"])
def test_no_core_dump_under_any_pattern(level):
    """Guards RLIMIT_CORE 1 (file patterns need a page, pipe patterns never dump at 1), its seccomp
    lock, and non-dumpability (what a socket pattern checks): crashes before and after an exec dump
    nothing (SIGABRT without the core bit), and an honest sample after them still runs."""
    with SandboxPool(workers=1, timeout=20.0, isolation=level) as pool:
        result = pool.submit(CRASHER).result()
        honest = pool.submit("print(6 * 7)").result()
        layers = pool.isolation.layers
    assert result.status is Status.OK, result.stderr
    out = json.loads(result.stdout)
    assert out == {"limit": [1, 1], "dumpable": 0, "made_dumpable": False, "lowered": False,
                   "limit_after": [1, 1], "forked_crash": [6, False], "exec_crash": [6, False],
                   "cores_here": []}, out
    assert honest.stdout == "42\n" and layers["no_core_dumps"]


def test_core_pattern_kinds():
    assert core_dumps.pattern_kind("|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -u%u -g%g -- %E") == "pipe"
    assert core_dumps.pattern_kind("@/run/systemd/coredump") == "socket"
    assert core_dumps.pattern_kind("@@/run/coredump.socket") == "socket"
    assert core_dumps.pattern_kind("core") == "file" and core_dumps.pattern_kind("/var/crash/%e.%p") == "file"


def test_under_a_socket_pattern_exec_is_refused(monkeypatch):
    """A socket core_pattern ignores RLIMIT_CORE and an exec makes a process dumpable again, so
    there the filter refuses execve."""
    monkeypatch.setattr(core_dumps, "pattern_kind", lambda pattern=None: "socket")
    with SandboxPool(workers=1, timeout=20.0, isolation="bwrap") as pool:
        if not pool.isolation.layers["seccomp"]:
            pytest.skip("no seccomp here: " + pool.isolation.notes["seccomp"])
        result = pool.submit("import os, sys\ntry:\n    os.execv(sys.executable, [sys.executable, '-c', 'pass'])\n"
                             "except PermissionError:\n    print('refused')\n").result()
        note = pool.isolation.notes["no_core_dumps"]
    assert result.stdout == "refused\n", (result.stdout, result.stderr)
    assert "no exec" in note, note
