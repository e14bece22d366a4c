"""The slot's memory cgroup after an execution: the next one starts only once it is uncharged.
Standalone stdlib code (runs in the worker, see worker_main.py).

The unix drain (unix_drain.py) waits until an execution's leftover sockets are gone from the
namespace, but what they carried is freed after them: the kernel's collector runs in a kernel
thread, whose last fput of each file (the sockets, and the memfds, pipes and tmpfs files queued in
them) is deferred to a work queue (delayed fput), and a memfd's pages are uncharged as its inode is
evicted. Measured after a 192 MiB slot was filled with memfds queued in a cycle: the sockets were
gone, 200-230 MiB were still charged, falling ~7 MiB per ms to the idle worker's 2 MiB 30-45 ms
later. The next execution started meanwhile failed with ``memory``.

So after the drain and the scratch reset, the worker reads its slot's memory cgroup usage (one
pread on a kept fd, ~1 us). It waits only when the drain found leftovers, or when the usage is above
the last settled one by more than the margin; then it polls until the memory no process can give
back (the usage less the page cache and reclaimable slab of ``memory.stat``, which the kernel
reclaims for the next execution by itself) is within the margin of the idle worker's at its start,
at most SETTLE_BUDGET_S. Still above it then (never seen), the execution's result stands, and the
worker retires so that the next one starts with a fresh worker.

The margin is what the idle worker itself may hold above its start at that point: the result it is
about to send, twice (the captured bytes its allocator may keep, and their decoded copy), plus what
the kernel keeps in per-CPU batches on both sides of the count (the charge stock, MEMCG_CHARGE_BATCH
pages per CPU, and as much of not yet flushed statistics), plus WORKER_SLACK_BYTES of the
interpreter's own (measured over 2,000 MBPP executions on one worker: 1.4-3.2 MiB above its start,
and the usage moved by under 1 MiB from one execution to the next).
"""

import os
import time

SETTLE_BUDGET_S = 2.0
CHARGE_BATCH_PAGES = 64  # the kernel's MEMCG_CHARGE_BATCH: charges and statistics are batched per CPU
WORKER_SLACK_BYTES = 4 << 20
USAGE_FILES = {1: "memory.usage_in_bytes", 2: "memory.current"}
RECLAIMABLE = (b"inactive_file", b"active_file", b"slab_reclaimable")  # v1 lists no slab
KERNEL_BATCHES_BYTES = 2 * CHARGE_BATCH_PAGES * os.sysconf("SC_PAGE_SIZE") * (os.cpu_count() or 1)


def _read_int(fd) -> int:
    return int(os.pread(fd, 64, 0))  # offset 0: the kernel generates the file afresh


class SlotMemory:
    """The worker's memory cgroup: its usage at the worker's start, and the check after each execution."""

    def __init__(self, folder: str):
        """``folder``: the slot's memory cgroup as the worker sees it (see the parent's cgroups.py)."""
        self.usage_fd = self.stat_fd = None
        for name in USAGE_FILES.values():
            try:
                self.usage_fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_CLOEXEC)
                break
            except OSError:
                continue
        if self.usage_fd is None:
            raise OSError(f"no memory usage file in {folder}")
        self.stat_fd = os.open(os.path.join(folder, "memory.stat"), os.O_RDONLY | os.O_CLOEXEC)
        self.settled = _read_int(self.usage_fd)  # usage after the last execution that left nothing
        self.idle = self.unreclaimable(self.settled)  # the idle worker's own, at its start

    def unreclaimable(self, usage: int) -> int:
        """``usage`` less what the kernel reclaims by itself when the next execution needs it."""
        stat = b""
        while True:  # memory.stat is a few KiB; read it whole
            chunk = os.pread(self.stat_fd, 1 << 16, len(stat))
            stat += chunk
            if not chunk or len(chunk) < 1 << 16:
                break
        for line in stat.splitlines():
            key, _, value = line.partition(b" ")
            if key in RECLAIMABLE:
                usage -= int(value)
        return usage

    def settle(self, leftovers: bool, result_bytes: int):
        """After an execution (its processes gone, its sockets drained, its scratch reset; its result,
        of ``result_bytes``, not sent yet): wait until what it charged is uncharged. None when it is,
        else a one-line reason."""
        margin = 2 * result_bytes + KERNEL_BATCHES_BYTES + WORKER_SLACK_BYTES
        usage = _read_int(self.usage_fd)
        if not leftovers and usage <= self.settled + margin:
            self.settled = usage
            return None
        started = time.monotonic()
        deadline, pause = started + SETTLE_BUDGET_S, 0.0005
        while True:
            held = self.unreclaimable(usage)
            if held <= self.idle + margin:
                self.settled = usage
                self.idle = min(self.idle, held)
                return None
            if time.monotonic() >= deadline:
                return (f"{(held - self.idle) >> 20} MiB of the slot's memory still charged "
                        f"{time.monotonic() - started:.1f} s after the execution "
                        f"(margin {margin >> 20} MiB); the worker retires")
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
            usage = _read_int(self.usage_fd)
