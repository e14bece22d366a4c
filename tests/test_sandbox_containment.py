"""Containment: what a hostile program must not be able to do, at the bwrap and process levels."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from rlcode.sandbox import SandboxPool, Status, detect_isolation, slot_uids

REPO = Path(__file__).resolve().parents[1]
LEVELS = ["bwrap", "process"]
SECRETS = {"WANDB_API_KEY": "wandb-secret-1f3a", "OPENAI_API_KEY": "sk-secret-9c2e", "HF_TOKEN": "hf_secret_77d1"}


@pytest.fixture(scope="module", params=LEVELS)
def pool(request):
    old = {k: os.environ.get(k) for k in SECRETS}
    os.environ.update(SECRETS)  # the trainer has secrets; the sandbox must not
    try:
        with SandboxPool(workers=2, timeout=5.0, isolation=request.param) as p:
            yield p
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run(pool, code: str, **kwargs):
    return pool.submit(textwrap.dedent(code), **kwargs).result()


def _sandbox_descendants() -> list[psutil.Process]:
    """Our descendants running as a sandbox uid (children and their offspring)."""
    base, found = slot_uids.range_base(), []
    for process in psutil.Process().children(recursive=True):
        try:
            uid = process.uids().real
            if (base <= uid < base + slot_uids.RANGE_SIZE or uid == slot_uids.SHARED_UID) \
                    and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


def _with_marker(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if marker in (process.info["cmdline"] or []) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


def _eventually_none(find, seconds: float = 15.0) -> list:  # returns as soon as nothing is left
    deadline = time.monotonic() + seconds
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _escaping_sleeper(marker: str, then: str) -> str:
    """A program that starts a sleeper in a new session (double fork), waits until it runs, then `then`.

    Give it a few seconds before a timeout: on a loaded CI machine the double fork and exec alone
    have taken over a second, and "spawned" must be printed before the kill for the test to mean it.
    """
    return textwrap.dedent(f"""
        import os, time
        r, w = os.pipe()  # close-on-exec: EOF once the sleeper has exec'd and the middle process left
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "{marker}"])
            os._exit(0)
        os.close(w)
        os.read(r, 1)
        print("spawned", flush=True)
        {then}
    """)


def test_no_network(pool):
    result = _run(pool, """
        import socket
        for family, kind in [(socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_DGRAM),
                             (socket.AF_PACKET, socket.SOCK_RAW), (socket.AF_NETLINK, socket.SOCK_RAW)]:
            try:
                s = socket.socket(family, kind)
            except OSError as e:
                print("denied", family)
                continue
            s.connect(("127.0.0.1", 80))
        a, b = socket.socketpair()  # AF_UNIX keeps working
        a.sendall(b"ping"); print(b.recv(4))
    """)
    assert result.stdout.count("denied") == 4, result
    assert "b'ping'" in result.stdout and result.status is Status.OK


def test_host_abstract_unix_sockets_unreachable(pool):
    import socket
    name = f"\0rlcode-test-{random.randint(10**6, 10**7)}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(name)
    listener.listen()
    try:
        result = _run(pool, f"""
            import socket
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect({name!r})
                print("CONNECTED")
            except OSError as e:
                print("refused", type(e).__name__)
        """)
    finally:
        listener.close()
    assert "refused" in result.stdout and "CONNECTED" not in result.stdout, result


def test_secrets_absent_from_environment(pool):
    result = _run(pool, """
        import os
        print(sorted(os.environ))
        try:
            pids = os.listdir("/proc")
        except OSError:  # Landlock at the process level: the host's /proc is not readable at all
            pids = []
        for pid in pids:
            try:
                print(open(f"/proc/{pid}/environ", "rb").read())
            except OSError:
                pass
    """)
    assert result.status is Status.OK
    for name, value in SECRETS.items():
        assert name not in result.stdout and value not in result.stdout
    assert "'HOME'" in result.stdout and "'PATH'" in result.stdout


def test_seccomp_and_uid(pool):
    result = _run(pool, """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print("unshare", libc.unshare(0x10000000))             # CLONE_NEWUSER
        print("ptrace", libc.ptrace(0, 0, None, None))           # PTRACE_TRACEME
        print("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
        try:
            os.setuid(0)
        except PermissionError:
            print("setuid denied")
        print("uid", os.getuid(), os.geteuid())
    """)
    assert "unshare -1" in result.stdout and "ptrace -1" in result.stdout and "mount -1" in result.stdout
    uid, euid = result.stdout.split("uid ")[-1].split()
    assert "setuid denied" in result.stdout and uid == euid and int(uid) in pool._uids.uids, result.stdout


def test_filesystem(pool):
    result = _run(pool, f"""
        import os
        def attempt(label, action):
            try:
                action()
                print(label, "ALLOWED")
            except OSError:
                print(label, "denied")
        attempt("read-root", lambda: open("/root/.bashrc").read())
        attempt("read-cache", lambda: os.listdir("/root/.cache"))
        attempt("write-usr", lambda: open("/usr/pwned", "w"))
        attempt("write-project", lambda: open("{REPO}/pwned", "w"))
        attempt("write-prefix", lambda: open(os.path.join(os.path.dirname(os.__file__), "pwned.py"), "w"))
        open("mine.txt", "w").write("fine")  # the private temp dir is ours
        print("cwd", os.getcwd(), open("mine.txt").read())
    """)
    assert "ALLOWED" not in result.stdout, result.stdout
    assert "fine" in result.stdout and result.status is Status.OK
    if pool.isolation.level == "bwrap":
        hidden = _run(pool, f"""
            import os
            for path in ["{REPO}", "/work", "/home", "/root/.bashrc", "/etc/passwd", "/sandbox-worker/worker_main.py"]:
                try:
                    open(path) if os.path.isfile(path) else os.listdir(path)
                    print(path, "VISIBLE")
                except OSError:
                    print(path, "hidden")
            try:
                open("/tmp/outside-my-dir", "w")
                print("tmp ALLOWED")
            except OSError:
                print("tmp denied")
        """)
        assert "VISIBLE" not in hidden.stdout and "ALLOWED" not in hidden.stdout, hidden.stdout


def test_child_cannot_reach_the_worker(pool):
    result = _run(pool, """
        import os, signal
        written = 0
        for fd in range(4, 1024):  # the worker's protocol pipes, if they leaked
            try:
                os.write(fd, b'{"op":"result","id":"forged","status":"ok"}\\n')
                written += 1
            except OSError:
                pass
        print("written", written)
        try:
            os.kill(-1, signal.SIGKILL)  # every process this uid can signal (none: alone in its namespace)
        except ProcessLookupError:
            pass
        print("survived")
    """)
    assert result.status is Status.OK and result.stdout == "written 0\nsurvived\n", result
    assert _run(pool, "print('worker fine')").stdout == "worker fine\n"


def test_temp_dir_is_private_and_deleted(pool):
    first = _run(pool, "import os; open('left.txt', 'w').write('x'); print(os.getcwd())")
    second = _run(pool, f"import os; print(os.path.exists({first.stdout.strip()!r} + '/left.txt'))")
    assert second.stdout.strip() == "False"


def test_fork_bomb_is_contained(pool):
    result = _run(pool, """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, timeout=2)
    assert result.status is Status.TIMEOUT
    assert _eventually_none(_sandbox_descendants) == []
    assert _run(pool, "print('alive')").stdout == "alive\n"


