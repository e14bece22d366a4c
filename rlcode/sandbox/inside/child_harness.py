"""The forked child: confine itself, then run one Program. Standalone stdlib code.

This file is copied next to worker_main.py and imported by the worker before any candidate code
exists, so every function and type the harness needs is bound here, at import time. Candidate code
runs in the same process after confine() has made it harmless: a uid it cannot change, rlimits,
a seccomp filter, no inherited file descriptors except stdio and the values pipe (fd 3).
"""

import atexit
import builtins
import ctypes
import io
import linecache
import os
import resource
import signal
import sys
import traceback
import types

import landlock
import plain_encode

VALUES_FD = 3
LANDLOCK_FD = 4  # the worker's Landlock ruleset, until confine() has entered it
_HERE = os.path.dirname(os.path.abspath(__file__))
SHARED_UID = 65534  # root's children run as their slot's own uid; this one if none was claimed
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
EXIT_CONFINE_FAILED = 125
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18

# Bound before candidate code runs: rebinding builtins or module attributes cannot reach these.
_dumps = plain_encode.dumps
_landlock_restrict = landlock.restrict_self
_write = os.write
_exit = os._exit
_compile = compile
_eval = eval
_exec = exec
_type_name = type.__dict__["__qualname__"].__get__
_type = type
_str = str
_isinstance = isinstance
_BaseException = BaseException
_SystemExit = SystemExit
_MemoryError = MemoryError
_SyntaxError = SyntaxError
_format_exception_only = traceback.format_exception_only
_print_exception = traceback.print_exception
_run_exitfuncs = atexit._run_exitfuncs
_libc = ctypes.CDLL(None, use_errno=True)
# Resolved here, in the worker: a first attribute lookup in each child would build the function
# objects there (and pay their copy-on-write faults) every time.
_prctl_fn, _capset, _unshare, _mount = _libc.prctl, _libc.capset, _libc.unshare, _libc.mount


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[_write(fd, view):]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class SeccompProgram:
    """Raw BPF prepared in the worker; load() is one prctl() in the child."""

    def __init__(self, bpf: bytes):
        self._buffer = ctypes.create_string_buffer(bpf, len(bpf))
        self._prog = _SockFprog(len(bpf) // 8, ctypes.cast(self._buffer, ctypes.c_void_p))

    def load(self) -> None:
        if _prctl_fn(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(self._prog),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


# Prebuilt ctypes arguments: every object the child creates costs copy-on-write page faults, which
# dominate a fork-per-execution sandbox's CPU time (measured: ~440 faults for an empty program, half
# of them from building environment, rlimit and stdio objects that the worker can build once).
_ZERO = ctypes.c_ulong(0)
_ULONGS = {value: ctypes.c_ulong(value) for value in (0, 1, int(signal.SIGKILL))}


def _prctl(option: int, value: int) -> None:
    if _prctl_fn(option, _ULONGS.get(value) or ctypes.c_ulong(value), _ZERO, _ZERO, _ZERO) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


_CapData = ctypes.c_uint32 * 6  # effective, permitted, inheritable for two 32-bit words


_CAP_HEADER = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
_NO_CAPABILITIES = _CapData()


def _clear_capabilities() -> None:
    """setuid() to the sandbox uid already emptied the permitted and effective sets; bwrap's
    --cap-add also fills the inheritable set, which we empty too so no capability can come back,
    even by exec."""
    if _capset(ctypes.byref(_CAP_HEADER), ctypes.byref(_NO_CAPABILITIES)) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _private_mounts(shm: bool) -> None:
    """At the process level (no bwrap), as root and init of a fresh PID namespace: a private mount
    namespace (nothing propagates back) with a /proc that shows only this namespace (not every host
    process, and /proc/self is 1 whatever ran before) and, without Landlock (whose rule holds the
    worker's /dev/shm), an empty, size-limited /dev/shm (not the host's, where files would outlive
    us). Under bwrap /dev/shm exists per worker, and PIDs are handled there (pid_numbering.py).
    Best effort: without it the other layers still hold."""
    if os.getpid() != 1 or os.geteuid() != 0:
        return
    if _unshare(CLONE_NEWNS) != 0:
        return
    if _mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None) == 0:
        flags = ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _mount(b"proc", b"/proc", b"proc", flags, None)
        if shm:
            _mount(b"tmpfs", b"/dev/shm", b"tmpfs", flags, b"mode=1777,size=64m")


class Confinement:
    """What confine() applies, built by the worker before the fork (see _ZERO above). The child's
    environment is the worker's own: the worker sets it (scrubbed, plus HOME/TMPDIR) before forking."""

    def __init__(self, *, workdir: str, limits: dict, uid, seccomp_program,
                 landlock: bool = False, landlock_flags: int = 0, private_proc: bool = False,
                 private_shm: bool = False, oom_first: bool = False):
        self.workdir, self.uid, self.private_proc = workdir, uid, private_proc  # uid: None keeps ours
        self.private_shm = private_shm
        self.landlock, self.landlock_flags = landlock, landlock_flags  # enter the ruleset on LANDLOCK_FD
        self.oom_first = oom_first  # sharing the worker's cgroup: be the OOM killer's first pick
        self.seccomp_program = seccomp_program
        self.rlimits = [(getattr(resource, name), (value, value + 1) if name == "RLIMIT_CPU" else (value, value))
                        for name, value in limits.items()]


def confine(plan: Confinement) -> None:
    """Make this process harmless. Any failure raises: the caller exits before running code."""
    os.setsid()  # own session and process group: killpg reaches every non-escaping descendant
    if plan.oom_first:  # raising one's own score needs no privilege (lowering it would)
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, b"1000")
        finally:
            os.close(fd)
    if plan.private_proc:
        _private_mounts(plan.private_shm)
    os.chdir(plan.workdir)
    for which, pair in plan.rlimits:
        resource.setrlimit(which, pair)
    if plan.uid is not None:
        uid = plan.uid  # its gid is the same number
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError("uid drop did not take effect")
        _clear_capabilities()
    # The worker's death is ours too (and, as PID-namespace init, our descendants'). Set after the
    # uid change, which clears the parent-death signal.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # Not dumpable (the uid change sets fs.suid_dumpable's value, 2 on some hosts): no core dump
    # under any core_pattern, and no process without ptrace rights over us reads our memory.
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid binaries, and a filter that cannot be shed
    if plan.landlock:  # after the mounts (a Landlock domain may not change them) and the uid drop
        _landlock_restrict(LANDLOCK_FD, plan.landlock_flags)
        os.close(LANDLOCK_FD)
    if plan.seccomp_program is not None:
        plan.seccomp_program.load()


