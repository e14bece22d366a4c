"""Unix sockets an execution leaves in the kernel, and their removal before the next execution.
Standalone stdlib code (runs in the worker, see worker_main.py).

Once an execution's processes are gone, the only kernel objects of theirs that can still exist are
the ones in flight: AF_UNIX sockets whose own fds were sent (SCM_RIGHTS) into each other's queues,
a cycle no process holds. They live until the kernel's unix garbage collector runs, which it does
only when some unix socket is released while fds are in flight (10 ms to over 5 s on a quiet host),
and meanwhile they keep what is queued in them (data, pipes, memfds: up to the slot's whole memory
cgroup, so the next executions failed with ``memory``) and their abstract names, which the next
execution on the worker could read in ``/proc/net/unix`` or probe with bind().

So after each execution the worker looks at the network namespace its children share (bubblewrap's,
or the worker's own at the process level as root): any unix socket in ``/proc/net/unix`` that was
not there at the worker's start is a leftover. Then it closes a socket of its own, which makes the
kernel run the collector, and waits for the leftovers to go (measured: 5-6 ms for 60 sockets), up to
DRAIN_BUDGET_S. Left after that (never seen), the execution's result says so and the worker
retires. Their going does not yet free what they carried (delayed: slot_memory.py waits for that
before the next execution starts).

The usual answer, nothing left, comes from the namespace's socket count instead: ``sockets: used``
of ``/proc/net/sockstat``, read again through an fd kept open (~2 us). Generating ``/proc/net/unix``
walks every bucket of the namespace's unix hash table however few sockets there are: ~60 us of the
worker's CPU per execution in place (30 us on a warm cache), about 2% of a check, on the path between
one execution and the next. The count covers every socket of the namespace that is still allocated,
and the worker's own pair (the template's socketpair) stays allocated while the worker lives, even if
the template is gone (each end holds its peer). So a count equal to the one at the worker's start
means no other socket exists, let alone one in flight; any other count (a leftover, or a socket
released but not yet freed) is looked up in ``/proc/net/unix`` as before. The count is used only
where it is shown to be this namespace's own at the start (kernels before 4.16 had one host-wide
count): equal to the sockets listed there, and moved by a socketpair made and closed.

Where the children are in the host's network namespace (the process level as another user) the
sockets cannot be told from the host's: ``available`` is False, the collector is still kicked.
"""

import os
import socket
import time

NET_UNIX = "/proc/net/unix"
NET_SOCKSTAT = "/proc/net/sockstat"
SOCKETS_USED = b"sockets: used "  # its first line
DRAIN_BUDGET_S = 2.0


def socket_inodes() -> set:
    """Inode numbers of every unix socket in our network namespace (None if unreadable)."""
    try:
        with open(NET_UNIX, "rb") as f:
            lines = f.read().splitlines()[1:]  # a header, then one socket per line
    except OSError:
        return None
    inodes = set()
    for line in lines:
        fields = line.split()
        if len(fields) >= 7:
            inodes.add(fields[6])
    return inodes


def open_socket_count():
    """An fd on ``/proc/net/sockstat`` of our network namespace (None if it cannot be opened)."""
    try:
        return os.open(NET_SOCKSTAT, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def socket_count(fd) -> int:
    """Sockets allocated in the namespace ``fd`` was opened in (-1 if unreadable). pread at offset 0
    makes the kernel generate the file afresh, no reopening needed."""
    try:
        head = os.pread(fd, 64, 0)
    except OSError:
        return -1
    if not head.startswith(SOCKETS_USED):
        return -1
    try:
        return int(head[len(SOCKETS_USED):].split(b"\n", 1)[0])
    except ValueError:
        return -1


def run_collector() -> None:
    """Release a unix socket: with fds in flight, the kernel queues its unix garbage collector."""
    try:
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).close()
    except OSError:
        pass


class UnixDrain:
    """The worker's own unix sockets (its template's pair), and the check run after each execution."""

    def __init__(self, own_namespace: bool):
        """``own_namespace``: the children share a network namespace with the worker alone."""
        self.baseline = socket_inodes() if own_namespace else None
        self.available = self.baseline is not None
        self.count_fd, self.baseline_count = None, -1  # the fast path, where it is shown sound
        self.found = 0  # sockets the last execution left
        if self.available:
            self._check_socket_count()

    def _check_socket_count(self) -> None:
        """Keep an fd on the namespace's socket count if that count is this namespace's alone: it
        equals the unix sockets listed (the worker's own pair) and follows a pair made and closed."""
        fd = open_socket_count()
        if fd is None:
            return
        count = socket_count(fd)
        try:
            a, b = socket.socketpair()
        except OSError:
            os.close(fd)
            return
        with a, b:
            moved = socket_count(fd) == count + 2
        if (count == len(self.baseline) and moved and socket_count(fd) == count
                and socket_inodes() == self.baseline):
            self.count_fd, self.baseline_count = fd, count
        else:
            os.close(fd)

    def drain(self):
        """Wait until the last execution's sockets are gone. None when they are (or never were), else
        a one-line reason. ``found``: how many it left (what they carried may still be charged to the
        slot's memory for a while: slot_memory.py)."""
        self.found = 0
        if not self.available:
            run_collector()
            return None
        if self.count_fd is not None and socket_count(self.count_fd) == self.baseline_count:
            return None  # no socket but the worker's own is allocated (module docstring)
        left = self._leftovers()
        if not left:
            return None
        found = self.found = len(left)
        run_collector()
        deadline, pause = time.monotonic() + DRAIN_BUDGET_S, 0.001
        while left and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            run_collector()  # a collection that began before the cycle was complete missed it
            left = self._leftovers()
        if not left:
            return None
        return (f"{len(left)} of the {found} unix sockets the execution left in flight were still held "
                f"after {DRAIN_BUDGET_S:g} s of the kernel's collector; the worker retires")

    def _leftovers(self) -> set:
        now = socket_inodes()
        return set() if now is None else now - self.baseline