def test_memory_bomb(pool):
    # Touches every page up to the 1 GiB limit: slow on a loaded machine, hence the long timeout.
    result = _run(pool, "chunks = []\nwhile True:\n    chunks.append(bytearray(10 << 20))", timeout=30)
    assert result.status is Status.MEMORY and result.error_type == "MemoryError"


@pytest.mark.slow
def test_output_flood_is_capped_without_memory_growth(pool):
    """The parent drains a flood of stdout, stderr and probe lines without buffering it: the peak of
    everything Python allocated meanwhile (every thread: slots, completion) stays far below what was
    written. Traced allocations, not the process's RSS: in a long test session the RSS moved by 80 MB
    around this test for reasons of its own (allocator arenas of other threads), failing it at random."""
    import tracemalloc

    tracemalloc.start()
    result = _run(pool, """
        import os, sys
        junk = b"x" * 65536
        while True:
            sys.stdout.buffer.write(junk); sys.stderr.buffer.write(junk); os.write(3, b'{"i":0,"v":1}\\n' * 4096)
    """, timeout=2)
    assert result.status is Status.TIMEOUT
    assert result.stdout_truncated and result.stderr_truncated and result.probe_lines_truncated
    assert len(result.stdout) == 65536 and result.stdout_bytes > 10 * 65536
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 64 << 20, f"the parent held {peak >> 20} MiB while draining"
    for process in psutil.Process().children(recursive=True):
        assert process.memory_info().rss < 256 << 20  # the workers did not buffer the flood


