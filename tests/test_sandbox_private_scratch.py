"""Concurrent executions on different workers share no scratch directory: nothing is shared
between executions, and a prober sees nothing.

A holder writes into its cwd and temp dir and holds; meanwhile a prober on the other worker writes
its own file, lists its cwd and temp dir, and holds past the holder's end (so past the holder's
cleanup), then looks for its file again. As another user without bubblewrap the workers once shared
one temp dir: the prober saw the holder's files, and the holder's cleanup deleted the prober's.
Root and bwrap-userns workers each have a mount of their own; they are tested here so they stay so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlcode.sandbox import SandboxPool, Status
from rlcode.sandbox.inside import scratch
from unprivileged_user import REPO, run_as_user

HOLDER = textwrap.dedent("""
    import json, os, tempfile, time
    here = {os.getcwd(), tempfile.gettempdir()}
    for folder in here:
        open(os.path.join(folder, "holder-file"), "w").write("x")
    written = time.monotonic()
    time.sleep(1.5)
    print(json.dumps({"dirs": sorted(here), "written": written,
                      "seen": sorted({name for folder in here for name in os.listdir(folder)})}))
""")
PROBER = textwrap.dedent("""
    import json, os, tempfile, time
    here = {os.getcwd(), tempfile.gettempdir()}
    for folder in here:
        open(os.path.join(folder, "prober-file"), "w").write("x")
    listed = time.monotonic()
    seen = sorted({name for folder in here for name in os.listdir(folder)})
    time.sleep(4.0)  # the holder ends and its worker cleans up meanwhile
    print(json.dumps({"dirs": sorted(here), "listed": listed, "seen": seen, "checked": time.monotonic(),
                      "kept": sorted({name for folder in here for name in os.listdir(folder)})}))
""")
# Runs in the pool's process (as root, or as the test user): the holder first, the prober once the
# holder runs; the moment the holder's future resolves (after its worker's cleanup) is recorded.
RUNNER = textwrap.dedent("""
    import json, sys, time
    from rlcode.sandbox import SandboxPool
    holder_code, prober_code, level = sys.argv[1:4]
    with SandboxPool(workers=2, timeout=30.0, isolation=level) as pool:
        holder = pool.submit(holder_code)
        resolved = []
        holder.add_done_callback(lambda _: resolved.append(time.monotonic()))
        while not pool.count()["running"]:
            time.sleep(0.01)
        time.sleep(0.3)  # the holder's child is forked and has written its files
        prober = pool.submit(prober_code)
        results = [holder.result(), prober.result()]
        print(json.dumps({"level": pool.isolation.level, "holder_resolved": resolved[0],
                          "results": [{"status": r.status.value, "stdout": r.stdout, "stderr": r.stderr}
                                      for r in results]}))
""")


@pytest.mark.parametrize("level, as_root", [("bwrap", True), ("process", True),
                                            ("bwrap-userns", False), ("process", False)])
def test_a_concurrent_execution_neither_sees_nor_loses_files_to_another(level, as_root):
    if os.geteuid() != 0:
        pytest.skip("runs as root and as an unprivileged test user")
    if level.startswith("bwrap") and not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed")
    args = (RUNNER, HOLDER, PROBER, level)
    if as_root:
        done = run_here(*args)
    else:  # PATH: where bwrap is; the level is forced either way
        done = run_as_user(*args, home="/nonexistent", path=os.environ.get("PATH", "/usr/bin:/bin"))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["level"] == level
    results = report["results"]
    assert [r["status"] for r in results] == ["ok", "ok"], results
    holder, prober = (json.loads(r["stdout"]) for r in results)
    # The test means something only if the two overlapped as planned (else it is too slow here).
    assert holder["written"] < prober["listed"], "the prober looked before the holder wrote"
    assert report["holder_resolved"] < prober["checked"], "the prober checked before the holder's cleanup"
    assert prober["seen"] == ["prober-file"], f"the prober saw another execution's files: {prober}"
    assert holder["seen"] == ["holder-file"], f"the holder saw another execution's files: {holder}"
    assert prober["kept"] == ["prober-file"], f"another execution's cleanup deleted the prober's files: {prober}"


def run_here(*args: str) -> subprocess.CompletedProcess:
    """The runner as root, in a process of its own like the test user's (it imports this checkout)."""
    return subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_workers_sharing_a_temp_root_get_directories_of_their_own(tmp_path):
    """Guards the layout without mounts (the process level as another user), at any uid: two
    workers' scratch dirs under one temp root are distinct and not nested, and one's reset leaves
    the other's files alone."""
    first, second = (scratch.WorkerScratch(str(tmp_path), owner=None, mount=False, private_shm=False,
                                           size_bytes=1 << 20, inodes=64) for _ in range(2))
    paths = [first.workdir.path, second.workdir.path]
    assert len(set(paths)) == 2 and all(os.path.dirname(p) == str(tmp_path) for p in paths), paths
    (Path(paths[0]) / "left").write_text("x")
    (Path(paths[1]) / "kept").write_text("x")
    first.reset()
    assert os.listdir(paths[0]) == [] and os.listdir(paths[1]) == ["kept"]
    first.close()
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(paths[1])]


def test_a_retired_worker_leaves_no_temp_dir_behind():
    """Guards the worker's exit: a recycled worker removes its (emptied) temp dir, so a long run
    does not pile up one directory per worker in the pool's staging dir."""
    with SandboxPool(workers=1, isolation="process", recycle_after=1) as pool:
        seen = []
        for _ in range(3):
            result = pool.submit("import os; open('left', 'w').write('x'); print(os.getcwd())").result()
            assert result.status is Status.OK, result.stderr
            seen.append(os.listdir(Path(pool._staging) / "tmp"))
    assert all(len(names) == 1 for names in seen) and len({names[0] for names in seen}) == 3, seen
