"""A uid (and gid) of its own for each worker slot's children, so RLIMIT_NPROC bounds one execution.

RLIMIT_NPROC is checked against the number of tasks (processes and threads) of the child's real
uid on the whole machine (per user namespace since Linux 5.14, which changes nothing for root
workers: their children live in the initial one). With one uid (65534) shared by every child, a
sample holding its 64 processes stopped the samples of every other worker, and of any other sandbox
pool, from starting a thread. Where a pids cgroup is writable it bounds each execution anyway
(cgroups.py); a uid per slot makes the fallback hold too. Only root can hand out uids: other users'
workers keep theirs (see inside/process_limit.py for what bounds them).

Which uids: 65536 of them from DEFAULT_BASE (2,000,000,000), inside the range systemd's UIDS-GIDS.md
leaves unused (1879048192-2147352575): above useradd's subordinate-uid ranges (SUB_UID_MAX in
login.defs, 600100000 by default) and systemd's container ranges (524288-1879048191), below 2^31
(which some tools read as negative). A uid needs no passwd entry to run a process; uids that have
one (or a group entry), as an LDAP directory might, are skipped. BASE_ENV moves the range: it is a
property of the machine, hence the environment rather than a pool argument.

Several pools on a machine (DDP ranks, a second trainer) must not share uids: each slot's uid is
claimed with flock() on a lock file in a root-only directory, held for the pool's life and released
by the kernel when its process dies, so nothing needs cleaning up. Pools in different mount
namespaces (containers) cannot see each other's locks: give them different bases.
"""

from __future__ import annotations

import fcntl
import grp
import logging
import os
import pwd
import stat
import tempfile
from dataclasses import dataclass, field

BASE_ENV = "RLCODE_SANDBOX_UID_BASE"
DEFAULT_BASE = 2_000_000_000
RANGE_SIZE = 65536
SHARED_UID = 65534  # nobody: what children ran as before, and still do where no uid can be claimed
LOCK_DIR_NAME = "rlcode-sandbox-uids"
LOCK_PARENTS = ("/run", tempfile.gettempdir())  # /run first: the same for every process of the host
log = logging.getLogger(__name__)


class UidRangeError(ValueError):
    """BASE_ENV is malformed, or the range is exhausted (the message names the fix)."""


@dataclass
class SlotUids:
    """The uids claimed for a pool's slots, in slot order (empty when not root or not mappable)."""

    uids: tuple[int, ...] = ()
    _locks: list[int] = field(default_factory=list, repr=False)

    def worker_config(self, index: int) -> dict:
        """A worker's config entry: the uid (and gid) its children drop to."""
        return {"sandbox_uid": self.uids[index]} if index < len(self.uids) else {}

    def release(self) -> None:
        """Give the uids back (every worker of the pool must have exited)."""
        for fd in self._locks:
            os.close(fd)  # releases the flock (a forked copy of the fd keeps it until that process exits)
        self._locks.clear()


def claim(count: int) -> SlotUids:
    """Claim ``count`` uids no other pool of this machine holds. Not root: none (children keep the
    worker's uid). Raises UidRangeError for a malformed BASE_ENV or an exhausted range."""
    base = range_base()
    if os.geteuid() != 0:
        return SlotUids()
    if not _mapped(base, base + RANGE_SIZE):
        log.warning("sandbox: uids %d-%d are not mapped in this user namespace (a container?), so every "
                    "worker's children share uid %d and its RLIMIT_NPROC; fix: set %s to mapped, unused uids",
                    base, base + RANGE_SIZE - 1, SHARED_UID, BASE_ENV)
        return SlotUids()
    lock_dir, claimed = _lock_dir(), SlotUids()
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    for uid in range(base, base + RANGE_SIZE):
        if len(claimed.uids) == count:
            return claimed
        if _has_entry(uid):
            continue
        fd = os.open(os.path.join(lock_dir, f"{uid}.lock"), flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another pool's
            os.close(fd)
            continue
        claimed.uids += (uid,)
        claimed._locks.append(fd)
    if len(claimed.uids) == count:
        return claimed
    claimed.release()
    raise UidRangeError(f"all {RANGE_SIZE} sandbox uids from {base} are held by other sandbox pools (locks "
                        f"in {lock_dir}); fix: close some, or set {BASE_ENV} to another unused range")


def range_base() -> int:
    """The first uid of the range: BASE_ENV, else DEFAULT_BASE."""
    text = os.environ.get(BASE_ENV, "").strip()
    if not text:
        return DEFAULT_BASE
    highest = 2**31 - RANGE_SIZE
    try:
        base = int(text)
    except ValueError:
        base = -1
    if not 65536 <= base <= highest:
        raise UidRangeError(f"{BASE_ENV}={text!r} is not a uid from 65536 to {highest}; fix: unset it, or "
                            f"set the first of {RANGE_SIZE} uids no user or container of this machine has")
    return base


def _has_entry(uid: int) -> bool:
    """A user or group of that number exists (local files, LDAP, ...): not ours to use."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except (KeyError, OverflowError):
            pass
    return False


def _mapped(first: int, end: int) -> bool:
    """The uids and gids [first, end) exist in our user namespace (always so in the initial one)."""
    for kind in ("uid_map", "gid_map"):
        try:
            with open(f"/proc/self/{kind}") as f:
                extents = [tuple(map(int, line.split())) for line in f if line.strip()]
        except (OSError, ValueError):
            return False
        if not any(inside <= first and end <= inside + length for inside, _, length in extents):
            return False
    return True


def _lock_dir() -> str:
    """A directory only root may write, the same for every pool of the machine."""
    for parent in LOCK_PARENTS:
        path = os.path.join(parent, LOCK_DIR_NAME)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        info = os.lstat(path)
        # Anyone else's (or a symlink planted in a shared /tmp) could let them take our locks.
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022:
            return path
    raise UidRangeError(f"no root-only directory for the sandbox's uid locks ({', '.join(LOCK_PARENTS)}: "
                        f"{LOCK_DIR_NAME} missing, not writable, or not root's 0700); fix: remove a "
                        "stray one, or make /run writable for root")
