"""Isolation levels, their detection, and the report that says which layers are on.

Levels, strongest first:
  bwrap         root: bubblewrap without a user namespace (mount, net, pid, ipc, uts namespaces),
                the child drops to its worker slot's own real uid (slot_uids.py), rlimits, seccomp,
                a PID namespace per execution.
  bwrap-userns  an unprivileged user with user namespaces: the same namespaces, but uid 65534 exists
                only inside the user namespace (to the host the child is still you) and the worker
                has no capabilities, so descendants are killed through the subreaper, not a PID namespace.
  process       no bubblewrap (clusters): fork + rlimits + seccomp (the network is denied by seccomp
                only) + a uid per slot when root; the filesystem is not hidden, only walled off by
                Landlock where the kernel has it (Linux >= 5.13).

Landlock is a layer at every level where the kernel has it. With no layer hiding the filesystem
(no bubblewrap and no Landlock) the pool refuses to run untrusted code unless the user opts in
(``SandboxPool(allow_visible_filesystem=True)`` or ALLOW_VISIBLE_FS_ENV=1).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field

from . import cgroups, core_dumps, slot_uids
from .cgroups import autogroup_enabled
from .launch import Limits, build_launch, stage_worker_files
from .seccomp_policy import SeccompUnavailable, build_filter_bpf
from .worker_process import WorkerFailure, WorkerProcess

LEVELS = ("bwrap", "bwrap-userns", "process")
ALLOW_VISIBLE_FS_ENV = "RLCODE_SANDBOX_ALLOW_VISIBLE_FS"
REQUESTS = ("auto", *LEVELS)
log = logging.getLogger(__name__)


class IsolationUnavailable(RuntimeError):
    """The requested isolation level cannot be had here (the message names the fix)."""


@dataclass(frozen=True)
class IsolationReport:
    """Which isolation level is active and which layers it turned on."""

    level: str
    layers: dict[str, bool]
    notes: dict[str, str] = field(default_factory=dict)
    # What bounds one execution's processes and threads: "cgroup-pids", "slot-uid" or "userns" (per
    # execution), "shared-uid" (RLIMIT_NPROC of a uid others share) or "none" (see inside/process_limit.py).
    process_limit: str = "shared-uid"
    # How the CPU is shared (CPU_SHARES): "cpu-cgroup-v1"/"cpu-cgroup-v2" (one weight per worker slot),
    # "autogroup" or "none" (no cpu cgroup: a sample's weight grows with its sessions or processes).
    cpu_share: str = "none"

    @property
    def weaker_than_bwrap(self) -> bool:
        return self.level != "bwrap"

    @property
    def filesystem_hidden(self) -> bool:
        """Some layer keeps the user's files from candidate code (bubblewrap, or Landlock)."""
        return bool(self.layers.get("filesystem_hidden") or self.layers.get("landlock"))

    def describe(self) -> str:
        lines = [f"sandbox isolation: {self.level}" + ("" if not self.weaker_than_bwrap
                                                       else " (weaker than bwrap)")]
        for name, on in self.layers.items():
            note = self.notes.get(name, "")
            lines.append(f"  [{'on ' if on else 'OFF'}] {name}" + (f": {note}" if note else ""))
        if "fallback" in self.notes:
            lines.append(f"  stronger levels failed: {self.notes['fallback']}")
        return "\n".join(lines)


@dataclass
class DetectedIsolation:
    """What the pool keeps from detection: the report, the staged files and how to start workers."""

    report: IsolationReport
    staging: str
    launch: object  # launch.WorkerLaunch
    worker: WorkerProcess | None = None  # the live probe worker, when asked to keep it


def detect_isolation(isolation: str = "auto") -> IsolationReport:
    """Start one worker at the requested level (``auto``: the strongest that works) and report
    the layers it actually turned on. Raises IsolationUnavailable for an impossible request."""
    limits, uids = Limits(), slot_uids.claim(1)
    groups = cgroups.CgroupLimits()
    try:
        groups = cgroups.setup()
        slot = groups.slot("probe", limits.memory_mb << 20, limits.max_processes)
        probe = probe_isolation(isolation, limits, cgroups=groups,
                                worker_config={**groups.worker_config(slot), **uids.worker_config(0)})
    finally:
        groups.remove()
        uids.release()
    shutil.rmtree(probe.staging, ignore_errors=True)
    return probe.report


