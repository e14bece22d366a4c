"""Landlock: an unprivileged filesystem (and TCP) allow-list, applied to every child where the kernel
has it. Standalone stdlib code (runs in the worker, see worker_main.py).

The worker builds one ruleset (read-only: what the interpreter needs; read-write: the execution's
scratch directories only) and rebuilds it when a scratch directory is replaced; each child enters
it with one landlock_restrict_self() just before its seccomp filter. It is the layer that hides the
user's files when there is no bubblewrap and no root (the ``process`` level on a cluster), and a
second wall everywhere else. From ABI 4 on, TCP bind/connect are denied; from ABI 6 on, abstract UNIX
sockets and signals outside the execution's own processes are out of reach too.
"""

import ctypes
import os
import stat

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1, 2, 4, 8
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 16, 32, 64, 128, 256
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 512, 1024, 2048, 4096
REFER, TRUNCATE, IOCTL_DEV = 8192, 16384, 32768  # ABI 2, 3 and 5
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2  # ABI 6
# ABI 7 logs every denial to the host's audit log by default: a sample looping on denied opens could
# flood it. Off for the child's own domain and for any domain it nests inside (its own execs are not
# logged by default).
LOG_SAME_EXEC_OFF, LOG_NEW_EXEC_ON, LOG_SUBDOMAINS_OFF = 1, 2, 4
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # all a non-directory can hold
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The kernel's Landlock ABI (0: none, or disabled at boot)."""
    version = _syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, int(version))


def handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


class Policy:
    """Which paths a child may read, list (names only), read and write (devices), and write (the
    scratch directories); built into a ruleset fd."""

    def __init__(self, abi: int, read: list, devices: list, listed: list = ()):
        self.abi, self.read, self.devices, self.listed = abi, read, devices, listed
        self.handled = handled_fs(abi)
        self.read_rights = (EXECUTE | READ_FILE | READ_DIR) & self.handled
        self.device_rights = (READ_FILE | WRITE_FILE | IOCTL_DEV) & self.handled
        self.write_rights = self.handled & ~(MAKE_CHAR | MAKE_BLOCK)

    def build(self, writable: list) -> int:
        """A new ruleset fd (close-on-exec) for these writable directories."""
        attr = _RulesetAttr(self.handled, 0, 0)
        size = 8
        if self.abi >= 4:
            attr.handled_access_net, size = NET_BIND_TCP | NET_CONNECT_TCP, 16  # no rule: no TCP at all
        if self.abi >= 6:
            attr.scoped, size = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL, 24
        fd = _syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
        if fd < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
        try:
            for paths, rights in ((self.read, self.read_rights), (self.listed, READ_DIR),
                                  (self.devices, self.device_rights), (writable, self.write_rights)):
                for path in paths:
                    self._allow(fd, path, rights)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _allow(ruleset: int, path: str, rights: int) -> None:
        try:
            target = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # not on this machine (/lib32, ...): nothing to allow
        try:
            if not stat.S_ISDIR(os.fstat(target).st_mode):  # fstat works on O_PATH fds
                rights &= FILE_RIGHTS
            rule = _PathBeneathAttr(rights, target)
            if _syscall(SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                        ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
        finally:
            os.close(target)


def restrict_flags(abi: int) -> int:
    """landlock_restrict_self() flags for this ABI: audit logging off where the kernel logs (ABI 7+)."""
    return LOG_SAME_EXEC_OFF | LOG_SUBDOMAINS_OFF if abi >= 7 else 0


def restrict_self(ruleset: int, flags: int = 0) -> None:
    """Enter the ruleset's domain (needs no_new_privs first). Bound for the child: see child_harness."""
    if _syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(flags)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
