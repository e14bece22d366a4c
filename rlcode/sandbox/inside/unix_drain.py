"""Unix sockets an execution leaves in the kernel, and their removal before the next execution.
Standalone stdlib code (runs in the worker, see worker_main.py).

Once an execution's processes are gone, the only kernel objects of theirs that can still exist are
the ones in flight: AF_UNIX sockets whose own fds were sent (SCM_RIGHTS) into each other's queues,
a cycle no process holds. They live until the kernel's unix garbage collector runs, which it does
only when some unix socket is released while fds are in flight (10 ms to over 5 s on a quiet host),
and meanwhile they keep what is queued in them (data, pipes, memfds: up to the slot's whole memory
cgroup, so the next executions failed with ``memory``) and their abstract names, which the next
execution on the worker could read in ``/proc/net/unix`` or probe with bind().

So after each execution the worker reads ``/proc/net/unix`` of the network namespace its children
share (bubblewrap's, or the worker's own at the process level as root): any socket not there at the
worker's start is a leftover. Then it closes a socket of its own, which makes the kernel run the
collector, and waits for the leftovers to go (measured: 5-6 ms for 60 sockets), up to DRAIN_BUDGET_S.
Only then does the next execution start. Left after that (never seen), the execution's result says
so and the worker retires. The check costs one read of a file of a few lines (~30 us) per execution.

Where the children are in the host's network namespace (the process level as another user) the
sockets cannot be told from the host's: ``available`` is False, the collector is still kicked.
"""

import os
import socket
import time

NET_UNIX = "/proc/net/unix"
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

    def drain(self):
        """Wait until the last execution's sockets are gone. None when they are (or never were), else
        a one-line reason."""
        if not self.available:
            run_collector()
            return None
        left = self._leftovers()
        if not left:
            return None
        found = len(left)
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