def child_main(plan: Confinement, fds) -> None:
    """The forked child (see template.py): its pipes in place, its job read, confined, then run.
    ``fds``: stdout, stderr and values pipes, the job's memfd, then the Landlock ruleset if any (all
    numbered above the fixed ones). Never returns."""
    try:
        os.dup2(fds[0], 1)  # fd 0 is already /dev/null (see worker_main.main())
        os.dup2(fds[1], 2)
        os.dup2(fds[2], VALUES_FD)
        last_kept = VALUES_FD
        if len(fds) > 4:  # entered, then closed, in confine()
            last_kept = os.dup2(fds[4], LANDLOCK_FD)
        code, setup, *probes = _read_job(fds[3])
        os.closerange(last_kept + 1, 1 << 16)  # the template's socket, the job, the ns fd, ...
        confine(plan)
    except BaseException as exc:
        try:
            os.write(2, f"sandbox confinement failed: {exc!r}\n".encode())
            os.write(VALUES_FD, b'{"s":"confine_failed","e":null}\n')
        finally:
            _exit(EXIT_CONFINE_FAILED)
    try:
        run(code, setup, probes)
    finally:
        _exit(1)


def encode_job(strings) -> bytes:
    """[code, setup, *probes] as the child reads them: their UTF-8 lengths on one line, then the
    bytes. (Not JSON: a first json.loads in a forked child costs ~60 copy-on-write page faults, this
    ~20.) surrogatepass keeps any string JSON could carry."""
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    return " ".join(str(len(e)) for e in encoded).encode() + b"\n" + b"".join(encoded)


def _read_job(fd: int) -> list:
    """This execution's job (encode_job), from the memfd the worker wrote: the only copy in our memory."""
    size = os.fstat(fd).st_size
    chunks, offset = [], 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    head, _, body = b"".join(chunks).partition(b"\n")
    strings, start = [], 0
    for length in head.split():
        end = start + int(length)
        strings.append(body[start:end].decode("utf-8", "surrogatepass"))
        start = end
    return strings