def test_escaped_sleeper_killed_at_exit(pool):
    marker = f"{random.randint(10**6, 10**7)}.25"
    result = _run(pool, _escaping_sleeper(marker, "time.sleep(0.1)"))
    assert result.status is Status.OK and result.stdout == "spawned\n"
    assert _eventually_none(lambda: _with_marker(marker)) == []


def test_escaped_sleeper_killed_at_timeout(pool):
    marker = f"{random.randint(10**6, 10**7)}.5"
    result = _run(pool, _escaping_sleeper(marker, "time.sleep(60)"), timeout=4)
    assert result.status is Status.TIMEOUT and result.stdout == "spawned\n"
    assert _eventually_none(lambda: _with_marker(marker)) == []


@pytest.mark.slow
def test_escaped_sleeper_killed_without_pid_namespace():
    """The subreaper fallback (where per-execution PID namespaces are unavailable)."""
    with SandboxPool(workers=1, isolation="process") as pool:
        pool._launch.config["pid_namespace"] = False  # workers started from now on get this config
        pool._slots[0].worker.close()  # the adopted isolation-probe worker has PID namespaces
        marker = f"{random.randint(10**6, 10**7)}.75"
        result = _run(pool, _escaping_sleeper(marker, "pass"))
        assert result.stdout == "spawned\n"
        assert _eventually_none(lambda: _with_marker(marker)) == []
        result = _run(pool, _escaping_sleeper(marker, "time.sleep(60)"), timeout=4)
        assert result.status is Status.TIMEOUT and result.stdout == "spawned\n"
        assert _eventually_none(lambda: _with_marker(marker)) == []
        bomb = _run(pool, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                    timeout=2)
        assert bomb.status is Status.TIMEOUT
        assert _eventually_none(_sandbox_descendants) == []


PARENT_SCRIPT = """
import sys, time
from rlcode.sandbox import SandboxPool
pool = SandboxPool(workers=2, timeout=120, isolation=sys.argv[1])
for _ in range(2):
    pool.submit(sys.argv[2])
print(pool._staging, flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("level", LEVELS)
def test_parent_sigkill_leaves_nothing(level):
    marker = f"{random.randint(10**6, 10**7)}.125"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT, level,
                               _escaping_sleeper(marker, "time.sleep(120)")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while len(_with_marker(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_with_marker(marker)) == 2, "the sleepers never started"
        tree = psutil.Process(parent.pid).children(recursive=True)
        assert tree
        staging = parent.stdout.readline().decode().strip()
        assert os.path.isdir(staging)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
    finally:
        parent.kill()
    assert _eventually_none(lambda: _with_marker(marker), 10) == []

    def survivors():
        alive = []
        for process in tree:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.NoSuchProcess:
                pass
        return alive
    assert _eventually_none(survivors, 10) == []
    detect_isolation()  # the next pool start removes the files of a parent that was killed
    assert not os.path.exists(staging)
