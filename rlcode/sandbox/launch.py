"""How a worker is started at each isolation level: its files, command line, environment and config.

The worker runs the *base* interpreter (not the venv's) with ``-I -S``, from a private read-only copy
of the stdlib-only files in ``inside/``, so nothing from the project or site-packages is visible or importable.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .core_dumps import RLIMIT_CORE
from .inside.scratch import clear_directory

log = logging.getLogger(__name__)

INSIDE_DIR = Path(__file__).parent / "inside"  # the code that runs inside the sandbox
WORKER_FILES = ("worker_main.py", "child_harness.py", "outcome.py", "process_tree.py", "plain_encode.py",
                "landlock.py", "scratch.py", "worker_mounts.py", "process_limit.py", "template.py",
                "unix_drain.py", "slot_memory.py", "protocol_lines.py", "pid_numbering.py")
WORKER_DIR_IN_SANDBOX = "/sandbox-worker"
SECCOMP_FILE = "seccomp.bpf"
# Capabilities the worker (real root inside bwrap, no user namespace) needs: per-execution PID
# namespaces (SYS_ADMIN), dropping the child to its slot's uid (SETUID/SETGID), killing it (KILL),
# handing it a temp dir and deleting whatever it left there (CHOWN, DAC_OVERRIDE, FOWNER).
# The child loses all of them when it drops its uid.
WORKER_CAPABILITIES = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN",
                       "CAP_DAC_OVERRIDE", "CAP_FOWNER")
ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")
# Host-wide /proc tables that hold what a process chose to put there, covered with an empty file in
# the worker's /proc (bwrap levels; docs/sandbox.md lists every entry reviewed and why
# the rest may stay).
MASKED_PROC_FILES = ("/proc/locks",)
EMPTY_FILE = "empty"  # in the staging directory


@dataclass
class Limits:
    """Per-execution resource limits (the pool's configuration, shipped to every worker)."""

    memory_mb: int = 1024
    max_output_bytes: int = 65536
    max_values_bytes: int = 8 << 20
    max_processes: int = 64  # the pids cgroup, else RLIMIT_NPROC (counts threads; inside/process_limit.py)
    max_file_bytes: int = 64 << 20  # RLIMIT_FSIZE
    max_open_files: int = 256  # RLIMIT_NOFILE
    tmpfs_bytes: int = 256 << 20  # size of an execution's temp dir and of /dev/shm (each a tmpfs)
    tmp_inodes: int = 16384  # files and directories in each of them (inodes cost kernel memory)

    def rlimits(self) -> dict[str, int]:
        return {"RLIMIT_FSIZE": self.max_file_bytes, "RLIMIT_NOFILE": self.max_open_files,
                "RLIMIT_NPROC": self.max_processes, "RLIMIT_CORE": RLIMIT_CORE}


@dataclass
class WorkerLaunch:
    level: str
    argv: list[str]
    env: dict[str, str]
    config: dict = field(default_factory=dict)  # the worker's first protocol line


def base_interpreter() -> tuple[str, str]:
    """(real python binary, its prefix): the venv's python resolved to the interpreter it wraps."""
    executable = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return executable, os.path.realpath(sys.base_prefix)


STAGING_PREFIX = "rlcode-sandbox-"
OWNER_FILE = "owner.pid"


def stage_worker_files(seccomp_bpf: bytes | None) -> str:
    """Copy the worker's files into a private directory (0700, root's when we are root)."""
    _remove_orphaned_stagings()
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX)
    (Path(staging) / OWNER_FILE).write_text(str(os.getpid()))
    for name in WORKER_FILES:
        shutil.copyfile(INSIDE_DIR / name, Path(staging) / name)
    (Path(staging) / EMPTY_FILE).write_bytes(b"")
    if seccomp_bpf is not None:
        (Path(staging) / SECCOMP_FILE).write_bytes(seccomp_bpf)
    return staging


def _remove_orphaned_stagings() -> None:
    """A parent killed with SIGKILL leaves its staging directory (its processes die with it):
    remove those whose owner is gone."""
    for path in Path(tempfile.gettempdir()).glob(STAGING_PREFIX + "*"):
        try:
            owner = int((path / OWNER_FILE).read_text())
            os.kill(owner, 0)
        except ProcessLookupError:
            remove_staging(path)
        except (OSError, ValueError):
            pass  # not ours to judge (no owner file yet, or another user's)


