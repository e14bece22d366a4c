"""PID numbers that carry nothing from one execution to the next. Standalone stdlib code (runs in
the worker, see worker_main.py).

Each child is the init of a PID namespace of its own, but it sees the worker's ``/proc``, where
``/proc/self`` names its PID in the worker's namespace: the previous execution's last PID + 1. A
writer moved it by starting threads and a reader decoded it (and the worker's and template's
world-readable ``stat`` counters moved with what the previous execution touched).

Where the worker may (root in bwrap: CAP_SYS_ADMIN over its PID namespace), the template writes a
fixed value to ``ns_last_pid`` before every fork, so the child's PIDs in the worker's namespace are
the same whatever ran before (nothing else in that namespace forks: bwrap's init, the worker, the
template), and ``/proc`` is remounted ``hidepid=invisible``, so a child sees its own processes only.
Where it may not (``bwrap-userns``), the worker reads ``ns_last_pid`` after each execution: a number
other than the child's own means the execution made processes or threads, and the worker retires
(a fresh worker starts from the same numbers), so a writer controls at most one bit per execution:
whether the next one runs on a fresh worker.
"""

import ctypes
import os

FIXED_LAST_PID = 1000  # above the namespace's own processes (1-5), far below pid_max
LAST_PID_PATH = "/proc/sys/kernel/ns_last_pid"
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 2, 4, 8, 32
_libc = ctypes.CDLL(None, use_errno=True)


def hide_other_processes() -> bool:
    """Remount ``/proc`` (bwrap's, per worker) so that a process sees only its own uid's processes:
    the children (slot uids) no longer see bwrap's init, the worker or the template. True if done."""
    flags = ctypes.c_ulong(MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC)  # bwrap mounted it so
    return _libc.mount(b"proc", b"/proc", b"proc", flags, b"hidepid=invisible") == 0


class PidNumbering:
    """``mode``: "fixed" (the template sets the last PID before each fork), "checked" (the worker
    compares it after each execution) or None (no PID namespace of the worker's own)."""

    def __init__(self, own_namespace: bool):
        self.fd, self.mode = None, None
        if not own_namespace:
            return
        try:
            self.fd = os.open(LAST_PID_PATH, os.O_RDWR | os.O_CLOEXEC)
            os.pwrite(self.fd, b"%d" % FIXED_LAST_PID, 0)
            self.mode = "fixed"
        except OSError:
            if self.fd is not None:
                os.close(self.fd)
            try:
                self.fd = os.open(LAST_PID_PATH, os.O_RDONLY | os.O_CLOEXEC)
                self.mode = "checked"
            except OSError:
                self.fd = None

    def before_fork(self) -> None:
        """In the template, just before the child's fork (raises if the write fails: no child then)."""
        if self.mode == "fixed":
            os.pwrite(self.fd, b"%d" % FIXED_LAST_PID, 0)

    def moved_past(self, child_pid) -> bool:
        """In the worker, after an execution: did it allocate PIDs beyond the child's own?"""
        if self.mode != "checked" or child_pid is None:
            return False
        try:
            return int(os.pread(self.fd, 32, 0)) != child_pid
        except (OSError, ValueError):
            return True