def _status(status: str, error_type=None) -> None:
    try:
        encoded = "null" if error_type is None else _dumps(error_type)  # a class name can hold anything
        _write_all(VALUES_FD, ('{"s":"%s","e":%s}\n' % (status, encoded)).encode())
    except _BaseException:
        pass


def _report_exception(exc) -> None:
    try:  # like the interpreter's own report, minus the harness's frame
        tb = exc.__traceback__
        if tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        _print_exception(_type(exc), exc, tb, file=sys.stderr)
    except _BaseException:
        try:
            _write(2, b"".join(s.encode("utf-8", "replace") for s in _format_exception_only(_type(exc), exc)))
        except _BaseException:
            pass


def _exit_code(exc) -> int:
    code = exc.code
    if code is None:
        return 0
    if _type(code) is int:
        return code & 0xFF
    try:
        sys.stderr.write(_str(code) + "\n")
    except _BaseException:
        pass
    return 1


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except _BaseException:
            pass


def _finish(status: str, code: int, error_type=None):
    """Like interpreter shutdown: join non-daemon threads, run atexit, flush, then report and exit."""
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
        _run_exitfuncs()
    except _BaseException:
        pass
    _flush_stdio()
    _status(status, error_type)
    _exit(code)


def _new_stdio() -> tuple:
    """Text streams on fds 0-2, like the interpreter's (utf-8; stderr backslashreplace, line-buffered)."""
    return (io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8",
                             errors="strict"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
                             errors="backslashreplace", line_buffering=True))


# Built once in the worker, never used there: each child inherits pristine, empty streams on the
# fds it has just pointed at its own pipes (the worker's sys.std* wrap its protocol pipes).
_CHILD_STDIO = _new_stdio()
# The worker's own streams, kept referenced so that replacing them in a child does not deallocate
# (and flush) them there: that cost ~90 copy-on-write faults per execution.
_WORKER_STDIO = (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__)


def _fresh_stdio() -> None:
    sys.stdin, sys.stdout, sys.stderr = _CHILD_STDIO
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = _CHILD_STDIO


def run(code: str, setup: str, probes) -> None:
    """Run code as __main__, then setup, then the probes; never returns."""
    _fresh_stdio()
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = ["<candidate>"]
    # The harness's helpers stay reachable through our bindings only, not by import name.
    for name in ("plain_encode", "child_harness", "worker_main", "outcome", "process_tree", "landlock",
                 "scratch", "worker_mounts", "process_limit", "template", "unix_drain", "slot_memory",
                 "pid_numbering", "protocol_lines"):
        sys.modules.pop(name, None)
    if sys.path and sys.path[0] == _HERE:
        del sys.path[0]
    scope = main.__dict__
    linecache.cache["<candidate>"] = (len(code), None, code.splitlines(True), "<candidate>")  # tracebacks show lines
    try:
        compiled = _compile(code, "<candidate>", "exec")
    except _BaseException as exc:  # SyntaxError, IndentationError, ValueError (null bytes), ...
        _report_exception(exc)
        kind = "syntax_error" if _isinstance(exc, _SyntaxError) else "error"
        _finish(kind, 1, _type_name(_type(exc)))
    for stage, program in (("code", compiled), ("setup", setup)):
        if stage == "setup" and not program:
            continue
        try:
            _exec(program if stage == "code" else _compile(program, "<setup>", "exec"), scope)
        except _SystemExit as exc:
            code_ = _exit_code(exc)
            _finish("ok" if code_ == 0 else "error", code_, None if code_ == 0 else "SystemExit")
        except _MemoryError as exc:
            _report_exception(exc)
            _finish("memory", 1, "MemoryError")
        except _BaseException as exc:
            _report_exception(exc)
            _finish("error", 1, _type_name(_type(exc)))
    for index, probe in enumerate(probes):
        try:
            value = _dumps(_eval(_compile(probe, "<probe>", "eval"), scope))
        except _SystemExit as exc:
            _flush_stdio()
            _finish("ok" if _exit_code(exc) == 0 else "error", _exit_code(exc), "SystemExit")
        except _BaseException as exc:
            try:
                message = "%s: %s" % (_type_name(_type(exc)), _str(exc))
            except _BaseException:
                message = _type_name(_type(exc))
            value = _dumps(message)
            value = '{"t":"raised","v":%s}' % value
        try:
            _write_all(VALUES_FD, ('{"i":%d,"v":%s}\n' % (index, value)).encode())
        except _BaseException:
            _exit(1)
    _finish("ok", 0)
