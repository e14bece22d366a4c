"""The sandbox worker: a long-lived process that runs one confined child per execution.

Standalone stdlib code, started as ``python -I -S worker_main.py`` (inside bubblewrap when available)
from a private copy of this directory. It must not import rlcode or anything from site-packages.

Protocol (one JSON object per line): the parent first sends the worker config, the worker answers
{"op": "hello", "layers": {...}}; then {"op": "run", ...} -> {"op": "result", ...}, one at a time.
While a child runs, {"op": "kill", "id": ...} ends it (status cancelled). EOF on stdin ends the
worker, and its child's whole tree with it. The worker, not the child, holds the clock.

The children are forked by the worker's template process (template.py), never by the worker itself,
whose memory holds every request and result it has handled.
"""

import ctypes
import gc
import json
import os
import select
import signal
import sys
import time

# Pre-imported so candidate programs find them loaded (fork shares them copy-on-write). Kept to what
# MBPP-style code imports (re, math, collections, heapq, itertools, ... cover nearly all of it):
# every pre-imported page makes each fork, copy-on-write fault and exit dearer (measured: the full
# stdlib-ish list cost ~35% more CPU per execution). Anything else imports on demand, as usual.
PREIMPORTS = (
    "array bisect cmath collections copy decimal fractions functools heapq itertools json math "
    "operator re"
).split()
for _name in PREIMPORTS:
    try:
        __import__(_name)
    except Exception:  # a build without sqlite3 or lzma still works
        pass

# -I leaves the script's directory off sys.path; our sibling modules live there.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import child_harness  # noqa: E402  (after the pre-imports: it binds what it needs at import)
import landlock  # noqa: E402
import outcome  # noqa: E402
import pid_numbering  # noqa: E402
import process_limit  # noqa: E402
import process_tree  # noqa: E402
import protocol_lines  # noqa: E402
import scratch  # noqa: E402
import slot_memory  # noqa: E402
import template  # noqa: E402
import unix_drain  # noqa: E402
import worker_mounts  # noqa: E402

CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
READ_CHUNK = 1 << 16
KILL_PREFIX = b'{"op":"kill"'  # how the parent's kill messages start (worker_process.py)
_libc = ctypes.CDLL(None, use_errno=True)


