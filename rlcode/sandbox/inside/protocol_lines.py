"""The worker's protocol framing: one JSON object per line over raw file descriptors, which the
worker also polls (so no buffered file objects). Standalone stdlib code, like all of ``inside/``."""

import json
import os


class LineReader:
    """Line framing over a raw fd that is also polled (so no buffered file object)."""

    def __init__(self, fd: int):
        self.fd, self.buffer, self.eof = fd, bytearray(), False

    def fill(self) -> None:
        data = os.read(self.fd, 1 << 20)
        if data:
            self.buffer += data
        else:
            self.eof = True

    def pop(self):
        end = self.buffer.find(b"\n")
        if end < 0:
            return None
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 1]
        return line

    def read_line(self):
        while True:
            line = self.pop()
            if line is not None or self.eof:
                return line
            self.fill()


def write_line(fd: int, obj) -> None:
    """One JSON object as one line, written whole (a pipe may take it in parts)."""
    view = memoryview(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    while view:
        view = view[os.write(fd, view):]
