"""``console.log`` in the run directory: what the run printed, as the terminal showed it.

A SLURM job's output file is named by the job, not the run, and a requeued run's output is split
over several of them; a notebook's output is gone with the kernel. The run directory keeps its own
copy: stdout and stderr (Python's, and the log records of handlers that write to them), appended
on every resume, from the command's first line, which comes before the run directory is known:
until then it is held in memory.

Simplifications: only rank zero keeps one (the other ranks print what rank zero prints, or
nothing); output written below Python (a C library's, a child process's own) is not in it.
"""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path
from typing import TextIO

FILE_NAME = "console.log"


class ConsoleLog:
    """Copies ``sys.stdout`` and ``sys.stderr`` into ``console.log`` once ``attach`` names the folder."""

    def __init__(self) -> None:
        self._pending: io.StringIO | None = io.StringIO()
        self._file: TextIO | None = None
        self._originals: tuple[TextIO, TextIO] | None = None
        self._handlers: list[tuple[logging.StreamHandler, TextIO]] = []

    def start(self) -> ConsoleLog:
        out, err = sys.stdout, sys.stderr
        self._originals = (out, err)
        sys.stdout, sys.stderr = _Tee(out, self), _Tee(err, self)
        for handler in _stream_handlers():  # Lightning's and transformers' records go to the stream they got
            if handler.stream in (out, err):
                self._handlers.append((handler, handler.stream))
                handler.setStream(sys.stdout if handler.stream is out else sys.stderr)
        return self

    def attach(self, folder: Path) -> None:
        """From now on write to ``folder/console.log`` (appended), starting with what was held."""
        folder.mkdir(parents=True, exist_ok=True)
        self._file = open(folder / FILE_NAME, "a", encoding="utf-8", errors="replace")
        self._file.write(self._pending.getvalue() if self._pending is not None else "")
        self._file.flush()
        self._pending = None

    def stop(self) -> None:
        """Restore the streams and close the file (a process that keeps no log calls this early)."""
        if self._originals is not None:
            sys.stdout, sys.stderr = self._originals
            self._originals = None
        for handler, stream in self._handlers:
            handler.setStream(stream)
        self._handlers = []
        if self._file is not None:
            self._file.close()
            self._file = None
        self._pending = None

    def record(self, text: str) -> None:
        if self._file is not None:
            self._file.write(text)
        elif self._pending is not None:
            self._pending.write(text)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()


class _Tee:
    """A text stream writing to the terminal's stream and to the console log; anything else (isatty,
    fileno, encoding) is the terminal stream's, so libraries that check for a terminal still can."""

    def __init__(self, stream: TextIO, log: ConsoleLog) -> None:
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._log.record(text)
        return written

    def flush(self) -> None:
        self._stream.flush()
        self._log.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [logging.getLogger(), *(logger for logger in logging.root.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    return [handler for logger in loggers for handler in logger.handlers
            if type(handler) is logging.StreamHandler]