class Worker:
    def __init__(self, config: dict, proto_in: int, proto_out: int):
        self.config = config
        # Not dumpable: no process of another uid, and none without ptrace rights over us, can read
        # our memory through /proc/<pid>/mem (nor ptrace us); the template and every child inherit it.
        _libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(0), 0, 0, 0)
        os.environ.clear()  # already scrubbed by whoever started us; made exact here
        os.environ.update(config["env"])
        self.control = protocol_lines.LineReader(proto_in)
        self.proto_out = proto_out
        self.is_root = os.getuid() == 0
        self.in_bwrap = bool(config.get("in_bwrap"))
        self.seccomp = None
        if config.get("seccomp_bpf_path"):
            with open(config["seccomp_bpf_path"], "rb") as f:
                self.seccomp = child_harness.SeccompProgram(f.read())
        _libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
        if config.get("parent_pid") and os.getppid() != config["parent_pid"]:
            sys.exit(1)  # the parent died before the line above took effect
        self.subreaper = _libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0) == 0
        self.prefix_reachable = True
        self.own_network = self.in_bwrap  # bwrap gave us empty network and IPC namespaces
        if not self.in_bwrap and self.is_root:
            # Without bwrap but as root: empty network and IPC namespaces for the worker and all its
            # children (no network, not even the host's abstract UNIX sockets), once per worker.
            self.own_network = _libc.unshare(CLONE_NEWNET | CLONE_NEWIPC) == 0
        if config.get("python_prefix") and self.is_root:
            self.prefix_reachable = worker_mounts.expose_to_sandbox_user(config["python_prefix"])
        # Root under bwrap is in bwrap's mount namespace; root without it gets one of its own.
        can_mount = self.is_root and (self.in_bwrap or worker_mounts.private_mount_namespace())
        policy = None
        abi = landlock.abi_version() if config.get("landlock") else 0
        if abi:
            paths = config["landlock"]
            policy = landlock.Policy(abi, paths["read"], paths["devices"], paths.get("list", ()))
        # Root's children drop to their slot's own uid (the parent claims one per slot), else the
        # shared one; other users' children keep ours.
        self.child_uid = int(config.get("sandbox_uid") or child_harness.SHARED_UID) if self.is_root else None
        self.scratch = scratch.WorkerScratch(
            config["tmp_root"], owner=self.child_uid,
            mount=can_mount, private_shm=self.in_bwrap or can_mount, size_bytes=config["tmpfs_bytes"],
            inodes=config["tmp_inodes"], landlock_policy=policy, own_filesystem=self.in_bwrap)
        self.in_cgroup = self.is_root and self._join_cgroups(config.get("cgroup_procs") or {})
        self.process_limit = process_limit.mechanism(
            is_root=self.is_root, in_bwrap=self.in_bwrap,
            pids_cgroup=self.in_cgroup and bool(config.get("nproc_by_cgroup")),
            slot_uid=bool(config.get("sandbox_uid")), host_root=bool(config.get("host_root")))
        self.nproc_base = process_limit.nproc_base(self.process_limit, self.is_root)
        self.own_pidns = None
        if config.get("pid_namespace", True):
            self.own_pidns = self._probe_pid_namespace()
        # PIDs and /proc entries that carry nothing between executions (pid_numbering.py); without bwrap,
        # root's children each mount a /proc of their own PID namespace (child_harness._private_mounts)
        self.processes_hidden = self.in_bwrap and self.is_root and pid_numbering.hide_other_processes()
        self.pids = pid_numbering.PidNumbering(own_namespace=self.in_bwrap)  # bwrap gave us a PID namespace
        self.private_proc = not self.in_bwrap and self.is_root and self.own_pidns is not None
        self.landlock_flags = landlock.restrict_flags(abi) if policy is not None else 0
        self.last_child_pid = None
        self.shutting_down = False
        self.retire = False  # the template is gone: the parent retires us after this answer
        self.retire_reason = None  # why, when the result itself does not say (for the parent's log)
        self.early_kills: dict = {}  # ids killed before they started (insertion-ordered, bounded)
        self.template = None  # forked by main() once everything above is set up (template.py)
        self.unix_drain = None  # made by main() once the template's sockets exist (unix_drain.py)
        self.slot_memory = None  # made by main() once the template is charged to the slot (slot_memory.py)

    def _join_cgroups(self, procs: dict) -> bool:
        """Join the slot's cgroups (memory, pids and cpu, see the parent's cgroups.py): every
        child forked from now on is born in them, which costs an execution nothing, and, the
        worker being idle while a child runs, bounds each execution. Each child raises its own OOM
        score to the maximum, so the kernel's OOM killer takes the execution, not the worker."""
        paths = procs.get("bwrap" if self.in_bwrap else "host") or []
        try:
            for path in paths:
                with open(path, "w") as f:
                    f.write("0")  # "0": the writing process
        except OSError as e:
            sys.stderr.write(f"sandbox worker: could not join its cgroup ({e}); rlimits only\n")
            return False
        return bool(paths)

    def open_slot_memory(self):
        """The slot's memory cgroup, read after each execution (None without one)."""
        folders = self.config.get("memory_cgroup") or {}
        folder = folders.get("bwrap" if self.in_bwrap else "host")
        if not (self.in_cgroup and folder):
            return None
        try:
            return slot_memory.SlotMemory(folder)
        except (OSError, ValueError) as e:
            sys.stderr.write(f"sandbox worker: cannot read its memory cgroup ({e})\n")
            return None

    def _probe_pid_namespace(self):
        """Per-execution PID namespaces: unshare(CLONE_NEWPID) makes the *next* fork the init of a
        new namespace; setns() back to our own namespace re-arms unshare for the next execution.
        Killing that init kills everything inside, even descendants that called setsid()."""
        try:
            fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        for _ in range(2):
            if _libc.unshare(CLONE_NEWPID) != 0:
                os.close(fd)
                return None
            pid = os.fork()
            if pid == 0:
                os._exit(0 if os.getpid() == 1 else 1)
            if _libc.setns(fd, CLONE_NEWPID) != 0:
                os.waitpid(pid, 0)
                os.close(fd)
                return None
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                os.close(fd)
                return None
        return fd

    def layers(self) -> dict:
        return {"pid_namespace": self.own_pidns is not None, "uid_drop": self.is_root,
                "child_uid": self.child_uid, "process_limit": self.process_limit,
                "landlock_abi": landlock.abi_version(), "landlock": self.scratch.ruleset is not None,
                "tmpfs_per_execution": self.scratch.workdir.mounted,
                "cgroup": self.in_cgroup,
                "cpu_cgroup": self.in_cgroup and "cpu" in (self.config.get("cgroup_controllers") or ()),
                "seccomp": self.seccomp is not None, "prefix_reachable": self.prefix_reachable,
                "child_template": self.template is not None,
                "network_namespace": self.own_network, "subreaper": self.subreaper, "rlimits": True,
                "pid_numbering": self.pids.mode or ("private-proc" if self.private_proc else None),
                "processes_hidden": self.processes_hidden,
                "inode_numbering": self.scratch.numbering,
                "unix_drain": self.unix_drain is not None and self.unix_drain.available,
                "memory_settle": self.slot_memory is not None,
                "uid": os.getuid()}

    def serve(self) -> None:
        protocol_lines.write_line(self.proto_out, {"op": "hello", "layers": self.layers(), "pid": os.getpid()})
        while not self.shutting_down:
            line = self.control.read_line()
            if line is None:
                return
            message = json.loads(line)
            if message.get("op") == "kill":  # for a finished execution, or one not started yet
                self._remember_kill(message.get("id"))
                continue
            try:
                if self.retire or self.scratch.recycle:  # queued behind the execution that retired us
                    result = {"status": "internal_error", "requeue": True, "message": "this worker retires"}
                elif message["id"] in self.early_kills:
                    result = {"status": "cancelled", "message": "stopped before it started"}
                else:
                    result = self.execute(message)
            except Exception as exc:  # the sandbox's own failure: report, keep serving
                self.retire = self.retire or isinstance(exc, template.TemplateGone)
                result = {"status": "internal_error", "message": f"worker: {type(exc).__name__}: {exc}"}
            result.update(op="result", id=message["id"])
            if self.scratch.recycle or self.retire:  # the parent retires us once the queued executions are done
                result["recycle"] = True
            if self.retire_reason:
                result["retire_reason"], self.retire_reason = self.retire_reason, None
            protocol_lines.write_line(self.proto_out, result)

    def execute(self, request: dict) -> dict:
        result, self.last_child_pid = None, None
        try:
            result = self._run_child(request, self.scratch.workdir.path)
        finally:  # every process of the execution is gone: only what it left in flight remains
            left = self.unix_drain.drain()
            self.scratch.reset()
            if self.pids.moved_past(self.last_child_pid):  # the next child's PID would show it
                self.retire = True
            charged = None if self.slot_memory is None else self.slot_memory.settle(
                self.unix_drain.found > 0, _result_bytes(result))
        if left is not None:  # the next execution must not start beside it: a fresh worker takes it
            self.retire = True
            result.update(status="error", error_type="LeftoverUnixSockets", message=left)
        if charged is not None:  # nor on memory it still holds: the result stands, a fresh worker follows
            self.retire, self.retire_reason = True, charged
        return result

    def _run_child(self, request: dict, workdir: str) -> dict:
        """Have the template fork the child, hand it its job, and supervise it."""
        timeout = float(request["timeout"])
        limits = dict(self.config["limits"], RLIMIT_CPU=int(timeout) + 1)
        limits["RLIMIT_NPROC"] += self.nproc_base
        if self.process_limit == "cgroup-pids":
            del limits["RLIMIT_NPROC"]  # the pids cgroup bounds this execution alone
        limits["RLIMIT_AS"] = int(request.get("memory_mb") or self.config["memory_mb"]) << 20
        ruleset = self.scratch.ruleset
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        val_r, val_w = os.pipe()
        job = child_harness.encode_job([request["code"], request.get("setup") or "", *(request.get("probes") or ())])
        started = time.monotonic()
        try:
            pid, pidfd = self.template.spawn({"workdir": workdir, "limits": limits},
                                             [out_w, err_w, val_w] + ([] if ruleset is None else [ruleset]), job)
        except BaseException:
            for fd in (out_r, err_r, val_r):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, val_w):
                os.close(fd)
        self.last_child_pid = pid
        return self._supervise(pid, pidfd, request, started, timeout, out_r, err_r, val_r)

    def _supervise(self, pid, pidfd, request, started, timeout, out_r, err_r, val_r) -> dict:
        cap = int(request.get("max_output_bytes") or self.config["max_output_bytes"])
        values = outcome.ValueLines(int(self.config["max_values_bytes"]),
                                    len(request.get("probes") or ()) + outcome.VALUE_LINES_SPARE)
        streams = {out_r: outcome.Capped(cap), err_r: outcome.Capped(cap), val_r: values}
        poller = select.poll()
        for fd in (*streams, pidfd, self.control.fd):
            poller.register(fd, select.POLLIN)
        deadline = started + timeout
        reason = self._scan_control(request["id"])  # a kill may have arrived with the request
        exited = False
        while not exited and reason is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "timeout"
                break
            for fd, _ in poller.poll(max(1, int(remaining * 1000) + 1)):
                if fd in streams:
                    data = os.read(fd, READ_CHUNK)
                    if data:
                        streams[fd].add(data)
                    else:
                        poller.unregister(fd)
                elif fd == pidfd:
                    exited = True
                elif fd == self.control.fd:
                    reason = self._read_control(request["id"]) or reason
        if not exited:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:  # it exited meanwhile
                pass
        try:
            wait_status = self.template.wait_status()  # the template reaps the child
        finally:
            os.close(pidfd)
        duration = time.monotonic() - started
        if self.own_pidns is None:
            process_tree.kill_descendants(pid, spare=self.template.pid)
        for fd, stream in streams.items():  # whatever is still buffered; writers are all gone
            _drain(fd, stream)
            os.close(fd)
        return outcome.outcome(wait_status, reason, streams[out_r], streams[err_r], streams[val_r], duration)

    def _read_control(self, exec_id):
        try:
            self.control.fill()
        except OSError:
            self.control.eof = True
        if self.control.eof:
            self.shutting_down = True
            return "cancelled"
        return self._scan_control(exec_id)

    def _remember_kill(self, exec_id) -> None:
        self.early_kills[exec_id] = True
        while len(self.early_kills) > 1024:
            del self.early_kills[next(iter(self.early_kills))]

    def _scan_control(self, exec_id):
        reason = None
        pending = []
        while (line := self.control.pop()) is not None:
            if not line.startswith(KILL_PREFIX):  # a queued run: left for serve() to parse, once
                pending.append(line)
                continue
            killed = json.loads(line).get("id")
            if killed == exec_id:
                reason = "cancelled"
            else:  # for a queued execution (the parent pipelines two)
                self._remember_kill(killed)
        if pending:  # queued executions stay queued, in order
            self.control.buffer[:0] = b"".join(p + b"\n" for p in pending)
        return reason

