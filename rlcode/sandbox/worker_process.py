"""The parent's handle on one worker process: start it, send one execution, read its answer."""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
import threading
import time

from .launch import WorkerLaunch


class WorkerFailure(RuntimeError):
    """The worker died, hung or spoke garbage. The execution gets status internal_error."""


class WorkerProcess:
    """One long-lived worker. Not thread-safe except for ``kill_execution`` and ``close``."""

    def __init__(self, launch: WorkerLaunch, startup_timeout: float = 30.0, config: dict | None = None):
        """Start the worker and wait for its hello (which lists the layers it could turn on).

        Call this from a thread that outlives the worker: PR_SET_PDEATHSIG (bwrap's
        --die-with-parent) fires when the *thread* that started the process exits. ``config``: this
        worker's own additions to the launch's config (its slot's cgroups).
        """
        self.launch = launch
        self._stderr = tempfile.TemporaryFile()
        self._write_lock = threading.Lock()
        self._buffer = bytearray()
        self.executions = 0
        self.retiring = False  # set by the slot: close once the executions sent have answered
        try:
            self._process = subprocess.Popen(
                launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                env=launch.env, start_new_session=True, close_fds=True, bufsize=0, cwd="/")
        except OSError as e:
            raise WorkerFailure(f"could not start the worker ({launch.argv[0]}): {e}") from None
        config = {**launch.config, **(config or {})}
        if launch.level == "process":  # inside bwrap our pid is invisible; --die-with-parent covers it
            config["parent_pid"] = os.getpid()
        self._send(config)
        hello = self._read_message(time.monotonic() + startup_timeout)
        if hello.get("op") != "hello":
            self.close()
            raise WorkerFailure(f"worker said {hello!r:.200} instead of hello")
        self.layers: dict = hello.get("layers", {})
        self.pid: int = self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def run(self, request: dict, deadline: float) -> dict:
        """Send one execution and wait for its result until ``deadline`` (time.monotonic())."""
        self.send(request)
        return self.receive(request["id"], deadline)

    def send(self, request: dict) -> None:
        """Queue one execution; the worker runs them in order (see receive)."""
        self._send(request)
        self.executions += 1

    def receive(self, exec_id: str, deadline: float) -> dict:
        """The result of ``exec_id``, the oldest execution sent and not yet received."""
        while True:
            message = self._read_message(deadline)
            if message.get("op") != "result":
                continue
            if message.get("id") != exec_id:
                # Results come back in the order sent: anything else is a broken protocol, and
                # waiting would only hold the future until its deadline. The slot respawns the worker.
                raise WorkerFailure(f"worker answered {message.get('id')!r} while {exec_id!r} was due")
            return message

    def kill_execution(self, exec_id: str) -> None:
        # Serialised as '{"op":"kill",...': the worker recognises kills by that prefix.
        try:
            self._send({"op": "kill", "id": exec_id})
        except WorkerFailure:
            pass

    def close(self, grace: float = 2.0) -> None:
        """EOF on stdin: the worker kills its child's tree and exits; SIGKILL if it lingers."""
        with self._write_lock:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        try:
            self._process.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()
        try:
            self._process.stdout.close()
        except OSError:
            pass
        self._stderr.close()

    def kill(self) -> None:
        try:
            os.killpg(self._process.pid, 9)  # bwrap and everything it started (own session)
        except OSError:
            pass
        try:
            self._process.kill()
            self._process.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def stderr_tail(self, limit: int = 2000) -> str:
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - limit))
            return self._stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def _send(self, message: dict) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._write_lock:
            try:
                self._process.stdin.write(data)
            except (OSError, ValueError) as e:  # BrokenPipe, or closed
                raise WorkerFailure(f"worker gone ({e}); stderr: {self.stderr_tail()}") from None

    def _read_message(self, deadline: float) -> dict:
        fd = self._process.stdout.fileno()
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[:end + 1]
                try:
                    return json.loads(line)
                except ValueError:
                    raise WorkerFailure(f"unreadable worker message {line[:200]!r}") from None
            # Look before judging: this thread may have been starved past the deadline (the GIL held
            # elsewhere) while the answer sat in the pipe. Only an empty pipe after it is a timeout.
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready and time.monotonic() >= deadline:
                self.kill()
                raise WorkerFailure("worker did not answer in time (killed)")
            if ready:
                data = os.read(fd, 1 << 20)
                if not data:
                    self.kill()
                    raise WorkerFailure(f"worker exited ({self._process.poll()}); stderr: {self.stderr_tail()}")
                self._buffer += data
