"""How one execution's outcome is read from what the worker saw. Standalone stdlib code (runs in
the worker, see worker_main.py): capped output, the wait status, the harness's status line."""

import json
import os
import signal


class Capped:
    """Keeps the first `cap` bytes of a stream and counts the rest without storing it."""

    def __init__(self, cap: int):
        self.cap, self.chunks, self.kept, self.total = cap, [], 0, 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - self.kept
        if room > 0:
            piece = data[:room]
            self.chunks.append(piece)
            self.kept += len(piece)

    def value(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def truncated(self) -> bool:
        return self.total > self.kept


def outcome(wait_status, reason, out, err, values, duration) -> dict:
    returncode = os.waitstatus_to_exitcode(wait_status)
    status_line = None
    probe_lines = []
    for raw in values.value().split(b"\n"):
        if raw.startswith(b'{"s":'):
            status_line = raw
        elif raw:
            probe_lines.append(raw.decode("utf-8", "replace"))
    reported, error_type = None, None
    if status_line is not None:
        try:
            parsed = json.loads(status_line)
            reported, error_type = parsed.get("s"), parsed.get("e")
        except ValueError:
            pass
    if reason is not None:
        status = reason
    elif reported == "confine_failed":
        status = "internal_error"
    elif returncode < 0:
        signum = -returncode
        stderr_text = err.value()[-2000:]
        if signum == signal.SIGXCPU:
            status = "timeout"
        elif b"MemoryError" in stderr_text or b"Cannot allocate memory" in stderr_text:
            status = "memory"
        else:
            status = "killed"
    elif reported in ("ok", "error", "syntax_error", "memory") and (reported != "ok" or returncode == 0):
        status = reported
    else:
        status = "ok" if returncode == 0 else "error"
    return {
        "status": status, "returncode": returncode, "error_type": error_type if status != "ok" else None,
        "stdout": out.value().decode("utf-8", "replace"), "stderr": err.value().decode("utf-8", "replace"),
        "stdout_truncated": out.truncated, "stderr_truncated": err.truncated,
        "stdout_bytes": out.total, "stderr_bytes": err.total,
        "probe_lines": probe_lines, "probe_lines_truncated": values.truncated, "duration_s": duration,
    }