def refuse_visible_filesystem(report: IsolationReport, allowed: bool) -> None:
    """Raise unless some layer hides the user's files or the user opted in (config or env)."""
    if report.filesystem_hidden or allowed or os.environ.get(ALLOW_VISIBLE_FS_ENV) == "1":
        return
    raise IsolationUnavailable(
        f"sandbox isolation {report.level!r} would let model-written code read and write your files "
        "(no bubblewrap, no Landlock); fix: apt-get install bubblewrap (or run on Linux >= 5.13 with "
        f"Landlock), or opt in with model.mode.init_args.sandbox.allow_visible_filesystem: true (SandboxPool("
        f"allow_visible_filesystem=True) in code) or {ALLOW_VISIBLE_FS_ENV}=1")


def probe_isolation(isolation: str, limits: Limits, keep_worker: bool = False, site_packages: bool = False,
                    cgroups=None, worker_config: dict | None = None) -> DetectedIsolation:
    """Detect the level by starting a worker; ``keep_worker`` hands that (fresh, unused) worker over
    in ``DetectedIsolation.worker`` instead of closing it, saving a pool one worker start (~0.1 s).
    ``cgroups`` (cgroups.CgroupLimits) and ``worker_config``: the pool's, for that first worker."""
    if isolation not in REQUESTS:
        raise ValueError(f"unknown isolation {isolation!r}; choose one of {', '.join(REQUESTS)}")
    try:
        bpf, seccomp_note = (build_filter_bpf(deny_exec=core_dumps.exec_must_be_denied()),
                             "syscall filter loaded in every child")
    except SeccompUnavailable as e:
        bpf, seccomp_note = None, str(e)
    staging = stage_worker_files(bpf)
    bwrap = shutil.which("bwrap")
    is_root = os.geteuid() == 0
    wanted = isolation
    if isolation == "auto":
        candidates = (["bwrap" if is_root else "bwrap-userns"] if bwrap else []) + ["process"]
    elif isolation == "bwrap" and not is_root:
        candidates = ["bwrap-userns"]
    else:
        candidates = [isolation]
    failures = []
    for level in candidates:
        if level != "process" and not bwrap:
            failures.append("bwrap not found")
            continue
        launch = build_launch(level, staging, limits, bwrap=bwrap, site_packages=site_packages,
                              cgroups=cgroups)
        try:
            worker = WorkerProcess(launch, startup_timeout=30.0, config=worker_config)
        except WorkerFailure as e:
            failures.append(f"{level}: {' '.join(str(e).split())[-300:]}")  # one line
            continue
        layers = dict(worker.layers)
        if not keep_worker:
            worker.close()
            worker = None
        cpu_share = (cgroups.cpu_share if layers.get("cpu_cgroup") and cgroups is not None
                     else "autogroup" if autogroup_enabled() else "none")
        return DetectedIsolation(_report(level, layers, seccomp_note, failures, cpu_share), staging, launch, worker)
    shutil.rmtree(staging, ignore_errors=True)
    fix = ("apt-get install bubblewrap (and allow user namespaces when not root), or isolation='process'"
           if wanted != "process" else "check that the base python interpreter runs")
    raise IsolationUnavailable(f"sandbox isolation {wanted!r} unavailable ({'; '.join(failures)}); fix: {fix}")


# What each process-limit mechanism (the worker's choice, inside/process_limit.py) means for a sample.
PROCESS_LIMITS = {
    "cgroup-pids": "the slot's pids cgroup holds all processes and threads of one execution",
    "slot-uid": "RLIMIT_NPROC of the slot's own uid (no writable pids cgroup): it counts one execution's "
                "processes and threads, not other workers' or other pools'",
    "userns": "RLIMIT_NPROC counted in the worker's own user namespace (Linux >= 5.14): one execution's "
              "processes and threads, not other workers'",
    "shared-uid": "RLIMIT_NPROC of a uid other processes share (other workers, pools, or your own): one "
                  "sample can keep another from starting a thread; fix: run as root (a pids cgroup or a uid "
                  "per slot) or with bubblewrap on Linux >= 5.14",
    "none": "the user namespace's uid is host root, whom RLIMIT_NPROC never binds; fix: use level bwrap",
}


