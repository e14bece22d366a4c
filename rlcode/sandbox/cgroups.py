"""Memory, process and CPU limits per execution, through cgroups, where the machine lets us write them.

RLIMIT_AS is per process (three forked children or a memfd exceed it together) and RLIMIT_NPROC
counts every process of a uid on the host (one sample holding 62 processes starved the others).
A cgroup bounds an execution as a whole: each worker slot gets one cgroup per controller, with
``memory`` (swap included, so no swap) and ``pids`` limits. The worker joins them at start, so
every child is born inside at no cost per execution; a worker runs one execution at a time and
idles meanwhile, so the group holds one execution plus the idle worker (WORKER_MEMORY_BYTES,
WORKER_TASKS of headroom). What an execution leaves in its tmpfs is uncharged when the worker
replaces that tmpfs; what it left in flight, once the worker has drained it, and the worker waits
for that before the next execution starts (inside/slot_memory.py).

CPU: without a cpu cgroup, the scheduler weighs each session as a group of its own (autogrouping,
``kernel.sched_autogroup_enabled=1``, the default on most kernels), so 61 spinning children that
each called setsid() got ~61x the CPU of everything else: an honest sample beside them timed out,
and the trainer starved. Each slot's ``cpu`` cgroup has one default weight (cpu.shares 1024, or
cpu.weight 100), whatever its processes do (tasks in a cpu cgroup are not autogrouped), and the
pool's folder has the weight of one slot per slot, so that the pool as a whole competes with the
trainer as its worker sessions did before.

Detection, in this order, per controller: cgroup v2 (``memory.max``, ``memory.swap.max``,
``pids.max``) where our v2 group offers the controller, else the v1 hierarchy of that controller.
Either must be writable (root, or a delegated subtree); without one the pool falls back to the
rlimits and the isolation report says so. Only root levels use it: an unprivileged worker's child
cannot write another user's cgroup files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
CPU_WEIGHT = {1: ("cpu.shares", 1024, 262144), 2: ("cpu.weight", 100, 10000)}  # file, default, maximum
WORKER_MEMORY_BYTES = 64 << 20  # headroom for the idle worker's own pages (~20 MB resident)
WORKER_TASKS = 3  # the worker, its template (inside/template.py), and one spare
MOUNT_IN_SANDBOX = "/sandbox-cgroup"  # where bwrap binds the pool's cgroup folders


@dataclass
class CgroupLimits:
    """The pool's cgroup folders (one per controller), holding one sub-folder per worker slot."""

    version: dict[str, int] = field(default_factory=dict)  # controller -> 1 or 2
    pool_dirs: dict[str, str] = field(default_factory=dict)  # controller -> host path
    note: str = ""
    slots_made: int = 0

    @property
    def active(self) -> bool:
        return bool(self.pool_dirs)

    def slot(self, name: str, memory_bytes: int, max_processes: int) -> dict[str, str]:
        """Create (or reset) the slot's cgroups; returns controller -> folder name under the pool's."""
        made = {}
        for controller, pool_dir in self.pool_dirs.items():
            path = Path(pool_dir) / name
            path.mkdir(exist_ok=True)
            if controller == "memory":
                _set_memory(path, self.version[controller], memory_bytes + WORKER_MEMORY_BYTES)
            elif controller == "cpu":
                weight_file, weight, maximum = CPU_WEIGHT[self.version[controller]]
                (path / weight_file).write_text(str(weight))
                (Path(pool_dir) / weight_file).write_text(str(min(maximum, weight * (self.slots_made + 1))))
            else:
                (path / "pids.max").write_text(str(max_processes + WORKER_TASKS))
            made[controller] = name
        self.slots_made += 1
        return made

    @property
    def cpu_share(self) -> str:
        """How the CPU is shared (see isolation.CPU_SHARES): per slot by a cpu cgroup, or not."""
        if "cpu" in self.pool_dirs:
            return f"cpu-cgroup-v{self.version['cpu']}"
        return "autogroup" if autogroup_enabled() else "none"

    def worker_config(self, slot: dict[str, str]) -> dict:
        """A worker's config entry: the cgroup.procs files it joins, as seen from inside bubblewrap
        and from the host (the worker knows which it is)."""
        if not slot:
            return {}
        config = {"cgroup_procs": {"bwrap": self.procs_files(slot, True), "host": self.procs_files(slot, False)},
                  "cgroup_controllers": sorted(slot)}
        if "memory" in slot:  # read by the worker after each execution (inside/slot_memory.py)
            config["memory_cgroup"] = {"bwrap": f"{MOUNT_IN_SANDBOX}/memory/{slot['memory']}",
                                       "host": f"{self.pool_dirs['memory']}/{slot['memory']}"}
        return config

    def bind_arguments(self) -> list[str]:
        """bwrap arguments making the pool's cgroup folders writable inside the sandbox."""
        args = []
        for controller, pool_dir in self.pool_dirs.items():
            args += ["--bind", pool_dir, f"{MOUNT_IN_SANDBOX}/{controller}"]
        return args

    def procs_files(self, slot: dict[str, str], in_bwrap: bool) -> list[str]:
        """The ``cgroup.procs`` files a worker writes itself into, as it sees them."""
        return [f"{MOUNT_IN_SANDBOX if in_bwrap else self.pool_dirs[c]}"
                f"{'/' + c if in_bwrap else ''}/{name}/cgroup.procs" for c, name in slot.items()]

    def oom_kills(self, slot: dict[str, str]) -> int:
        """How many processes the kernel killed for memory in the slot's cgroup so far."""
        name = slot.get("memory")
        if name is None:
            return 0
        path = Path(self.pool_dirs["memory"]) / name
        source = "memory.events" if self.version["memory"] == 2 else "memory.oom_control"
        try:
            for line in (path / source).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        """Delete the pool's cgroup folders (every worker must have exited)."""
        for pool_dir in self.pool_dirs.values():
            for slot in sorted(Path(pool_dir).glob("*/"), reverse=True):
                _rmdir(slot)
            _rmdir(Path(pool_dir))


