"""The sandbox's data types: what goes in (a Program) and what comes out (an ExecResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Status(str, Enum):
    """How one execution ended. Program failures are statuses, never exceptions."""

    OK = "ok"  # exited 0 (or sys.exit(0)/None) after running code, setup and probes
    ERROR = "error"  # an uncaught exception (see ExecResult.error_type) or a non-zero exit
    SYNTAX_ERROR = "syntax_error"  # the code did not compile (SyntaxError, IndentationError)
    TIMEOUT = "timeout"  # the worker's wall clock (or RLIMIT_CPU) ended it
    MEMORY = "memory"  # MemoryError: RLIMIT_AS was hit
    KILLED = "killed"  # ended by a signal other than our timeout (segfault, abort, ...)
    CANCELLED = "cancelled"  # stopped by SandboxPool.stop() or pool shutdown
    INTERNAL_ERROR = "internal_error"  # the sandbox itself failed (worker crash); worker respawned


@dataclass(frozen=True)
class Program:
    """What the child runs: ``code`` as ``__main__``, then trusted ``setup`` in the same globals,
    then each ``probes`` expression, whose value leaves the sandbox as plain data (one line each
    in ``ExecResult.probe_lines``, decoded by the parent with ``plain_data.loads``)."""

    code: str
    probes: tuple[str, ...] = ()
    setup: str = ""


@dataclass
class ExecResult:
    """The outcome of one execution. ``stdout``/``stderr`` are decoded utf-8 (errors="replace")
    and capped at the pool's ``max_output_bytes``; ``*_bytes`` count everything the program wrote."""

    exec_id: str
    status: Status
    returncode: int | None  # exit code, or -signal; None when the program never ran
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    tags: dict[str, str]
    probe_lines: list[str]  # raw JSON lines ({"i": k, "v": ...}); the parent judges them
    error_type: str | None = None  # exception type name for ERROR / MEMORY / SYNTAX_ERROR
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    probe_lines_truncated: bool = False
    isolation: str = ""  # the isolation level it ran under
    message: str = ""  # why the sandbox (not the program) failed, for INTERNAL_ERROR / CANCELLED
    values_bytes: int = 0  # everything written to the values stream (fd 3), kept or not
    values_lines: int = 0
    values_over: str = ""  # "lines" or "bytes": the values stream went over that cap (the rest dropped)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


@dataclass(frozen=True)
class ExecutionInfo:
    """One running or pending execution, as listed by ``SandboxPool.list``."""

    exec_id: str
    state: str  # "running" | "pending"
    tags: dict[str, str] = field(default_factory=dict)
    reference: bool = False
    submitted_at: float = 0.0  # time.monotonic()
    started_at: float | None = None
