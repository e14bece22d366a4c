"""An execution's writable directories (its temp dir, and /dev/shm when private), emptied between
executions so that nothing one execution leaves is seen by the next, and the Landlock ruleset that
lets a child write there and nowhere else. Standalone stdlib code (runs in the worker, see
worker_main.py).

The temp dir is a new directory of the worker's own, never a fixed path under the pool's shared temp
root: without bubblewrap or a mount of its own (the process level as another user) all of a pool's
workers see the same filesystem, and a fixed path let one execution see a concurrent one's files and
one worker's cleanup delete another's mid-run.

Where the worker may mount (root in its own mount namespace: bwrap, or the process level as root),
each directory is a tmpfs of its own, capped in bytes and inodes, and a dirty one is replaced by a
fresh tmpfs (the old one is detached and freed whole, however deep or full it was). Elsewhere the
directory is emptied with fd-relative calls holding one directory fd at a time, so neither PATH_MAX
nor recursion depth limits it; if that fails or overruns its time budget, the worker moves to a new
directory and asks to be recycled.

"Empty" covers the root directory itself: the child owns it, so it can set a POSIX ACL (a default
ACL made every file the next execution created unreadable), extended attributes, inode flags and
timestamps on it, all of which outlived a check of the inode count, mode and owner. The root's
whole state (mode, owner, times including ctime, xattrs, flags) is recorded when it is made and
compared after every execution: a mounted one that differs is replaced, a plain one is put back
(xattrs removed, flags, mode, owner and times restored) and checked again.

"Empty" covers the inode numbers too: a tmpfs numbers its inodes from a counter of its own, so a
writer that opened and closed ``O_TMPFILE`` files until the next number spelled its answers left
nothing in the directory, and a reader decoded ``st_ino`` of one file of its own. Where the
filesystem is the worker's alone (a tmpfs it mounted, or bwrap's own at ``bwrap-userns``), the
worker takes the next number itself after every execution (one ``O_TMPFILE``, ~15 us) and compares
it with the one it expects: a mounted directory whose counter moved is replaced (numbering starts
over), a plain one asks for the worker to be recycled. What a writer still controls is whether that
happens: at most one bit per execution (the fresh root's times show it).
"""

import array
import ctypes
import errno
import fcntl
import os
import time

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
CLEAR_BUDGET_S = 2.0
FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x80086601, 0x40086602  # chattr's flags (an int, despite the name)
ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_libc = ctypes.CDLL(None, use_errno=True)


class WorkerScratch:
    """A worker's scratch directories and their Landlock ruleset (rebuilt when a directory is
    replaced: rules hold the inodes they were made for)."""

    def __init__(self, tmp_root: str, *, owner, mount: bool, private_shm: bool, size_bytes: int,
                 inodes: int, landlock_policy=None, own_filesystem: bool = False):
        """
        Args:
            owner: the uid the child runs as when it differs from ours (root workers), else None.
            mount: we may mount (root in a mount namespace of our own): tmpfs directories.
            private_shm: /dev/shm is ours alone (bwrap, or mounted by us); else the host's, left alone.
            landlock_policy: a ``landlock.Policy`` (None: the kernel has no Landlock).
            own_filesystem: the directories' filesystems are ours alone even where we do not mount
                them (bwrap's tmpfs): their inode numbering is watched (mounted ones always are).
        """
        self.workdir = ScratchDir(new_directory(tmp_root, "work"), mode=0o700, owner=owner, mount=mount,
                                  size_bytes=size_bytes, inodes=inodes)
        self.shm = ScratchDir("/dev/shm", mode=0o1777, owner=None, mount=mount, size_bytes=size_bytes,
                              inodes=inodes) if private_shm else None
        self.recycle = False  # set once a directory could not be emptied: the parent retires us
        watched = [d for d in (self.workdir, self.shm) if d is not None and (d.mounted or own_filesystem)]
        self.numbering = "checked" if watched and all(d.watch_numbering() for d in watched) else None
        self.policy, self.ruleset, self._ruleset_for = landlock_policy, None, None
        self._refresh_ruleset()

    def reset(self) -> None:
        """Empty every directory for the next execution (every process of the last one is gone)."""
        clean = True
        for directory in (self.workdir, self.shm):
            try:
                clean = (directory is None or directory.reset()) and clean
                clean = not (directory is not None and directory.numbering_moved) and clean
            except OSError:
                clean = False
        self.recycle = self.recycle or not clean
        self._refresh_ruleset()

    def close(self) -> None:
        """Remove the worker's temp dir as it exits (after the last reset: it is empty, or a wreck
        that stays for the pool's own cleanup), so that recycled workers leave nothing behind."""
        self.workdir.remove()

    def _refresh_ruleset(self) -> None:
        writable = [d for d in (self.workdir, self.shm) if d is not None]
        key = tuple((d.path, d.generation) for d in writable)
        if self.policy is None or key == self._ruleset_for:
            return
        if self.ruleset is not None:
            os.close(self.ruleset)
        self.ruleset, self._ruleset_for = self.policy.build([d.path for d in writable]), key