def remove_staging(path: str | os.PathLike) -> bool:
    """Delete a pool's staging directory, however deep a sandboxed program made the tree in it.

    ``shutil.rmtree`` recurses (a RecursionError past ~1,000 levels, which ``ignore_errors`` does
    not catch) and joins paths (ENAMETOOLONG past PATH_MAX); the workers' fd-relative walk does
    neither. It never leaves ``path``: it checks each directory it climbs back to. False (and the
    directory left in place) when something could not be removed in time.
    """
    if not os.path.isdir(path) or os.path.islink(path):
        return not os.path.lexists(path)
    if clear_directory(os.fspath(path), time.monotonic() + 60.0):
        try:
            os.rmdir(path)
            return True
        except OSError:
            pass
    log.warning("Could not delete the sandbox staging directory %s: remove it by hand.", path)
    return False


def sandbox_env(prefix: str) -> dict[str, str]:
    """The whole environment a sandboxed program sees (HOME/TMPDIR are set per execution)."""
    return {"PATH": f"{prefix}/bin:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}


def build_launch(level: str, staging: str, limits: Limits, *, bwrap: str | None = None,
                 site_packages: bool = False, cgroups=None) -> WorkerLaunch:
    """How to start a worker at ``level``; ``site_packages``: let children read the base
    interpreter's site-packages (default: the standard library only); ``cgroups``: the pool's
    ``cgroups.CgroupLimits``, made reachable to root workers' children (see cgroups.py)."""
    use_cgroups = cgroups is not None and cgroups.active and level != "bwrap-userns"
    executable, prefix = base_interpreter()
    env = sandbox_env(prefix)
    has_seccomp = os.path.exists(os.path.join(staging, SECCOMP_FILE))
    if level == "process":
        # Each worker makes its own temp dir in tmp_root (inside/scratch.py). The sandbox uids must
        # reach theirs by path (TMPDIR, HOME), but need not list the others'.
        worker_dir, tmp_root = staging, os.path.join(staging, "tmp")
        os.makedirs(tmp_root, exist_ok=True)
        os.chmod(tmp_root, 0o711)
        os.chmod(staging, 0o711)
        argv = [executable, "-I", "-S", os.path.join(staging, "worker_main.py")]
    else:
        worker_dir, tmp_root = WORKER_DIR_IN_SANDBOX, "/tmp"
        argv = [bwrap or "bwrap", *_bwrap_arguments(level, staging, executable, prefix, env, limits),
                *([] if site_packages else _hide_site_packages(prefix)),
                *(cgroups.bind_arguments() if use_cgroups else []),
                "--", executable, "-I", "-S", f"{WORKER_DIR_IN_SANDBOX}/worker_main.py"]
    config = {
        "env": env, "limits": limits.rlimits(), "memory_mb": limits.memory_mb,
        "max_output_bytes": limits.max_output_bytes, "max_values_bytes": limits.max_values_bytes,
        "tmp_root": tmp_root, "in_bwrap": level != "process",
        "tmpfs_bytes": limits.tmpfs_bytes, "tmp_inodes": limits.tmp_inodes,
        "landlock": landlock_paths(level, executable, prefix, site_packages),
        # The pids cgroup bounds each execution; RLIMIT_NPROC is dropped where it holds.
        "nproc_by_cgroup": use_cgroups and "pids" in cgroups.pool_dirs,
        "host_root": is_host_root(),  # which process limit binds (inside/process_limit.py)
        "seccomp_bpf_path": os.path.join(worker_dir, SECCOMP_FILE) if has_seccomp else None,
        "python_prefix": prefix if level == "process" else None,  # bwrap binds it reachable itself
    }
    return WorkerLaunch(level=level, argv=argv, env=dict(env), config=config)


def is_host_root() -> bool:
    """We run as root of the initial user namespace, whom the kernel never holds to RLIMIT_NPROC
    (root in a rootless container maps to another uid and is held to it)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map") as f:
            return any(line.split()[:2] == ["0", "0"] for line in f)
    except OSError:
        return False


def landlock_paths(level: str, executable: str, prefix: str, site_packages: bool) -> dict:
    """What a child may read under Landlock: the system's programs and libraries, the interpreter
    (its standard library, not its site-packages unless asked), a few /etc files and devices; plus
    /proc at ``bwrap``, where it shows only the child's own processes (hidepid, pid_numbering.py).
    At ``bwrap-userns`` the worker and template run as the child's uid, so their entries (whose
    counters move with what the last execution did) would be readable: /proc stays closed there."""
    read = ["/usr", *ROOT_LINKS, *ETC_FILES, executable]
    # Under bwrap an empty tmpfs covers site-packages (_hide_site_packages): the prefix can be one
    # rule. Without it the rules go around site-packages, ~200 of them, which costs each child
    # ~0.1 ms more to enter (Landlock merges the rules into the child's domain).
    read += [prefix] if site_packages or level != "process" else _stdlib_paths(prefix)
    if level == "bwrap":
        read.append("/proc")
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    listed = [prefix, os.path.dirname(stdlib), stdlib]  # imports list these (names only, no files)
    return {"read": read, "list": listed,
            "devices": ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]}


SITE_DIRS = ("site-packages", "dist-packages")


def _stdlib_paths(prefix: str) -> list[str]:
    """Everything under the prefix except the stdlib folder's site-packages (Landlock allows whole
    subtrees, so the prefix is listed two levels down around it)."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    if not stdlib.startswith(prefix.rstrip("/") + "/"):
        return [prefix, stdlib]  # an unusual layout: the stdlib (and its packages) wherever it is
    paths, parent = [], prefix
    for part in os.path.relpath(stdlib, prefix).split(os.sep) + [""]:
        here = os.path.join(parent, part) if part else None
        for name in _listdir(parent):
            path = os.path.join(parent, name)
            if path != here and not (parent == stdlib and name in SITE_DIRS):
                paths.append(path)
        if here is None:
            break
        parent = here
    return paths


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _hide_site_packages(prefix: str) -> list[str]:
    """bwrap arguments covering the interpreter's site-packages with an empty read-only tmpfs."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    args = []
    for name in SITE_DIRS:
        path = os.path.join(stdlib, name)
        if os.path.isdir(path) and path.startswith(prefix.rstrip("/") + "/"):
            args += ["--perms", "0555", "--tmpfs", path]
    return args


def _bwrap_arguments(level, staging, executable, prefix, env, limits) -> list[str]:
    args = ["--die-with-parent", "--new-session"]
    if level == "bwrap":  # real root: no user namespace, so the child's slot uid is real
        args += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        for capability in WORKER_CAPABILITIES:
            args += ["--cap-add", capability]
    else:  # bwrap-userns: an unprivileged user; every namespace including a user namespace
        args += ["--unshare-all", "--uid", "65534", "--gid", "65534"]
    args += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for path in ROOT_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    bound = ["/usr"]
    for path in sorted({prefix, os.path.dirname(executable)}):  # a parent sorts before its children
        if not _covered(path, bound):
            args += _parents_0755(path) + ["--ro-bind", path, path]
            bound.append(path)
    args += ["--ro-bind", staging, WORKER_DIR_IN_SANDBOX, "--dev", "/dev", "--proc", "/proc"]
    for path in MASKED_PROC_FILES:
        args += ["--ro-bind", os.path.join(staging, EMPTY_FILE), path]
    args += ["--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp",
             "--perms", "1777", "--size", str(limits.tmpfs_bytes), "--tmpfs", "/dev/shm", "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args + ["--chdir", "/tmp"]


def _covered(path: str, bound: list[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in bound)


def _parents_0755(path: str) -> list[str]:
    """bwrap (as root) creates the parents of a bind target 0700 on its tmpfs root; the sandbox
    uids must traverse them (e.g. a pyenv interpreter under root's home), so create them 0755 first."""
    args = []
    parts = Path(path).parts[1:-1]
    for i in range(len(parts)):
        args += ["--perms", "0755", "--dir", "/" + "/".join(parts[: i + 1])]
    return args
