"""Isolation levels, their detection, and the report that says which layers are on.

Levels, strongest first:
  bwrap         root: bubblewrap without a user namespace (mount, net, pid, ipc, uts namespaces),
                the child drops to the real uid 65534, rlimits, seccomp, a PID namespace per execution.
  bwrap-userns  an unprivileged user with user namespaces: the same namespaces, but uid 65534 exists
                only inside the user namespace (to the host the child is still you) and the worker
                has no capabilities, so descendants are killed through the subreaper, not a PID namespace.
  process       no bubblewrap (clusters): fork + rlimits + seccomp (the network is denied by seccomp
                only) + uid 65534 when root; the filesystem is NOT hidden.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field

from .launch import Limits, build_launch, stage_worker_files
from .seccomp_policy import SeccompUnavailable, build_filter_bpf
from .worker_process import WorkerFailure, WorkerProcess

LEVELS = ("bwrap", "bwrap-userns", "process")
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

    @property
    def weaker_than_bwrap(self) -> bool:
        return self.level != "bwrap"

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
class Probe:
    """What the pool keeps from detection: the report, the staged files and how to start workers."""

    report: IsolationReport
    staging: str
    launch: object  # launch.WorkerLaunch
    worker: WorkerProcess | None = None  # the live probe worker, when asked to keep it


def detect_isolation(isolation: str = "auto") -> IsolationReport:
    """Start one worker at the requested level (``auto``: the strongest that works) and report
    the layers it actually turned on. Raises IsolationUnavailable for an impossible request."""
    probe = probe_isolation(isolation, Limits())
    shutil.rmtree(probe.staging, ignore_errors=True)
    return probe.report


def probe_isolation(isolation: str, limits: Limits, keep_worker: bool = False) -> Probe:
    """Detect the level by starting a worker; ``keep_worker`` hands that (fresh, unused) worker
    over in ``Probe.worker`` instead of closing it, saving a pool one worker start (~0.1 s)."""
    if isolation not in REQUESTS:
        raise ValueError(f"unknown isolation {isolation!r}; choose one of {', '.join(REQUESTS)}")
    try:
        bpf, seccomp_note = build_filter_bpf(), "syscall filter loaded in every child"
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
        launch = build_launch(level, staging, limits, bwrap=bwrap)
        try:
            worker = WorkerProcess(launch, startup_timeout=30.0)
        except WorkerFailure as e:
            failures.append(f"{level}: {' '.join(str(e).split())[-300:]}")  # one line
            continue
        layers = dict(worker.layers)
        if not keep_worker:
            worker.close()
            worker = None
        return Probe(_report(level, layers, seccomp_note, failures), staging, launch, worker)
    shutil.rmtree(staging, ignore_errors=True)
    fix = ("apt-get install bubblewrap (and allow user namespaces when not root), or isolation='process'"
           if wanted != "process" else "check that the base python interpreter runs")
    raise IsolationUnavailable(f"sandbox isolation {wanted!r} unavailable ({'; '.join(failures)}); fix: {fix}")


def _report(level: str, worker: dict, seccomp_note: str, failures: list[str]) -> IsolationReport:
    bwrap = level != "process"
    real_uid_drop = bool(worker.get("uid_drop"))
    layers = {
        "filesystem_hidden": bwrap,
        "network_namespace": bwrap or bool(worker.get("network_namespace")),
        "seccomp": bool(worker.get("seccomp")),
        "pid_namespace_per_execution": bool(worker.get("pid_namespace")),
        "subreaper": bool(worker.get("subreaper")),
        "uid_65534": real_uid_drop or level == "bwrap-userns",
        "rlimits": True,
        "python_prefix_readable": bool(worker.get("prefix_reachable", True)),
        "env_scrubbed": True,
        "dies_with_parent": True,
    }
    notes = {
        "filesystem_hidden": "read-only /usr, /lib*, the python prefix; private /tmp" if bwrap
        else "the child sees the host filesystem (with uid 65534's permissions when root)",
        "network_namespace": "no interfaces but loopback" if bwrap or worker.get("network_namespace")
        else "network denied by seccomp only (host abstract UNIX sockets reachable)",
        "seccomp": seccomp_note,
        "pid_namespace_per_execution": "killing its init kills every descendant, even after setsid()"
        if worker.get("pid_namespace") else "descendants are found through the subreaper and killed",
        "uid_65534": "real uid 65534 (RLIMIT_NPROC binds)" if real_uid_drop
        else ("uid 65534 inside the user namespace only" + (" (as root it maps to host root: RLIMIT_NPROC "
              "does not bind; use level bwrap)" if os.geteuid() == 0 else "") if level == "bwrap-userns"
              else "not root: the child keeps your uid; RLIMIT_NPROC counts all your processes"),
        "rlimits": "RLIMIT_AS, CPU, FSIZE, NOFILE, NPROC, CORE=0",
        "python_prefix_readable": "" if worker.get("prefix_reachable", True) else
        "uid 65534 cannot enter the python prefix: only modules the worker pre-imported will import",
    }
    if failures:
        notes["fallback"] = "; ".join(failures)
    return IsolationReport(level=level, layers=layers, notes=notes)
