"""No core dump leaves an execution, whatever the host's ``kernel.core_pattern`` is.

``RLIMIT_CORE=0`` stops only dumps to a file: a pipe pattern (``|/usr/share/apport/apport``,
``|systemd-coredump``) gets the whole core whatever the limit, and one execution handed nine 61 MB
cores to a root helper outside every layer. What holds instead, per pattern kind (fs/coredump.c):

  file    the dump needs RLIMIT_CORE >= one page: a limit of 1 writes nothing.
  pipe    RLIMIT_CORE == 1 is the kernel's own "never pipe this" value (it guards recursive dumps).
  socket  (``@/path``, Linux >= 6.16) the limit is ignored: only dumpability stops it.

So every child runs with RLIMIT_CORE 1 (soft and hard) and is not dumpable, and the seccomp filter
refuses to change either (setrlimit/prlimit64 of RLIMIT_CORE, prctl(PR_SET_DUMPABLE)). An exec makes
a process dumpable again; under a socket pattern the filter therefore refuses execve as well. Without
seccomp a program can lower its own limit to 0 (which a pipe pattern dumps) or exec: the report says so.
"""

from __future__ import annotations

from pathlib import Path

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")
RLIMIT_CORE = 1  # see above: 0 would let a pipe pattern dump


def pattern_kind(pattern: str | None = None) -> str:
    """"file", "pipe" or "socket" for a core_pattern (the host's when None)."""
    if pattern is None:
        try:
            pattern = CORE_PATTERN.read_text().strip()
        except OSError:
            pattern = ""
    return "pipe" if pattern.startswith("|") else "socket" if pattern.startswith("@") else "file"


def exec_must_be_denied() -> bool:
    """A socket pattern ignores RLIMIT_CORE, and an exec makes the process dumpable again."""
    return pattern_kind() == "socket"


def describe(seccomp: bool) -> tuple[bool, str]:
    """(no core can leave, how) for the isolation report."""
    kind = pattern_kind()
    if not seccomp:
        return False, (f"RLIMIT_CORE 1 and not dumpable, but without seccomp a program may lower the limit "
                       f"or exec a binary (dumpable again) and reach the host's {kind} core_pattern")
    if kind == "socket":
        return True, "not dumpable, locked by seccomp, and no exec (a socket core_pattern ignores RLIMIT_CORE)"
    return True, (f"RLIMIT_CORE 1 (a {kind} core_pattern never dumps at 1) and not dumpable, "
                  "both locked by seccomp")