# How the PIDs a child sees are kept from carrying anything from the execution before (the worker's
# choice, inside/pid_numbering.py; the process level as root mounts a /proc per child).
PID_NUMBERS = {
    "fixed": "each child gets the same PID in the worker's namespace whatever ran before (ns_last_pid set "
             "before each fork), and /proc shows a child its own processes only (hidepid)",
    "fixed-visible": "each child gets the same PID in the worker's namespace whatever ran before, but /proc "
                     "could not be remounted hidepid: the worker's and template's entries stay readable",
    "checked": "an execution that starts processes or threads is followed by a fresh worker (the next "
               "child's PID would show it: at most one bit per execution); /proc is closed by Landlock",
    "private-proc": "each child mounts a /proc of its own PID namespace (/proc/self is 1)",
    "host": "the children's PIDs come from a counter other executions move, visible in /proc/self; fix: "
            "use bubblewrap",
}


# What each CPU-share mechanism (IsolationReport.cpu_share) means for a sample beside others.
CPU_SHARES = {
    "cpu-cgroup-v1": "a cpu cgroup per worker slot (cpu.shares): one execution's processes share one slot's "
                     "weight, however many sessions they start (tasks in a cpu cgroup are not autogrouped)",
    "cpu-cgroup-v2": "a cpu cgroup per worker slot (cpu.weight): one execution's processes share one slot's "
                     "weight, however many sessions they start (tasks in a cpu cgroup are not autogrouped)",
    "autogroup": "no writable cpu cgroup, kernel.sched_autogroup_enabled=1: each session is weighed as one, so "
                 "a sample whose processes call setsid() gets up to max_processes times the CPU of another; "
                 "fix: run as root (or with a delegated cpu cgroup)",
    "none": "no writable cpu cgroup, no autogrouping: each process is weighed alone, so a sample gets up to "
            "max_processes times the CPU of another; fix: run as root (or with a delegated cpu cgroup)",
}