class ScratchDir:
    """One writable directory at a fixed path: a tmpfs where we can mount, else a plain directory."""

    def __init__(self, path: str, *, mode: int, owner, mount: bool, size_bytes: int, inodes: int):
        self.path, self.mode, self.owner = path, mode, owner
        self.stem = os.path.basename(path)  # a replacement is named after it
        self.options = f"mode={mode:o},size={size_bytes},nr_inodes={inodes}"
        if owner is not None:
            self.options += f",uid={owner},gid={owner}"
        os.makedirs(path, mode=0o755, exist_ok=True)
        self.mounted = mount and self._mount()
        self.pristine = None  # the root's state as made (root_state()), compared after each execution
        self.next_inode = None  # the number the filesystem's next inode gets (None: not watched)
        self.numbering_moved = False  # a plain directory's numbering moved: recycle the worker
        if not self.mounted:
            self._restore_root()
        self._record()
        self.generation = 0  # bumped whenever the directory is replaced (its Landlock rule too)

    def reset(self) -> bool:
        """Empty it for the next execution. False: it could not be emptied (recycle the worker);
        the directory has then been replaced by a new, empty one at a new path."""
        if self.mounted:
            if self._dirty() | self._numbering_moved():  # both: the probe keeps the count in step
                _libc.umount2(self.path.encode(), MNT_DETACH)
                if not self._mount():
                    raise OSError(ctypes.get_errno(), f"could not remount a tmpfs on {self.path}")
                self._record()
                self.generation += 1
                if self.next_inode is not None:
                    self.watch_numbering()
            return True
        self.numbering_moved = self._numbering_moved()
        try:
            os.chmod(self.path, 0o700)  # the program (same uid here) may have locked its own root
        except OSError:
            pass
        if clear_directory(self.path, time.monotonic() + CLEAR_BUDGET_S) and self._restore_root():
            return True
        self.path = new_directory(os.path.dirname(self.path), self.stem)  # leave the wreck
        self._restore_root()
        self._record()
        self.generation += 1
        return False

    def watch_numbering(self) -> bool:
        """Start watching the inode counter: two probes must get consecutive numbers (a counter of
        this filesystem's own; before Linux 5.9 tmpfs drew from a host-wide one). True if watched."""
        try:
            first, second = _next_inode(self.path), _next_inode(self.path)
        except OSError:
            self.next_inode = None
            return False
        self.next_inode = second + 1 if second == first + 1 else None
        return self.next_inode is not None

    def _numbering_moved(self) -> bool:
        """Take the next inode number (one O_TMPFILE) and compare it with the expected one."""
        if self.next_inode is None:
            return False
        try:
            number = _next_inode(self.path)
        except OSError:
            return True
        moved, self.next_inode = number != self.next_inode, number + 1
        return moved

    def remove(self) -> None:
        """Unmount it and remove it if empty; left as it is otherwise."""
        if self.mounted:
            _libc.umount2(self.path.encode(), MNT_DETACH)
        try:
            os.rmdir(self.path)
        except OSError:
            pass

    def _mount(self) -> bool:
        flags = ctypes.c_ulong(MS_NOSUID | MS_NODEV)
        return _libc.mount(b"tmpfs", self.path.encode(), b"tmpfs", flags, self.options.encode()) == 0

    def _dirty(self) -> bool:
        """Anything but the empty root (one inode) exactly as we made it. Every change a child can
        make to the root (mode, owner, ACL, xattr, flags) also moves its ctime, which no call sets."""
        try:
            fs = os.statvfs(self.path)
            return fs.f_files - fs.f_ffree != 1 or root_state(self.path) != self.pristine
        except OSError:
            return True

    def _record(self) -> None:
        try:
            self.pristine = root_state(self.path, with_ctime=self.mounted)
        except OSError:
            self.pristine = None

    def _restore_root(self) -> bool:
        """A plain directory's root, put back as recorded (our own restoring moves its ctime, which
        is therefore left out). True once it matches."""
        try:
            fd = os.open(self.path, ROOT_FLAGS)
        except OSError:
            return False
        try:
            for name in os.listxattr(fd):  # POSIX ACLs are the system.posix_acl_* attributes
                try:
                    os.removexattr(fd, name)
                except OSError:
                    pass
            flags = self.pristine[-1] if self.pristine else 0
            if flags is not None and _flags(fd) not in (None, flags):
                fcntl.ioctl(fd, FS_IOC_SETFLAGS, array.array("i", [flags]))
            owned = True
            try:  # fails only on a directory we do not own (bwrap's /dev/shm in a user namespace),
                os.fchmod(fd, self.mode)  # whose root the child (our uid) cannot change either,
                if self.owner is not None:  # but for the times its entries' changes set
                    os.fchown(fd, self.owner, self.owner)
                if self.pristine is not None:
                    os.utime(fd, ns=self.pristine[3:5])
            except OSError:
                owned = False
            if self.pristine is None:
                return True
            state = _state(fd, False)
            return state == self.pristine if owned else state[:3] + state[5:] == self.pristine[:3] + self.pristine[5:]
        except OSError:
            return False
        finally:
            os.close(fd)


