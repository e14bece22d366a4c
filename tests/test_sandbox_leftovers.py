"""Nothing survives from one execution to the next on the same worker.

A planting execution leaves what it can (SysV shared memory and message queues, files in its cwd,
home, temp dir and /dev/shm, a directory chain deeper than PATH_MAX and one deeper than Python's
recursion limit, a locked directory); the next execution on the same worker probes for all of it.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from rlcode.sandbox import SandboxPool, Status
from rlcode.sandbox.inside import scratch

PLANT = textwrap.dedent("""
    import ctypes, json, os, tempfile
    libc = ctypes.CDLL(None, use_errno=True)
    made = {"shm": libc.shmget(0x5EED, 1 << 20, 0o1666), "msg": libc.msgget(0x5EED, 0o1666)}
    for path in (os.getcwd() + "/cwd-plant", os.environ["HOME"] + "/home-plant",
                 tempfile.gettempdir() + "/tmp-plant", "/dev/shm/shm-plant"):
        try:
            open(path, "w").write("planted")
            made[path] = True
        except OSError:
            made[path] = False
    top = os.getcwd()
    for _ in range(30):  # 30 x 200 characters: past PATH_MAX (4096)
        os.mkdir("d" * 200)
        os.chdir("d" * 200)
    open("deep-plant", "w").write("planted")
    os.chdir(top)
    for _ in range(3000):  # past the recursion limit of a recursive delete
        os.mkdir("e")
        os.chdir("e")
    os.chdir(top)
    os.mkdir("locked")
    open("locked/inside", "w").write("planted")
    os.chmod("locked", 0)
    print(json.dumps(made))
""")

PROBE = textwrap.dedent("""
    import ctypes, json, os, tempfile
    libc = ctypes.CDLL(None, use_errno=True)
    seen = {"shm": libc.shmget(0x5EED, 0, 0), "msg": libc.msgget(0x5EED, 0, 0), "files": []}
    cwd = os.getcwd()
    for folder in {cwd, os.path.dirname(cwd), os.environ["HOME"], tempfile.gettempdir(), "/dev/shm"}:
        try:
            seen["files"] += [folder + "/" + name for name in os.listdir(folder)
                              if name != os.path.basename(cwd)]
        except OSError:
            pass  # not even listable: nothing seen there
    for kind in ("shm", "msg", "sem"):
        try:
            seen[kind + "_objects"] = len(open("/proc/sysvipc/" + kind).read().splitlines()) - 1
        except OSError:
            seen[kind + "_objects"] = 0
    print(json.dumps(seen))
""")


@pytest.mark.parametrize("level", ["bwrap", "process"])
def test_a_probing_execution_sees_nothing_a_planting_one_left(level):
    """Guards per-execution scratch dirs and IPC: every planted object is gone (or was never made)."""
    with SandboxPool(workers=1, timeout=20.0, isolation=level) as pool:
        planted = pool.submit(PLANT).result()
        assert planted.status is Status.OK, planted.stderr
        made = json.loads(planted.stdout)
        assert made["shm"] == -1 and made["msg"] == -1  # SysV IPC cannot even be created
        assert sum(ok for path, ok in made.items() if path.startswith("/")) == 4, made  # all four planted
        probed = pool.submit(PROBE).result()
        worker_pids = {pool._slots[0].worker.pid}
    assert probed.status is Status.OK, probed.stderr
    seen = json.loads(probed.stdout)
    assert seen == {"shm": -1, "msg": -1, "files": [], "shm_objects": 0, "msg_objects": 0,
                    "sem_objects": 0}, seen
    assert len(worker_pids) == 1


@pytest.mark.slow
def test_fd_relative_clearing_survives_path_max_and_recursion_depth(tmp_path):
    """Guards the no-mount cleanup (non-root levels): trees deeper than PATH_MAX or the recursion
    limit, and locked directories, are removed entirely, and nothing above the directory is touched
    (a first version climbed past it through ``..`` and emptied the host's /tmp and /etc)."""
    root = tmp_path / "work"
    root.mkdir()
    (tmp_path / "sibling").write_text("must survive")  # the walk must never climb above `root`
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for name, depth in (("d" * 200, 30), ("e", 3000)):
        current = os.dup(fd)
        for _ in range(depth):
            os.mkdir(name, dir_fd=current)
            below = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
            os.close(current)
            current = below
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, dir_fd=current))
        os.close(current)
    (root / "locked").mkdir()
    (root / "locked" / "inside").write_text("x")
    (root / "locked").chmod(0)
    os.close(fd)
    assert scratch.clear_directory(str(root), deadline=float("inf"))
    assert os.listdir(root) == []
    assert sorted(os.listdir(tmp_path)) == ["sibling", "work"]


def test_a_scratch_dir_that_cannot_be_emptied_is_replaced_and_reported(tmp_path, monkeypatch):
    """Guards the recycle path: past its time budget, reset() reports failure and hands the next
    execution a new empty directory instead of the dirty one."""
    directory = scratch.ScratchDir(str(tmp_path / "work"), mode=0o700, owner=None, mount=False,
                                   size_bytes=1 << 20, inodes=64)
    (tmp_path / "work" / "left").write_text("x")
    monkeypatch.setattr(scratch, "CLEAR_BUDGET_S", -1.0)
    old = directory.path
    assert directory.reset() is False
    assert directory.path != old and os.listdir(directory.path) == [] and directory.generation == 1


def test_a_worker_whose_scratch_cannot_be_emptied_is_recycled():
    """Guards the slot side: a result flagged `recycle` retires its worker."""
    with SandboxPool(workers=1) as pool:
        assert pool.submit("pass").result().status is Status.OK
        slot = pool._slots[0]
        first = slot.worker
        first.retiring = True  # what a {"recycle": true} result sets
        assert pool.submit("pass").result().status is Status.OK
        assert slot.worker is not first


def _deep_tree(top: str, depth: int) -> None:
    """A chain of ``depth`` directories under ``top``, each a name long, with a file at the bottom."""
    flags = os.O_RDONLY | os.O_DIRECTORY
    fd = os.open(top, flags)
    for _ in range(depth):
        os.mkdir("e" * 100, dir_fd=fd)
        below = os.open("e" * 100, flags, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    os.close(fd)


def test_closing_a_pool_deletes_a_staging_tree_too_deep_for_rmtree():
    """What a killed worker leaves in the staging dir can be a tree deeper than PATH_MAX and than
    Python's recursion limit: ``shutil.rmtree(ignore_errors=True)`` raised RecursionError out of
    ``close()`` there. The fd-relative walk deletes it and only it."""
    pool = SandboxPool(workers=1, isolation="process")
    staging = pool._staging
    _deep_tree(staging, 3000)
    assert pool.submit("print(1)").result().stdout.strip() == "1"
    pool.close()
    assert not os.path.lexists(staging)
    assert os.path.isdir(os.path.dirname(staging))  # its parent (the temp dir) is still there
