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


# Lines the values stream keeps beyond one per probe: the harness's status line, and room for lines
# candidate code writes itself (kept, so that a forged line beside the harness's still conflicts).
VALUE_LINES_SPARE = 16


class ValueLines(Capped):
    """The values stream (fd 3): keeps at most ``max_lines`` lines and ``cap`` bytes, counts the rest.

    Without the line cap, 8 MiB of one-byte lines became 4.2M probe lines: ~375 MB of the trusted
    parent's memory and ~20 s of its CPU per sample. Counting newlines past the cap is one C-level
    pass per chunk, so a flood costs the worker next to nothing either."""

    def __init__(self, cap: int, max_lines: int):
        super().__init__(cap)
        self.max_lines, self.lines_kept, self.lines, self.full = max_lines, 0, 0, False

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.lines += data.count(b"\n")
        if self.full:
            return
        piece = data[:self.cap - self.kept]
        room = self.max_lines - self.lines_kept
        if piece.count(b"\n") >= room:  # cut just after the last line there is room for
            end = -1
            for _ in range(room):
                end = piece.index(b"\n", end + 1)
            piece = piece[:end + 1]
        self.chunks.append(piece)
        self.kept += len(piece)
        self.lines_kept += piece.count(b"\n")
        self.full = len(piece) < len(data)

    @property
    def over(self) -> str:
        """Which cap the stream went over ("" when neither)."""
        if not self.truncated:
            return ""
        return "lines" if self.lines_kept >= self.max_lines and self.lines > self.lines_kept else "bytes"


ERROR_TYPE_CHARS = 200  # a status line is candidate-writable: its error field is cut to this
# The harness writes printable ASCII only (JSON with ensure_ascii). Any other byte makes a line
# malformed, and it is dropped here: 8 MiB of 0xFF decoded with errors="replace" and JSON-escaped had
# become a 48 MiB protocol line and ~200 MB of the parent's memory.
PRINTABLE_ASCII = bytes(range(0x20, 0x7F))


def outcome(wait_status, reason, out, err, values, duration) -> dict:
    returncode = os.waitstatus_to_exitcode(wait_status)
    status_line = None
    probe_lines = []
    for raw in values.value().split(b"\n"):
        if raw.translate(None, PRINTABLE_ASCII):  # what is left once printable ASCII is removed
            continue
        if raw.startswith(b'{"s":'):
            status_line = raw
        elif raw:
            probe_lines.append(raw.decode("ascii"))
    reported, error_type = None, None
    if status_line is not None:
        try:
            parsed = json.loads(status_line)
            reported, error_type = parsed.get("s"), parsed.get("e")
        except (ValueError, AttributeError):  # not JSON, or not an object
            pass
    if error_type is not None:
        error_type = str(error_type)[:ERROR_TYPE_CHARS]
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
        "values_bytes": values.total, "values_lines": getattr(values, "lines", len(probe_lines)),
        "values_over": getattr(values, "over", ""),
    }