def _result_bytes(result) -> int:
    """Roughly what a result holds in the worker's memory (an execution that raised holds none)."""
    if not isinstance(result, dict):
        return 0
    return (len(result.get("stdout") or "") + len(result.get("stderr") or "")
            + sum(len(line) for line in result.get("probe_lines") or ()))


def _drain(fd: int, stream) -> None:
    os.set_blocking(fd, False)
    while True:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:  # a writer survived (only possible without a PID namespace)
            return
        if not data:
            return
        stream.add(data)


def main() -> None:
    # Keep the protocol pipes on private fds; fds 0/1 point at /dev/null so a stray print cannot
    # corrupt the protocol, and the child starts from a clean fd table.
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    reader = protocol_lines.LineReader(proto_in)
    config_line = reader.read_line()
    if config_line is None:
        return
    worker = Worker(json.loads(config_line), proto_in, proto_out)
    worker.control = reader
    # Everything imported so far moves to the permanent generation: a child's garbage collections
    # then never walk (and copy-on-write) the pre-imported modules' objects.
    gc.collect()
    gc.freeze()
    # Before the hello: the parent sends no request before it, so the template's copy of our memory
    # holds the config line and nothing any execution sent or received.
    worker.template = template.start(worker)
    worker.unix_drain = unix_drain.UnixDrain(own_namespace=worker.own_network)
    worker.slot_memory = worker.open_slot_memory()  # after the template: its pages are the idle worker's
    try:
        worker.serve()
    finally:  # its child's tree is gone: nothing writes to its temp dir any more
        worker.template.close()
        worker.scratch.close()


if __name__ == "__main__":
    # SIGINT keeps Python's default handler (programs expect KeyboardInterrupt): Ctrl-C never
    # reaches us anyway, the parent starts us in a session of our own.
    main()
