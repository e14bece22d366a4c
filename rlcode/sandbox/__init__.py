"""A local code sandbox for running untrusted model-written Python thousands of times per RL step.

    from rlcode.sandbox import Program, SandboxPool, wait
    with SandboxPool() as pool:                       # one worker per core + a reference worker
        result = pool.submit(Program("def f(x): return x + 1", probes=("f(1)",))).result()
        result.status, result.probe_lines             # Status.OK, ['{"i":0,"v":2}']

Trust boundary, in the layout: ``inside/`` holds the only code that runs inside the sandbox (the
worker's main loop, the child harness, process-tree killing, outcome reporting, the plain-data
encoder); it must assume candidate code beside it. Every other module here is the trusted parent
side and never runs candidate code, but reads what the sandbox sends (result lines, probe values) as
hostile input: pool and worker slots, launch and isolation detection, the seccomp policy,
plain-data decoding, the parent-side assert evaluator and verdicts.

Process model: the trainer's pool hands executions (futures, tags) to long-lived
workers; each worker runs the base interpreter with ``-I -S`` from a private copy of the stdlib-only
files in ``inside/``, inside bubblewrap, with MBPP's usual stdlib
modules pre-imported, and forks one child per execution. The child becomes init of a fresh PID
namespace, drops to its worker slot's own uid (slot_uids.py), applies rlimits and a seccomp filter,
runs the program in a private temp dir with a scrubbed environment and empty stdin. The worker holds
the clock, drains and caps the output, and kills the child, which takes its whole tree (even
setsid'd descendants) with it.
``detect_isolation().describe()`` lists which layers are on; see isolation.py for the levels.

Child protocol: ``code`` runs as ``__main__`` (SyntaxError -> syntax_error), then the trusted
``setup`` in the same globals, then each probe expression; values leave as plain data, one JSON line
per probe on fd 3, forwarded raw in ``ExecResult.probe_lines`` for the parent to decode. Candidate code
*can* write that fd too: the channel carries values, never verdicts, and expected values never enter
a candidate's process (they are computed on the reference worker, ``submit(..., reference=True)``).

Behaviours worth knowing:
  * The child is PID 1 of its namespace: ``os.getpid() == 1``, and a signal it sends itself without
    a handler is ignored (init semantics). Under bwrap, /proc shows the worker's sandbox, not the
    child's namespace (a per-child /proc costs ~3 ms; the process level mounts one, see below).
  * Subprocesses are allowed (``python -c`` inside works): they inherit every layer and die with the
    execution. ``max_processes`` (default 64, processes *and threads*) and ``memory_mb`` bound an
    execution as a whole through its worker slot's cgroup where one is writable (root; see
    cgroups.py); elsewhere RLIMIT_AS (per process) and RLIMIT_NPROC, which counts per uid: the
    slot's own as root, a worker's own user namespace under bwrap-userns (Linux >= 5.14), and is
    shared only at the process level as another user (``IsolationReport.process_limit`` says which).
  * Landlock (where the kernel has it, at every level): the child may read the system's programs
    and libraries and the interpreter's standard library, write only its temp dir and /dev/shm, and
    open no TCP connection. The base interpreter's site-packages stay out of reach unless
    ``SandboxPool(site_packages=True)``. With neither bubblewrap nor Landlock the pool refuses to
    start unless ``allow_visible_filesystem=True`` or RLCODE_SANDBOX_ALLOW_VISIBLE_FS=1.
  * stdout/stderr are capped at ``max_output_bytes`` each (the rest is counted, not stored) and
    decoded as utf-8 with errors="replace"; probe lines are capped at 8 MiB.
  * Each execution starts from the worker's pristine state: module changes, files in its temp dir
    and /dev/shm do not carry over (root workers replace a dirty tmpfs whole; others delete with
    fd-relative calls and are recycled if that fails); SysV IPC and POSIX message queues cannot be
    created (seccomp); ``random`` is reseeded in every child.
  * Nothing of an execution stays in the kernel for the next: once its processes are gone, the
    only objects that can remain are unix sockets held in flight (SCM_RIGHTS cycles), with what is
    queued in them (memory charged to the slot) and their abstract names. The worker checks its
    children's network namespace after every execution (its socket count, then /proc/net/unix
    when the count is not the worker's own) and, if any are left, runs the kernel's unix
    collector and waits for them, at most 2 s (else ``error:
    LeftoverUnixSockets`` and the worker retires): inside/unix_drain.py. Not at the process level as
    another user, whose children share the host's network namespace. What the collected sockets
    carried is freed after them (the kernel defers those last fputs: 200+ MiB of memfds took 30-45
    ms more), so where the slot has a memory cgroup the worker then reads its usage (one pread)
    and, when sockets were left or the usage rose past a margin (the result it holds, the kernel's
    per-CPU batches, 4 MiB), waits until the memory no process can give back (usage less page
    cache) is back within that margin of the idle worker's, at most 2 s; else the result stands and
    the worker retires (the parent logs why): inside/slot_memory.py.
  * No host-wide table or budget is shared: file locks (a host-wide table, /proc/locks, which bwrap
    levels also show empty), Linux AIO (fs.aio-max-nr), inotify, keyrings, SysV IPC and io_uring
    are denied by seccomp (locks with ENOLCK); docs/sandbox.md lists every /proc entry
    and global counter reviewed and how each is held.
  * The parent's memory and work per sample are bounded: the values stream keeps one line per
    probe + 16 and 8 MiB, and every string that reaches a verdict is cut (docs/sandbox.md: the limits table).
  * Level ``process`` (no bubblewrap): the host filesystem is mounted, and Landlock decides what the
    child may open (the host's /proc not at all). As root it still gets a PID namespace per child,
    empty network and IPC namespaces and private tmpfs scratch dirs per worker, and a python prefix
    hidden under a 0700 directory made reachable read-only. As another user the child keeps that
    user's uid.
"""

from .isolation import IsolationReport, IsolationUnavailable, detect_isolation
from .pool import SandboxPool, wait
from .result import ExecResult, ExecutionInfo, Program, Status

__all__ = ["ExecResult", "ExecutionInfo", "IsolationReport", "IsolationUnavailable", "Program",
           "SandboxPool", "Status", "detect_isolation", "wait"]
