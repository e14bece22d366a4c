"""An execution's temp dir is new or pristine every time, its root directory included.

The child owns the root of its temp dir, so it can set POSIX ACLs, extended attributes, inode flags
and timestamps on it. The dirty check compared the root's inode count, mode and owner only: a
default ACL survived into the next execution and made every file it created unreadable (an honest
temp-file sample failed right after it, and passed before and after), and times and xattrs carried
data from one execution to the next.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import textwrap

import pytest

from rlcode.sandbox import SandboxPool, Status
from rlcode.sandbox.inside import scratch
from unprivileged_user import run_as_user

ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
NO_ID = 0xFFFFFFFF


def acl_xattr(entries) -> bytes:
    """The kernel's POSIX ACL xattr format: version 2, then (tag, permissions, id) per entry."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


# Every file made under a default ACL whose entries grant nothing gets mode 000: unreadable by its owner.
DENY_ALL = acl_xattr([(ACL_USER_OBJ, 0, NO_ID), (ACL_GROUP_OBJ, 0, NO_ID), (ACL_OTHER, 0, NO_ID)])
# Not reducible to mode bits (a named user), so it is stored as an xattr; its mask and other entries
# grant nothing, so the root's mode stays 0700 and a check of the mode alone does not see it.
EXTENDED = acl_xattr([(ACL_USER_OBJ, 7, NO_ID), (ACL_USER, 0, 4242), (ACL_GROUP_OBJ, 0, NO_ID),
                      (ACL_MASK, 0, NO_ID), (ACL_OTHER, 0, NO_ID)])
PLANT = textwrap.dedent(f"""
    import json, os
    made = {{}}
    for name, value in (("system.posix_acl_access", {EXTENDED!r}), ("system.posix_acl_default", {DENY_ALL!r})):
        try:
            os.setxattr(".", name, value)
            made[name] = True
        except OSError as e:
            made[name] = e.strerror
    os.utime(".", (1234567, 7654321))
    print(json.dumps(made))
""")
# An honest temp-file sample that also reports what it sees on its temp dir's root.
HONEST = textwrap.dedent("""
    import json, os, tempfile
    root = tempfile.gettempdir()
    st = os.stat(root)
    path = os.path.join(root, "honest.txt")
    with open(path, "w") as f:
        f.write("hello")
    with open(path) as f:
        read_back = f.read()
    print(json.dumps({"xattrs": sorted(os.listxattr(root)), "times": [st.st_atime, st.st_mtime],
                      "read_back": read_back}))
""")


@pytest.mark.parametrize("level", ["bwrap", "process"])
def test_acls_xattrs_and_times_set_on_the_temp_dir_do_not_reach_the_next_execution(level):
    """Guards the root's whole state: after a sample set a deny-all default ACL, an extended access
    ACL and odd times on its temp dir (none of which moves its mode, owner or inode count; tmpfs
    charges user xattrs to its inode count, which the old check saw), an honest temp-file sample on
    the same worker still reads its own file back and sees none of it."""
    with SandboxPool(workers=1, timeout=20.0, isolation=level) as pool:
        before = pool.submit(HONEST).result()
        planted = pool.submit(PLANT).result()
        after = pool.submit(HONEST).result()
    assert planted.status is Status.OK, planted.stderr
    made = json.loads(planted.stdout)
    assert made["system.posix_acl_default"] is True and made["system.posix_acl_access"] is True, made
    for result in (before, after):
        assert result.status is Status.OK, result.stderr
        seen = json.loads(result.stdout)
        assert seen["read_back"] == "hello" and seen["xattrs"] == [], seen
        assert 1234567 not in seen["times"] and 7654321 not in seen["times"], seen


# Run by an unprivileged user (bwrap-userns: the temp dir and /dev/shm are plain directories, emptied
# and restored, not replaced): the three executions above, plus one using /dev/shm, on one worker.
RUNNER = textwrap.dedent("""
    import json, sys
    from rlcode.sandbox import SandboxPool
    codes = json.loads(sys.argv[1])
    with SandboxPool(workers=1, timeout=20.0, isolation="bwrap-userns") as pool:
        results, workers = [], []
        for code in codes:
            results.append(pool.submit(code).result())
            workers.append(pool._slots[0].worker.pid)
        print(json.dumps({"results": [[r.status.value, r.stdout, r.stderr[-500:]] for r in results],
                          "workers": workers, "retiring": pool._slots[0].worker.retiring,
                          "mounted": pool.isolation.layers["tmpfs_per_execution"]}))
""")
SHM = "open('/dev/shm/x', 'w').write('x'); import os; print(os.listdir('/dev/shm'))"


def test_the_unmounted_temp_dir_root_is_restored_between_executions():
    """Guards the plain-directory path (no mounts, the child of the worker's uid): the ACL planter
    leaves nothing for the honest sample after it, and /dev/shm (which the worker may not own) is
    emptied. Every execution that makes a file moves its tmpfs's inode counter and is followed by a
    fresh worker (scratch.py); the planter makes none (xattrs and times only), so the honest sample
    after it runs on the planter's worker, whose root was restored."""
    if os.geteuid() != 0 or not shutil.which("bwrap"):
        pytest.skip("runs bwrap-userns as an unprivileged test user (needs root here, and bubblewrap)")
    done = run_as_user(RUNNER, json.dumps([HONEST, PLANT, HONEST, SHM, SHM, HONEST]), home="/nonexistent",
                       path=os.environ.get("PATH", "/usr/bin:/bin"))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    statuses = [status for status, _, _ in report["results"]]
    assert statuses == ["ok"] * 6, report
    assert not report["mounted"] and report["retiring"], report
    workers = report["workers"]
    assert workers[1] == workers[2] and len(set(workers)) == 5, report
    made = json.loads(report["results"][1][1])
    assert made["system.posix_acl_default"] is True, made
    for _, stdout, _ in (report["results"][i] for i in (0, 2, 5)):
        seen = json.loads(stdout)
        assert seen["read_back"] == "hello" and seen["xattrs"] == [], seen
        assert 1234567 not in seen["times"] and 7654321 not in seen["times"], seen
    assert [stdout for _, stdout, _ in report["results"][3:5]] == ["['x']\n"] * 2


def test_a_plain_scratch_root_is_put_back_as_made(tmp_path):
    """Guards the unmounted scratch dir (non-root workers): whatever a same-uid child set on its
    root (ACLs, xattrs, mode, times) is removed or restored by the reset, which reports success."""
    directory = scratch.ScratchDir(str(tmp_path / "work"), mode=0o700, owner=None, mount=False,
                                   size_bytes=1 << 20, inodes=64)
    made = directory.pristine
    root = directory.path
    open(os.path.join(root, "left.txt"), "w").write("x")
    set_names = []
    for name, value in (("system.posix_acl_default", DENY_ALL), ("system.posix_acl_access", EXTENDED),
                        ("user.leak", b"x" * 100)):
        try:
            os.setxattr(root, name, value)
            set_names.append(name)
        except OSError:
            pass  # a filesystem without ACLs or user xattrs: nothing a child could set there either
    os.chmod(root, 0o755)
    os.utime(root, (1234567, 7654321))
    assert scratch.root_state(root, with_ctime=False) != made
    assert directory.reset() and directory.path == root
    assert scratch.root_state(root, with_ctime=False) == made, set_names  # before listing moves atime
    assert os.listdir(root) == [] and os.listxattr(root) == []