def _next_inode(path: str) -> int:
    """The number the filesystem gives its next inode: that of an unnamed file made and dropped."""
    fd = os.open(path, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def root_state(path: str, with_ctime: bool = True) -> tuple:
    """(mode, uid, gid, atime, mtime, ctime or None, xattr names, inode flags or None) of a directory."""
    fd = os.open(path, ROOT_FLAGS)
    try:
        return _state(fd, with_ctime)
    finally:
        os.close(fd)


def _state(fd: int, with_ctime: bool) -> tuple:
    st = os.fstat(fd)
    return (st.st_mode, st.st_uid, st.st_gid, st.st_atime_ns, st.st_mtime_ns,
            st.st_ctime_ns if with_ctime else None, tuple(sorted(os.listxattr(fd))), _flags(fd))


def _flags(fd: int):
    buffer = array.array("i", [0])
    try:
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buffer)
    except OSError:  # a filesystem without inode flags (tmpfs before Linux 6.0): nothing to set either
        return None
    return buffer[0]


def new_directory(parent: str, stem: str) -> str:
    """Make ``parent/stem-<random>``, 0700: a directory no other worker has (the mkdir is exclusive)."""
    while True:
        path = f"{parent}/{stem}-{os.urandom(6).hex()}"
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def clear_directory(path: str, deadline: float) -> bool:
    """Delete everything under ``path`` (not ``path`` itself). Depth-first with one open directory
    fd at a time, walking back up through ``..`` (nothing runs that could move a directory
    meanwhile): no path is ever longer than one name, and no recursion. False on failure or past
    ``deadline``.

    It never climbs above ``path``: the walk counts its depth, and every directory it climbs to
    must be the one it descended from (same device and inode), else it stops. (A first version
    compared fd numbers to find ``path`` again; ``..`` opens a new fd, so it climbed past the top
    and deleted the host's /tmp and /etc.)"""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return False
    trail = []  # (st_dev, st_ino) of each directory above the current one, up to ``path``
    try:
        while True:
            if time.monotonic() > deadline:
                return False
            below = _empty_or_descend(fd, flags)
            if below is not None:
                here = os.fstat(fd)
                trail.append((here.st_dev, here.st_ino))
                os.close(fd)
                fd = below
                continue
            if not trail:  # ``path`` itself is empty: done
                return True
            parent = os.open("..", flags, dir_fd=fd)  # the now-empty directory goes on the next pass
            os.close(fd)
            fd = parent
            above = os.fstat(fd)
            if (above.st_dev, above.st_ino) != trail.pop():
                return False  # not where we came from (a mount or a moved directory): stop
    except OSError:
        return False
    finally:
        os.close(fd)


def _empty_or_descend(fd: int, flags: int):
    """Remove the entries of directory ``fd`` it can; return an fd of the first non-empty
    subdirectory to descend into, or None once ``fd`` is empty."""
    with os.scandir(fd) as entries:
        names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for name, is_dir in names:
        if not is_dir:
            os.unlink(name, dir_fd=fd)
            continue
        try:
            os.rmdir(name, dir_fd=fd)
            continue
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EACCES, errno.EPERM):
                raise
        return _unlock_and_open(fd, name, flags)
    return None


def _unlock_and_open(fd: int, name: str, flags: int) -> int:
    """Open subdirectory ``name`` of ``fd`` after making it 0700 (a program may have locked it).
    The chmod goes through an O_PATH fd of the entry itself, never through the name: chmod follows
    symlinks, and a concurrent process could turn the name into a link to anywhere after the scan
    (a property test found the walk changing modes outside its root that way). Without /proc the
    directory is opened as it is (O_NOFOLLOW: never through a link)."""
    entry = os.open(name, flags | os.O_PATH, dir_fd=fd)  # O_NOFOLLOW | O_DIRECTORY: the entry, not a link
    try:
        os.chmod(f"/proc/self/fd/{entry}", 0o700)
        return os.open(f"/proc/self/fd/{entry}", flags & ~os.O_NOFOLLOW)  # the same inode again
    except OSError:
        return os.open(name, flags, dir_fd=fd)
    finally:
        os.close(entry)