def _set_memory(path: Path, version: int, limit: int) -> None:
    if version == 2:
        (path / "memory.max").write_text(str(limit))
        if (path / "memory.swap.max").exists():
            (path / "memory.swap.max").write_text("0")
        return
    (path / "memory.limit_in_bytes").write_text(str(limit))
    swap = path / "memory.memsw.limit_in_bytes"  # memory + swap: equal to the limit means no swap
    if swap.exists():
        swap.write_text(str(limit))
    try:
        (path / "memory.swappiness").write_text("0")
    except OSError:
        pass


def autogroup_enabled() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False  # a kernel built without autogrouping


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()  # cgroup folders are removed with rmdir, never by deleting their files
    except OSError:
        pass


def setup(owner_pid: int | None = None) -> CgroupLimits:
    """Find a writable hierarchy for each controller and make the pool's folder in it."""
    owner_pid = owner_pid or os.getpid()
    limits, missing = CgroupLimits(), []
    if os.geteuid() != 0:
        limits.note = "not root: cgroup limits need root (or a delegated cgroup); rlimits only"
        return limits
    for controller in CONTROLLERS:
        for version, base in _candidates(controller):
            pool_dir = base / f"rlcode-sandbox-{owner_pid}-{os.urandom(3).hex()}"
            try:
                pool_dir.mkdir()
            except OSError:
                continue
            _remove_orphans(base)
            limits.version[controller], limits.pool_dirs[controller] = version, str(pool_dir)
            break
        else:
            missing.append(controller)
    kinds = ", ".join(f"{c} v{v}" for c, v in limits.version.items())
    limits.note = (f"{kinds} per worker slot" if kinds else "no writable cgroup") + (
        f"; no writable {' or '.join(missing)} cgroup: rlimits for those" if missing else "")
    return limits


def _candidates(controller: str):
    """(version, our own cgroup folder) pairs offering ``controller``, cgroup v2 first."""
    own = _own_cgroups()
    for mount, fstype, options in _cgroup_mounts():
        if fstype == "cgroup2" and "" in own:
            folder = Path(mount) / own[""].lstrip("/")
            try:
                offered = (folder / "cgroup.controllers").read_text().split()
            except OSError:
                continue
            if controller in offered and _enable_in_subtree(folder, controller):
                yield 2, folder
    for mount, fstype, options in _cgroup_mounts():
        if fstype == "cgroup" and controller in options and controller in own:
            yield 1, Path(mount) / own[controller].lstrip("/")


def _enable_in_subtree(folder: Path, controller: str) -> bool:
    try:
        if controller not in (folder / "cgroup.subtree_control").read_text().split():
            (folder / "cgroup.subtree_control").write_text(f"+{controller}")
        return True
    except OSError:  # v2's rule: no controllers for children of a group holding processes
        return False


def _own_cgroups() -> dict[str, str]:
    """controller ("" for v2) -> our cgroup path, from /proc/self/cgroup."""
    own = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                own[controller] = path
    except (OSError, ValueError):
        pass
    return own


def _cgroup_mounts():
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            mounts.append((fields[4], tail[0], set(tail[2].split(","))))
    return mounts


def _remove_orphans(base: Path) -> None:
    """Pool folders whose owner died (SIGKILL) stay behind, empty: remove them."""
    for pool_dir in base.glob("rlcode-sandbox-*"):
        try:
            owner = int(pool_dir.name.split("-")[2])
            os.kill(owner, 0)
        except ProcessLookupError:
            for slot in pool_dir.glob("*/"):
                _rmdir(slot)
            _rmdir(pool_dir)
        except (OSError, ValueError, IndexError):
            pass

