"""Deleting a scratch tree never leaves its root: a property test over trees a hostile child can build.

Where the workers cannot mount, a scratch directory is emptied by ``clear_directory``'s fd-relative
walk, and ``remove_staging`` deletes a pool's staging tree the same way, both as root where the pool
runs as root. A development version of that walk once climbed above its root and deleted a
machine's /tmp and /etc. So each case here builds a random tree of what a hostile child can make
(deep chains past PATH_MAX, wide directories, symlinks and hard links to what lies outside, fifos,
sockets, device nodes, unreadable and immutable entries, long and odd names), beside sentinels at
every level around it, and deletes it while a seeded adversary acts before every call the walk makes
(renaming directories the walk is in or about to enter, swapping a directory for a symlink to
outside, adding entries, locking entries). Each case checks that every unlink, rmdir and chmod the
walk makes lands inside the root (each directory it mutates is walked up to the root by inode), that
everything outside the root is exactly as before, and that a walk that reports success left the root
empty.

Safety: the cases run only inside bubblewrap, in a mount namespace where the whole host filesystem is
read-only and the only writable place is a fresh tmpfs holding the trees and the sentinels: a bug here
can at worst empty that tmpfs. The test re-executes this file there (``--inside``); nothing deletes
anything outside it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import shutil
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcode.sandbox import launch
from rlcode.sandbox.inside import scratch

REPO = Path(__file__).resolve().parents[1]
CASES = 120
FS_IOC_SETFLAGS, FS_IMMUTABLE_FL, FS_APPEND_FL = 0x40086602, 0x10, 0x20
OTHER_UID = 2_000_000_123  # the hostile child's uid: owns some entries
DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@pytest.mark.slow
def test_deletion_never_leaves_its_root(tmp_path):
    """Guards clear_directory and remove_staging as root: in CASES random hostile trees, with an
    adversary acting before each of the walk's calls, no mutation lands outside the root, everything
    outside it is unchanged, and success means the root is empty (or gone)."""
    if os.geteuid() != 0 or shutil.which("bwrap") is None:
        pytest.skip("needs root and bubblewrap: the cases run only where the host is mounted read-only")
    world = tmp_path / "world"
    world.mkdir()
    command = ["bwrap", "--ro-bind", "/", "/", "--tmpfs", str(world), "--dev", "/dev", "--proc", "/proc",
               "--unshare-pid", "--die-with-parent", "--setenv", "PYTHONPATH", str(REPO), "--setenv", "TMPDIR", str(world),
               sys.executable, __file__, "--inside", str(world), str(CASES)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["violations"] == [] and report["cases"] == CASES
    # The property was exercised, not vacuous: both outcomes, deep trees, and an active adversary.
    assert report["emptied"] >= CASES // 5 and report["refused"] >= 1
    assert report["max_depth"] > 1300 and report["adversary_actions"] > 500
    assert report["links_swapped_in"] > 100 and report["directories_moved"] > 100
    assert os.listdir(world) == []  # the tmpfs went with the namespace; the host saw nothing


# -- inside the namespace ---------------------------------------------------------------------------

def _inside(world: str, cases: int) -> None:
    with open("/proc/self/mountinfo") as mounts:  # refuse to run anywhere but a tmpfs mounted here
        assert any(line.split()[4] == world and " - tmpfs " in line for line in mounts), "not in the namespace"
    report = {"cases": 0, "emptied": 0, "refused": 0, "max_depth": 0, "adversary_actions": 0,
              "links_swapped_in": 0, "directories_moved": 0, "violations": []}
    for seed in range(cases):
        rng, started = random.Random(seed), time.monotonic()
        case = f"{world}/case-{seed}"
        outside = _build_outside(case)
        root = f"{case}/outer/root"
        os.mkdir(root, 0o700)
        # Immutable entries make the walk fail (it may take its whole time budget): a few cases, with
        # clear_directory's deadline of a few seconds, not remove_staging's minute.
        immutable = seed % 3 != 2 and rng.random() < 0.2
        depth = _build_tree(root, rng, outside, immutable)
        report["max_depth"] = max(report["max_depth"], depth)
        before = _snapshot(case, skip=root)
        adversary = _Adversary(rng, root, outside, intensity=rng.choice([0.0, 0.0, 0.02, 0.1, 0.3]))
        scratch_os = scratch.os
        scratch.os = _Watched(adversary)
        try:
            if seed % 3 == 2:
                done = launch.remove_staging(root)
                left = os.path.lexists(root) and os.listdir(root)
                empty_if_done = not os.path.lexists(root)
            else:
                done = scratch.clear_directory(root, time.monotonic() + 5.0)
                left = os.listdir(root)
                empty_if_done = left == []
        finally:
            scratch.os = scratch_os
            adversary.close()
        after = _snapshot(case, skip=root)
        report["cases"] += 1
        report["emptied" if done else "refused"] += 1
        report["adversary_actions"] += adversary.actions
        report["links_swapped_in"] += adversary.swapped
        report["directories_moved"] += adversary.moved
        problems = list(adversary.violations)
        if before != after:
            changed = sorted(set(before.items()) ^ set(after.items()))[:6]
            problems.append(f"outside the root changed: {changed}")
        if done and not empty_if_done:
            problems.append(f"reported success but left {str(left)[:200]}")
        report["violations"] += [f"case {seed}: {p}" for p in problems]
        print(f"case {seed}: depth {depth}, {'emptied' if done else 'refused'}, {adversary.actions} actions, "
              f"{time.monotonic() - started:.1f}s", file=sys.stderr)
        # The case's tree stays: the tmpfs goes with the namespace.
    print(json.dumps(report))


def _build_outside(case: str) -> list[str]:
    """Sentinels at every level around the root: above it, beside it, and far from it."""
    for directory in (case, f"{case}/outer", f"{case}/outer/sibling", f"{case}/outer/sibling/sub",
                      f"{case}/far", f"{case}/far/locked"):
        os.mkdir(directory, 0o755)
    for path, text in ((f"{case}/keep", "top"), (f"{case}/outer/keep", "above the root"),
                       (f"{case}/outer/sibling/file", "beside the root"), (f"{case}/far/file", "far")):
        Path(path).write_text(text)
    os.chmod(f"{case}/far/locked", 0o500)
    return [f"{case}/outer", f"{case}/outer/sibling", f"{case}/outer/sibling/sub", f"{case}/far",
            f"{case}/far/locked", f"{case}/outer/keep", f"{case}/far/file", f"{case}/outer/sibling/file", case]


def _build_tree(root: str, rng: random.Random, outside: list[str], immutable: bool) -> int:
    """A random tree of what a hostile child can make (and, with ``immutable``, entries only root can
    make: immutable or append-only); returns its depth."""
    top = os.open(root, DIRECTORY)
    directories = [os.dup(top)]
    depth = 0
    try:
        for _ in range(rng.randint(20, 120)):
            _add_entry(rng.choice(directories), rng, outside, directories)
        if rng.random() < 0.6:  # a chain deeper than PATH_MAX or the recursion limit
            chain, current = rng.randint(300, 1500), os.dup(rng.choice(directories))
            name = rng.choice(["dd", "d" * 255, "x"])
            for level in range(chain):
                os.mkdir(name, dir_fd=current)
                below = os.open(name, DIRECTORY, dir_fd=current)
                if rng.random() < 0.02:
                    _add_entry(below, rng, outside, directories)
                os.close(current)
                current = below
            depth = max(depth, chain)
            _add_entry(current, rng, outside, directories)
            directories.append(current)
        if rng.random() < 0.4:  # wide
            wide = rng.choice(directories)
            for i in range(rng.randint(500, 3000)):
                os.close(os.open(f"w{i}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=wide))
        for fd in rng.sample(directories, min(len(directories), 4)):  # unreadable entries
            _lock_some(fd, rng, flags=immutable)
    finally:
        for fd in directories:
            os.close(fd)
        os.close(top)
    return depth


def _add_entry(fd: int, rng: random.Random, outside: list[str], directories: list[int],
               hard_links: bool = True) -> None:
    """One random entry in directory ``fd``. ``hard_links``: may link to a sentinel file (the tree is
    built before the sentinels are recorded: a link's owner change is the sentinel's too)."""
    name = rng.choice(["a", "b", "c", "..x", " ", "new\nline", "l" * 250, "-", "é"]) + str(rng.randint(0, 99))
    kinds = ["file", "dir", "dir", "symlink", "symlink", "fifo", "socket", "device"] + ["hardlink"] * hard_links
    kind = rng.choice(kinds)
    name = name[:100] if kind == "socket" else name  # a socket's address is at most 107 bytes
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
        return  # the name is taken
    except FileNotFoundError:
        pass
    try:
        if kind == "file":
            with open(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd), "w") as f:
                f.write("x" * rng.randint(0, 100))
        elif kind == "dir":
            os.mkdir(name, rng.choice([0o755, 0o700, 0o000, 0o1777, 0o500]) | 0o700, dir_fd=fd)
            if rng.random() < 0.5:
                directories.append(os.open(name, DIRECTORY, dir_fd=fd))
        elif kind == "symlink":
            target = rng.choice(outside + ["/", "..", "../..", "../../..", "/etc", "nowhere", name])
            os.symlink(target, name, dir_fd=fd)
        elif kind == "hardlink":
            os.link(rng.choice([p for p in outside if os.path.isfile(p)]), name, dst_dir_fd=fd)
        elif kind == "fifo":
            os.mkfifo(name, dir_fd=fd)
        elif kind == "device":
            os.mknod(name, 0o666 | stat.S_IFCHR, os.makedev(1, 3), dir_fd=fd)
        else:
            here = os.open(".", DIRECTORY)
            try:
                os.fchdir(fd)
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.bind(name)
            finally:
                os.fchdir(here)
                os.close(here)
        if rng.random() < 0.2 and kind != "hardlink":
            os.chown(name, OTHER_UID, OTHER_UID, dir_fd=fd, follow_symlinks=False)
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.EADDRINUSE, errno.EACCES):  # taken (EACCES: by another
            # uid, in a sticky directory)
            raise


def _lock_some(fd: int, rng: random.Random, flags: bool = False) -> None:
    """Make an entry unreadable, or immutable / append-only (the walk may then refuse, never escape)."""
    names = os.listdir(fd)
    if not names:
        return
    name = rng.choice(names)
    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    mode = info.st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)) or (stat.S_ISREG(mode) and info.st_nlink > 1):
        return  # only what is the tree's own (a hard link's inode is a sentinel's too)
    if not flags or rng.random() < 0.5:
        os.chmod(name, rng.choice([0, 0o500, 0o100]), dir_fd=fd)
        return
    entry = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    try:
        fcntl.ioctl(entry, FS_IOC_SETFLAGS, struct.pack("i", rng.choice([FS_IMMUTABLE_FL, FS_APPEND_FL])))
    finally:
        os.close(entry)


def _snapshot(top: str, skip: str) -> dict:
    """Everything under ``top`` but ``skip``: type, mode, owner, size and content or link target."""
    seen = {}
    for directory, subdirectories, files in os.walk(top):
        subdirectories[:] = [d for d in subdirectories if os.path.join(directory, d) != skip]
        for name in subdirectories + files + ["."]:
            path = os.path.normpath(os.path.join(directory, name))
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                content = Path(path).read_bytes() if info.st_mode & 0o444 else "unreadable"
            elif stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            else:
                content = None  # a directory's size counts its entries: the root's removal changes it
            size = None if stat.S_ISDIR(info.st_mode) else info.st_size
            seen[path] = (info.st_mode, info.st_uid, info.st_gid, size, content)
    return seen


class _Adversary:
    """A hostile child's concurrent process, scheduled at the worst moments: before each call the walk
    makes. It acts only through directories inside the root (the walk's own directory fds and ones it
    opened while the tree was built), as the child could."""

    def __init__(self, rng: random.Random, root: str, outside: list[str], intensity: float):
        self.rng, self.root, self.outside, self.intensity = rng, root, outside, intensity
        self.root_id = _identity(os.stat(root))
        self.stash = os.open(root, DIRECTORY)
        self.actions = self.swapped = self.moved = 0
        self.violations: list[str] = []
        self.inside: set[tuple[int, int]] = {self.root_id}  # directories verified to be under the root

    def close(self) -> None:
        os.close(self.stash)

    def before(self, call: str, name, dir_fd) -> None:
        if self.rng.random() >= self.intensity or dir_fd is None:
            return
        self.actions += 1
        action = self.rng.choice(["swap", "swap", "move_here", "move_up", "add", "lock"])
        try:
            if action == "swap" and isinstance(name, str) and name not in (".", ".."):
                # The entry the walk is about to use becomes a symlink to outside (the real one moves
                # elsewhere inside the root).
                os.rename(name, f".stash-{self.rng.randrange(1 << 30)}", src_dir_fd=dir_fd, dst_dir_fd=self.stash)
                os.symlink(self.rng.choice(self.outside), name, dir_fd=dir_fd)
                self.swapped += 1
                self.inside = {self.root_id}  # moves may have changed what lies below it
            elif action == "move_here":  # a subdirectory of where the walk is moves into the root's top
                subdirectories = [e.name for e in os.scandir(dir_fd) if e.is_dir(follow_symlinks=False)]
                if subdirectories:
                    os.rename(self.rng.choice(subdirectories), f".moved-{self.rng.randrange(1 << 30)}",
                              src_dir_fd=dir_fd, dst_dir_fd=self.stash)
                    self.moved += 1
                    self.inside = {self.root_id}  # moves may have changed what lies below it
            elif action == "move_up":  # the directory the walk is in moves (it climbs back elsewhere)
                parent = os.open("..", DIRECTORY, dir_fd=dir_fd)
                try:
                    own = _identity(os.fstat(dir_fd))
                    for entry in os.scandir(parent):
                        if entry.is_dir(follow_symlinks=False) and _identity(entry.stat(follow_symlinks=False)) == own:
                            if _identity(os.fstat(parent)) != self.root_id or self.rng.random() < 0.5:
                                os.rename(entry.name, f".up-{self.rng.randrange(1 << 30)}", src_dir_fd=parent,
                                          dst_dir_fd=self.stash)
                                self.moved += 1
                                self.inside = {self.root_id}  # moves may have changed what lies below it
                            break
                finally:
                    os.close(parent)
            elif action == "add":
                _add_entry(dir_fd, self.rng, self.outside, [], hard_links=False)
            elif action == "lock":
                _lock_some(dir_fd, self.rng)
        except OSError:
            pass  # the entry went away meanwhile, or the adversary lacks the right: as the child would

    def check(self, call: str, name, dir_fd) -> None:
        """The mutation about to happen lands inside the root."""
        if dir_fd is None:  # only a chmod through an fd the walk holds (/proc/self/fd/N) is expected
            if not (call == "chmod" and isinstance(name, str) and name.startswith("/proc/self/fd/")):
                self.violations.append(f"{call}({name!r}) by path")
                return
            dir_fd, name = int(name.rsplit("/", 1)[1]), None
        try:
            inside = self._is_inside(dir_fd)
        except FileNotFoundError:  # a directory already removed holds nothing to mutate
            inside = True
        if not inside:
            self.violations.append(f"{call}({name!r}) in a directory outside the root: {_where(dir_fd)}")
        if call == "chmod" and name is not None and os.path.islink(os.path.join(f"/proc/self/fd/{dir_fd}", name)):
            target = os.readlink(os.path.join(f"/proc/self/fd/{dir_fd}", name))
            self.violations.append(f"chmod({name!r}) follows a symlink to {target!r}")

    def _is_inside(self, dir_fd: int) -> bool:
        current, opened, chain = dir_fd, [], []
        try:
            for _ in range(100_000):
                here = _identity(os.fstat(current))
                if here in self.inside:
                    self.inside.update(chain)
                    return True
                chain.append(here)
                parent = os.open("..", DIRECTORY, dir_fd=current)
                opened.append(parent)
                if _identity(os.fstat(parent)) == here:  # the filesystem's top: never met the root
                    return False
                current = parent
            return False
        finally:
            for fd in opened:
                os.close(fd)


def _where(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")[-300:]
    except OSError as e:
        return f"unknown ({e.strerror})"


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


class _Watched:
    """``os`` as the deletion code sees it: the adversary acts before each call, and each mutation is
    checked to land inside the root."""

    MUTATIONS = ("unlink", "rmdir", "chmod", "remove")

    def __init__(self, adversary: _Adversary):
        self._adversary = adversary

    def __getattr__(self, name):
        real = getattr(os, name)
        if name not in self.MUTATIONS + ("open", "scandir"):
            return real
        adversary = self._adversary

        def call(*args, **kwargs):
            target = args[0] if args else None
            dir_fd = kwargs.get("dir_fd")
            if name == "scandir" and isinstance(target, int):
                target, dir_fd = ".", target
            adversary.before(name, target, dir_fd)
            if name in self.MUTATIONS:
                adversary.check(name, target, dir_fd)
            return real(*args, **kwargs)
        return call


if __name__ == "__main__" and sys.argv[1:2] == ["--inside"]:
    try:
        _inside(sys.argv[2], int(sys.argv[3]))
    except OSError as e:
        if e.errno == errno.EROFS:
            print(f"a write reached the read-only host: {e}", file=sys.stderr)
        raise