def _report(level: str, worker: dict, seccomp_note: str, failures: list[str],
            cpu_share: str = "none") -> IsolationReport:
    bwrap = level != "process"
    real_uid_drop = bool(worker.get("uid_drop"))
    child_uid = worker.get("child_uid")
    process_limit = worker.get("process_limit") or "shared-uid"
    abi = int(worker.get("landlock_abi") or 0)
    no_cores, cores_note = core_dumps.describe(bool(worker.get("seccomp")))
    pid_numbers = worker.get("pid_numbering") or "host"
    if pid_numbers == "fixed" and not worker.get("processes_hidden"):  # the hidepid remount failed
        pid_numbers = "fixed-visible"
    layers = {
        "filesystem_hidden": bwrap,
        "landlock": bool(worker.get("landlock")),
        "tmpfs_per_execution": bool(worker.get("tmpfs_per_execution")),
        "ipc_objects_denied": bool(worker.get("seccomp")),
        "cgroup_limits": bool(worker.get("cgroup")),
        "cpu_share_per_slot": cpu_share.startswith("cpu-cgroup"),
        "fresh_child_memory": bool(worker.get("child_template")),
        "no_core_dumps": no_cores,
        "network_namespace": bwrap or bool(worker.get("network_namespace")),
        "unix_sockets_drained": bool(worker.get("unix_drain")),
        "seccomp": bool(worker.get("seccomp")),
        "pid_namespace_per_execution": bool(worker.get("pid_namespace")),
        "pid_numbers_private": pid_numbers not in ("host", "fixed-visible"),
        "inode_numbers_private": bool(worker.get("inode_numbering")),
        "subreaper": bool(worker.get("subreaper")),
        "sandbox_uid": real_uid_drop or level == "bwrap-userns",
        "process_limit_per_execution": process_limit in ("cgroup-pids", "slot-uid", "userns"),
        "rlimits": True,
        "python_prefix_readable": bool(worker.get("prefix_reachable", True)),
        "env_scrubbed": True,
        "dies_with_parent": True,
    }
    notes = {
        "filesystem_hidden": "read-only /usr, /lib*, the python prefix; private /tmp" if bwrap
        else "the host's filesystem is mounted; Landlock decides what the child may open" if worker.get("landlock")
        else "the child sees the host filesystem (with its sandbox uid's permissions when root)",
        "network_namespace": "no interfaces but loopback" if bwrap or worker.get("network_namespace")
        else "network denied by seccomp only (host abstract UNIX sockets reachable)",
        "unix_sockets_drained": "an execution's unix sockets held only in flight (SCM_RIGHTS cycles, with "
        "their queued memory and abstract names) are collected before the next execution starts"
        if worker.get("unix_drain") else "the children share the host's network namespace: leftover unix "
        "sockets cannot be told from the host's (the kernel's collector is still run after each execution)",
        "landlock": (f"ABI {abi}: read-only interpreter and system paths, read-write only the "
                     "execution's temp dir" + (" and /dev/shm" if bwrap or worker.get("tmpfs_per_execution")
                                              else "") + ("; no TCP bind/connect" if abi >= 4 else "")
                     + ("; no abstract UNIX sockets or signals outside the execution" if abi >= 6 else ""))
        if worker.get("landlock") else ("the kernel has no Landlock (Linux >= 5.13 with it enabled)"
                                        if not abi else "not applied"),
        "tmpfs_per_execution": "a fresh tmpfs for the temp dir and /dev/shm whenever an execution left "
        "anything" if worker.get("tmpfs_per_execution") else
        "the temp dir (a directory of the worker's own) is emptied with fd-relative deletes; a worker "
        "that cannot empty it is recycled",
        "ipc_objects_denied": "SysV IPC and POSIX message queues denied by seccomp (nothing outlives an "
        "execution)" if worker.get("seccomp") else "no seccomp: as root the worker moves to a fresh IPC "
        "namespace when an execution leaves objects" if real_uid_drop else "IPC objects may outlive executions",
        "cgroup_limits": "memory (no swap) and pids limits for all processes of an execution together"
        if worker.get("cgroup") else "no writable cgroup here (needs root): per-process RLIMIT_AS and "
        "RLIMIT_NPROC only",
        "seccomp": seccomp_note,
        "cpu_share_per_slot": f"{cpu_share}: {CPU_SHARES.get(cpu_share, '')}",
        "fresh_child_memory": "children are forked from a template process that never reads a request or "
        "a result: a child's memory holds its own job only" if worker.get("child_template") else
        "children are forked from the worker, whose memory holds earlier executions' requests and results",
        "no_core_dumps": cores_note,
        "pid_namespace_per_execution": "killing its init kills every descendant, even after setsid()"
        if worker.get("pid_namespace") else "descendants are found through the subreaper and killed",
        "pid_numbers_private": PID_NUMBERS[pid_numbers],
        "inode_numbers_private": ("an execution that moved the inode counter of its temp dir's or /dev/shm's "
                                  "tmpfs is followed by " + ("a fresh tmpfs" if worker.get("tmpfs_per_execution")
                                                              else "a fresh worker")
                                  + " (what remains: at most one bit per execution, whether that happened)")
        if worker.get("inode_numbering") else "the temp dir is on a filesystem other processes share: "
        "the inode numbers an execution leaves are not watched",
        "sandbox_uid": (f"real uid {child_uid}, shared by every worker slot (no uid of their own could be "
                        f"claimed; see {slot_uids.BASE_ENV})" if child_uid == slot_uids.SHARED_UID
                        else f"real uid {child_uid}, this worker slot's own (one per slot, "
                             f"{slot_uids.BASE_ENV})") if real_uid_drop
        else ("uid 65534 inside the user namespace only" + (" (as root it maps to host root; use level bwrap)"
                                                            if os.geteuid() == 0 else "")
              if level == "bwrap-userns" else "not root: the child keeps your uid"),
        "process_limit_per_execution": f"{process_limit}: {PROCESS_LIMITS.get(process_limit, '')}",
        "rlimits": f"RLIMIT_AS, CPU, FSIZE, NOFILE, CORE={core_dumps.RLIMIT_CORE}" + (
            " (processes: the pids cgroup)" if process_limit == "cgroup-pids" else ", NPROC"),
        "python_prefix_readable": "" if worker.get("prefix_reachable", True) else
        "the sandbox uid cannot enter the python prefix: only modules the worker pre-imported will import",
    }
    if failures:
        notes["fallback"] = "; ".join(failures)
    return IsolationReport(level=level, layers=layers, notes=notes, process_limit=process_limit,
                           cpu_share=cpu_share)
