"""Correct programs keep working inside the sandbox: threads, processes, C extensions, output."""

from __future__ import annotations

import textwrap

import pytest

from rlcode.sandbox import SandboxPool, Status


@pytest.fixture(scope="module", params=["bwrap", "process"])
def pool(request):
    with SandboxPool(workers=2, timeout=10.0, isolation=request.param) as p:
        yield p


def _run(pool, code: str, **kwargs):
    result = pool.submit(textwrap.dedent(code), **kwargs).result()
    return result


def test_threads(pool):
    result = _run(pool, """
        import threading
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(8) as ex:
            print(sum(ex.map(lambda x: x * x, range(100))))
        t = threading.Thread(target=lambda: print("joined at exit"))
        t.start()
    """)
    assert result.status is Status.OK, result.stderr
    assert result.stdout == "328350\njoined at exit\n"


def test_multiprocessing(pool):
    result = _run(pool, """
        import multiprocessing as mp
        def square(x):
            return x * x
        if __name__ == "__main__":
            with mp.Pool(2) as workers:
                print(workers.map(square, range(10)))
            q = mp.Queue()
            p = mp.Process(target=q.put, args=("from child",))
            p.start(); print(q.get()); p.join()
    """)
    assert result.status is Status.OK, result.stderr
    assert result.stdout == "[0, 1, 4, 9, 16, 25, 36, 49, 64, 81]\nfrom child\n"


def test_c_extension_modules(pool):
    result = _run(pool, """
        import cmath, array, _decimal, sqlite3, zlib, _bisect, _heapq, mmap, select, _json, _csv
        import _ssl, _hashlib, _ctypes, unicodedata, _datetime, _lzma, _bz2, _elementtree, readline
        db = sqlite3.connect(":memory:")
        db.execute("create table t (x)"); db.execute("insert into t values (41)")
        print(cmath.sqrt(-1), array.array("i", [1, 2]).tolist(), _decimal.Decimal("1.1") * 2,
              db.execute("select x + 1 from t").fetchone()[0], zlib.decompress(zlib.compress(b"ok")))
    """)
    assert result.status is Status.OK, result.stderr
    assert result.stdout == "1j [1, 2] 2.2 42 b'ok'\n"


def test_subprocess_python_is_allowed_and_confined(pool):
    # Decision: subprocesses (even another python) may run; they inherit every layer (uid, rlimits,
    # seccomp, namespaces) and die with the execution's tree.
    result = _run(pool, """
        import subprocess, sys
        out = subprocess.run([sys.executable, "-c", "import os, socket; print(os.getuid());"
                              "socket.socket(socket.AF_INET)"], capture_output=True, text=True)
        print(out.stdout.strip(), "PermissionError" in out.stderr)
    """)
    assert result.status is Status.OK, result.stderr
    uid, denied = result.stdout.split()
    assert int(uid) in pool._uids.uids and denied == "True", result.stdout  # its slot's own uid


def test_non_utf8_and_large_output(pool):
    result = _run(pool, """
        import sys
        sys.stdout.buffer.write(b"\\xff\\xfeok\\n")
        sys.stdout.flush()
        print("é" * 10000)
        print("line2", file=sys.stderr)
    """)
    assert result.status is Status.OK
    assert result.stdout.startswith("\ufffd\ufffdok\n") and result.stdout.count("é") == 10000
    assert result.stdout_bytes == 5 + 20001 and not result.stdout_truncated
    assert result.stderr == "line2\n"


def test_input_is_empty(pool):
    result = _run(pool, "import sys\nprint(repr(sys.stdin.read()))\ninput()")
    assert result.stdout == "''\n" and result.error_type == "EOFError"


def test_each_execution_starts_fresh(pool):
    first = _run(pool, "import json, random\njson.SENTINEL = 1\nprint(random.random())")
    second = _run(pool, "import json, random\nprint(hasattr(json, 'SENTINEL'))\nprint(random.random())")
    assert second.stdout.splitlines()[0] == "False"
    assert first.stdout.strip() != second.stdout.splitlines()[1]  # random is reseeded per child


def test_recursion_and_big_ints(pool):
    result = _run(pool, """
        import sys
        sys.setrecursionlimit(10000)
        def depth(n): return 0 if n == 0 else 1 + depth(n - 1)
        print(depth(5000), len(str(2 ** 10000)))
    """)
    assert result.status is Status.OK, result.stderr
    assert result.stdout == "5000 3011\n"
