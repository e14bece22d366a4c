"""What bounds the processes and threads of one execution, and the RLIMIT_NPROC its child gets.
Standalone stdlib code (runs in the worker, see worker_main.py).

The kernel checks RLIMIT_NPROC at fork against a count of tasks per real uid: per user namespace and
uid since Linux 5.14 (ucounts), per uid across the machine before. So, for the worker's children:

  cgroup-pids  root with its slot's pids cgroup: the cgroup bounds the execution; no RLIMIT_NPROC.
  slot-uid     root: the child drops to its slot's own uid (claimed by the parent, slot_uids.py), so
               the count holds this execution's tasks only.
  userns       not root, under bubblewrap (a user namespace of this worker's own), Linux >= 5.14:
               the count holds this namespace's tasks only: the worker's, counted once at start.
  shared-uid   the count spans other processes: root's fallback uid 65534 (no uid claimed), or your
               own uid at the process level (and under bubblewrap before Linux 5.14). Counted once
               at start, plus NPROC_SLACK for their growth; a concurrent execution can starve.
  none         bubblewrap's user namespace started by host root: the kernel exempts root from
               RLIMIT_NPROC.
"""

import os

import process_tree

NPROC_SLACK = 256  # shared-uid, not root: room for the trainer's own processes and threads to grow
UCOUNTS_KERNEL = (5, 14)  # RLIMIT_NPROC counted per user namespace from this release on


def mechanism(*, is_root: bool, in_bwrap: bool, pids_cgroup: bool, slot_uid: bool,
              host_root: bool) -> str:
    """Which of the mechanisms above bounds an execution of this worker. ``host_root``: the parent runs as root
    of the initial user namespace (our uid 65534 then maps to it, however bwrap nests namespaces:
    this worker cannot see through them, so the parent tells)."""
    if is_root:
        return "cgroup-pids" if pids_cgroup else "slot-uid" if slot_uid else "shared-uid"
    if not in_bwrap:
        return "shared-uid"
    if host_root:
        return "none"
    return "userns" if _kernel() >= UCOUNTS_KERNEL else "shared-uid"


def nproc_base(kind: str, is_root: bool) -> int:
    """Tasks the child's count holds before the execution starts, added to its RLIMIT_NPROC."""
    if is_root or kind in ("cgroup-pids", "slot-uid", "none"):
        return 0  # root's children count from zero (or, on 65534, whatever else runs as nobody)
    # /proc shows what the count holds: under bubblewrap only our namespace's tasks (bwrap's init
    # and this worker); at the process level every task of the uid on the machine.
    tasks = process_tree.tasks_of_uid(os.getuid()) + 1  # + the template, forked after this count
    return tasks if kind == "userns" else tasks + NPROC_SLACK


def _kernel() -> tuple[int, int]:
    try:
        major, minor = os.uname().release.split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except ValueError:
        return (0, 0)
