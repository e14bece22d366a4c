"""The template: the process every execution's child is forked from. Standalone stdlib code (runs in
the worker, see worker_main.py).

A child forked from the worker itself inherited the worker's whole heap: the requests and results of
every earlier execution (other samples' code, their probe values), freed but not overwritten. A
sample that read its own memory (``/proc/self/maps`` and ``ctypes.string_at``) found the previous
correct sample's return values and handed them back as its own.

So the worker forks the template once, after its set-up and before it reads any request, and the
template forks the children. The template never sees a request or a result: per execution it gets
only the child's pipes, its job as a sealed memfd (which it never reads), and the few numbers its
confinement needs (temp dir, rlimits). Each child reads its own job from the memfd, so its memory
holds the template's pre-imported modules and its own job, nothing else.

Worker <-> template, over a SOCK_SEQPACKET pair (one message per datagram, fds by SCM_RIGHTS):
  worker:   {"workdir": ..., "limits": {...}}  + fds [stdout, stderr, values, job, (landlock)]
  template: "pid <n>" + [pidfd of the child]   (or "error <why>")
  template: "exit <wait status>"               (once the child is reaped)
The worker supervises the child through the pidfd (poll for its exit, SIGKILL it); the template
only reaps it, so a PID can never be reused under the worker's feet.
"""

import ctypes
import fcntl
import json
import os
import signal
import socket

import child_harness

CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
PR_SET_PDEATHSIG = 1
MESSAGE_BYTES = 1 << 16
MAX_FDS = 8
HIGH_FD = 16  # received fds move at or above this, clear of the child's fixed fds (0-4)
MFD_CLOEXEC, MFD_ALLOW_SEALING = 1, 2
F_ADD_SEALS = 1033
SEALS = 0x1 | 0x2 | 0x4 | 0x8  # seal, shrink, grow, write: the job can no longer change
_libc = ctypes.CDLL(None, use_errno=True)


class TemplateGone(RuntimeError):
    """The template process died or spoke garbage: the worker must be recycled."""


class Template:
    """The worker's handle on its template process."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock, self.pid = sock, pid

    def spawn(self, header: dict, fds: list, job: bytes):
        """Fork one child with ``fds`` (stdout, stderr, values, [landlock]) and its ``job``;
        returns (pid, pidfd). The job travels in a sealed memfd the template passes on unread."""
        job_fd = job_memfd(job)
        try:
            socket.send_fds(self.sock, [json.dumps(header).encode()], [*fds[:3], job_fd, *fds[3:]])
        except OSError as e:
            raise TemplateGone(f"template unreachable: {e}") from None
        finally:
            os.close(job_fd)
        message, pidfds = self._receive(1)
        if not message.startswith(b"pid ") or len(pidfds) != 1:
            for fd in pidfds:
                os.close(fd)
            raise OSError(message.decode("utf-8", "replace"))
        return int(message[4:]), pidfds[0]

    def wait_status(self) -> int:
        """The wait status of the child last spawned (blocks until the template has reaped it)."""
        message, _ = self._receive(0)
        if not message.startswith(b"exit "):
            raise TemplateGone(f"template said {message[:100]!r}")
        return int(message[5:])

    def _receive(self, max_fds: int):
        try:
            message, fds, _, _ = socket.recv_fds(self.sock, MESSAGE_BYTES, max(max_fds, 1))
        except OSError as e:
            raise TemplateGone(f"template unreachable: {e}") from None
        if not message:
            raise TemplateGone("the template exited")
        return message, fds

    def close(self) -> None:
        self.sock.close()  # EOF: the template exits (and the parent-death signal covers the rest)


def job_memfd(job: bytes) -> int:
    fd = os.memfd_create("job", MFD_CLOEXEC | MFD_ALLOW_SEALING)
    view = memoryview(job)
    while view:
        view = view[os.write(fd, view):]
    fcntl.fcntl(fd, F_ADD_SEALS, SEALS)
    return fd


def start(worker) -> Template:
    """Fork the template from ``worker`` (a worker_main.Worker, set up, before its first request)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            for fd in (worker.control.fd, worker.proto_out):  # it never sees a request or result
                os.close(fd)
            _libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
            code = _serve(worker, theirs)
        finally:
            os._exit(code)
    theirs.close()
    return Template(ours, pid)


def _serve(worker, sock: socket.socket) -> int:
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, MAX_FDS)
        except OSError:
            return 1
        if not message:
            return 0  # the worker closed its end
        try:
            moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD) for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        try:
            pid = _fork_child(worker, json.loads(message), moved)
        except Exception as e:  # the sandbox's own failure: reported, the template serves on
            sock.send(f"error template could not fork the child: {type(e).__name__}: {e}".encode())
            continue
        finally:
            for fd in moved:
                os.close(fd)
        pidfd = os.pidfd_open(pid)
        try:
            socket.send_fds(sock, [b"pid %d" % pid], [pidfd])
        finally:
            os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if worker.seccomp is None and worker.is_root:
            _drop_ipc_objects()
        sock.send(b"exit %d" % status)


def _fork_child(worker, header: dict, fds: list) -> int:
    workdir = header["workdir"]
    os.environ["HOME"] = os.environ["TMPDIR"] = workdir  # the child inherits our (scrubbed) environment
    landlock = len(fds) > 4
    plan = child_harness.Confinement(workdir=workdir, limits=header["limits"], uid=worker.child_uid,
                                     oom_first=worker.in_cgroup, seccomp_program=worker.seccomp,
                                     landlock=landlock, landlock_flags=worker.landlock_flags,
                                     private_proc=worker.private_proc, private_shm=not landlock)
    if worker.own_pidns is not None and _libc.unshare(CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID) failed")
    worker.pids.before_fork()
    try:
        pid = os.fork()
        if pid == 0:  # never returns
            child_harness.child_main(plan, fds)
    finally:  # back in our own namespace: the next unshare() makes a fresh one again
        if worker.own_pidns is not None:
            _libc.setns(worker.own_pidns, CLONE_NEWPID)
    return pid


def _drop_ipc_objects() -> None:
    """Without the seccomp filter (which denies creating them) SysV IPC objects could outlive the
    execution: if any exist, the template (whose children are the executions) moves to a fresh IPC
    namespace, freeing the old one whole."""
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}", "rb") as f:
                if len(f.read().splitlines()) > 1:  # a header line, then one line per object
                    _libc.unshare(CLONE_NEWIPC)
                    return
        except OSError:
            pass
