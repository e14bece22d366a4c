"""One worker slot: a sandbox worker and the thread that feeds it executions from a job queue.

A slot knows the pool only through the ``JobQueue`` it is handed (take, claim, start, finish: so
that listing, stopping and cancelling stay consistent) and a ``WorkerSpec`` (how to start its
worker), and keeps up to PIPELINE_DEPTH executions at its worker.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .job_queue import Job, JobQueue, internal_result
from .result import ExecResult, Status
from .worker_process import WorkerFailure, WorkerProcess

log = logging.getLogger("rlcode.sandbox.pool")  # one logger for the pool and its slots
WORKER_DEADLINE_MARGIN_S = 10.0  # beyond the execution's timeout, the parent gives up on the worker
PIPELINE_DEPTH = 2  # executions handed to one worker at a time (the second waits in its stdin)


@dataclass
class WorkerSpec:
    """What a slot needs to run workers: how to start one, and when to retire it."""

    start: Callable[[], WorkerProcess]  # a fresh worker (called on the slot's own thread)
    level: str  # the isolation level, for results of executions that never reached a worker
    recycle_after: int = 2000  # executions per worker
    on_result: Callable[[ExecResult], ExecResult] = field(default=lambda result: result)  # e.g. OOM


class WorkerSlot:
    """One worker and the thread that feeds it. The thread spawns the worker, so the worker's
    parent-death signal is tied to a thread that lives as long as the pool (the first slot may
    instead start with the pool's isolation-probe worker, when the main thread started that one).

    The slot keeps up to PIPELINE_DEPTH executions at its worker (the next one waits in the worker's
    stdin), so the worker never idles while the parent is busy (measured: 9-22% idle without).
    It only takes a second one when no other slot is waiting for work.
    """

    def __init__(self, jobs: JobQueue, spec: WorkerSpec, name: str):
        """
        Args:
            jobs: the queue this slot serves (the pool's candidate or reference queue).
            spec: how to start its workers.
            name: the thread's name (``sandbox-0``, ``sandbox-reference``).
        """
        self.queue, self.spec, self.name = jobs, spec, name
        self.worker: WorkerProcess | None = None
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.inflight: collections.deque[Job] = collections.deque()

    def kill_running(self, job: Job) -> None:
        # Either _send sees job.stop_requested before sending, or the worker gets this kill (before
        # or during the run: it remembers kills for executions it has not started yet).
        worker = self.worker
        if worker is not None:
            worker.kill_execution(job.exec_id)

    def _loop(self) -> None:
        closing = False
        try:
            while True:
                if not self.inflight:
                    if closing:
                        break
                    job = self.queue.take()
                    if job is None:
                        break
                    if self.queue.claim(job, self, queued=False):
                        self._send(job)
                    continue
                if not closing and self._may_prefetch():
                    try:
                        job = self.queue.take_nowait()
                    except queue.Empty:
                        pass
                    else:
                        if job is None:
                            closing = True
                        elif self.queue.claim(job, self, queued=True):
                            self._send(job)
                self._receive_oldest()
        finally:
            for job in self.inflight:  # only after a failure to respawn: never lose a future
                self.queue.finish(job, internal_result(job, Status.INTERNAL_ERROR, "pool closed", ""))
            if self.worker is not None:
                self.worker.close()
                self.worker = None

    def _may_prefetch(self) -> bool:
        worker = self.worker
        return (len(self.inflight) < PIPELINE_DEPTH and worker is not None and worker.alive
                and worker.executions < self.spec.recycle_after and not worker.retiring
                and self.queue.more_work_than_idle_slots())

    def _send(self, job: Job) -> None:
        """Hand ``job`` to the worker (spawning one if needed), or finish it here if that fails."""
        if not self.inflight:
            try:
                self._ready_worker()
            except WorkerFailure as e:
                self.queue.finish(job, internal_result(job, Status.INTERNAL_ERROR,
                                                       f"could not start a worker: {e}", self.spec.level))
                return
        if job.stop_requested or job.state == "done":
            self.queue.finish(job, internal_result(job, Status.CANCELLED, "stopped before it started",
                                                   self.worker.launch.level))
            return
        request = {"op": "run", "id": job.exec_id, "code": job.program.code, "setup": job.program.setup,
                   "probes": list(job.program.probes), "timeout": job.timeout}
        try:
            self.worker.send(request)
        except WorkerFailure as e:
            self._worker_failed(e, job)
            return
        job.deadline = time.monotonic() + job.timeout + WORKER_DEADLINE_MARGIN_S
        self.inflight.append(job)

    def _receive_oldest(self) -> None:
        job = self.inflight[0]
        if self.queue.start(job):  # it waited behind another execution: its clock starts now
            job.deadline = time.monotonic() + job.timeout + WORKER_DEADLINE_MARGIN_S
        worker = self.worker
        try:
            raw = worker.receive(job.exec_id, job.deadline)
        except WorkerFailure as e:
            self.inflight.popleft()
            self._worker_failed(e, job)
            return
        self.inflight.popleft()
        if raw.get("requeue"):  # queued behind an execution that retired the worker: not run there
            worker.retiring = True
            self._send(job)  # to a fresh worker (nothing else is in flight: the pipeline is two deep)
            return
        if raw.get("recycle"):  # it could not empty its scratch dirs, or the kernel still holds what
            worker.retiring = True  # the execution left (inside/worker_main.py): no more work for it
            if raw.get("retire_reason"):
                log.warning("sandbox worker %s retires after %s: %s", self.name, job.exec_id,
                            _bounded(raw["retire_reason"], MESSAGE_CHARS))
        self.queue.finish(job, self.spec.on_result(result_from_worker(job, raw, worker.launch.level)))

    def _worker_failed(self, error: WorkerFailure, job: Job) -> None:
        """``job`` gets internal_error; executions queued behind it go to a fresh worker."""
        log.warning("sandbox worker %s failed during %s: %s (respawning)", self.name, job.exec_id, error)
        level = self.worker.launch.level
        self.worker.kill()
        self.worker = None
        self.queue.finish(job, internal_result(job, Status.INTERNAL_ERROR, str(error), level))
        queued, self.inflight = list(self.inflight), collections.deque()
        for waiting in queued:
            self._send(waiting)

    def _ready_worker(self) -> WorkerProcess:
        worker = self.worker
        if worker is not None and (not worker.alive or worker.executions >= self.spec.recycle_after
                                   or worker.retiring):
            worker.close()
            worker = self.worker = None
        if worker is None:
            worker = self.worker = self.spec.start()
        return worker


# Strings a result carries into verdicts and results files, cut here: the worker is trusted, but what
# it forwards (a status line's error field) is written by candidate code (a 9.8M-character one was).
ERROR_TYPE_CHARS, MESSAGE_CHARS = 200, 500


def _bounded(text, limit: int) -> str | None:
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def result_from_worker(job: Job, raw: dict, level: str) -> ExecResult:
    try:
        status = Status(raw.get("status"))
    except ValueError:
        status = Status.INTERNAL_ERROR
    return ExecResult(
        exec_id=job.exec_id, status=status, returncode=raw.get("returncode"),
        stdout=raw.get("stdout", ""), stderr=raw.get("stderr", ""),
        stdout_truncated=bool(raw.get("stdout_truncated")), stderr_truncated=bool(raw.get("stderr_truncated")),
        duration_s=float(raw.get("duration_s", 0.0)), tags=dict(job.tags),
        probe_lines=list(raw.get("probe_lines", [])), error_type=_bounded(raw.get("error_type"), ERROR_TYPE_CHARS),
        stdout_bytes=int(raw.get("stdout_bytes", 0)), stderr_bytes=int(raw.get("stderr_bytes", 0)),
        probe_lines_truncated=bool(raw.get("probe_lines_truncated")), isolation=level,
        message=_bounded(raw.get("message", ""), MESSAGE_CHARS), values_bytes=int(raw.get("values_bytes", 0)),
        values_lines=int(raw.get("values_lines", 0)), values_over=str(raw.get("values_over", ""))[:5])
