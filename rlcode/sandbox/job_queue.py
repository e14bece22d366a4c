"""The interface between the pool and its worker slots: jobs, and the queue a slot serves.

    SandboxPool --puts jobs--> JobQueue <--takes, claims, starts, finishes-- WorkerSlot

The pool owns the job table and its lock (for listing, stopping and cancelling); a JobQueue is
one queue of pending jobs (candidate or reference) over that table, and the only thing a slot
knows of the pool. So the dependency runs one way: pool -> worker_slot -> job_queue.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .result import ExecResult, Program, Status


class ExecutionFuture(concurrent.futures.Future):
    """A Future whose ``cancel()`` works while the execution is queued at a worker or running too
    (a plain Future refuses once running): the pool then kills the execution's process tree, as
    ``stop()`` does, which is safe at any point. False only once the result is in."""

    on_cancel: Callable[[], None] | None = None  # set by the pool: take the job off and kill it

    def cancel(self) -> bool:
        with self._condition:
            if self._state == _RUNNING:  # back to pending, so that Future.cancel accepts it
                self._state = _PENDING
        cancelled = super().cancel()
        if cancelled and self.on_cancel is not None:
            self.on_cancel()
        return cancelled


_RUNNING, _PENDING = concurrent.futures._base.RUNNING, concurrent.futures._base.PENDING


@dataclass
class Job:
    """One submitted execution as the pool and its slots track it (``ExecutionInfo`` is its view)."""

    exec_id: str
    program: Program
    timeout: float
    tags: dict[str, str]
    reference: bool
    future: concurrent.futures.Future
    submitted_at: float = field(default_factory=time.monotonic)
    state: str = "pending"  # pending -> running -> done
    started_at: float | None = None
    slot: object | None = None  # the WorkerSlot running it (anything with kill_running(job))
    stop_requested: bool = False
    deadline: float = 0.0  # when the parent gives up on the worker (time.monotonic())


class JobQueue:
    """Pending jobs of one kind, and the state changes a slot makes to them under the table's lock."""

    def __init__(self, lock: threading.Lock, table: dict[str, Job],
                 resolve: Callable[[Job, ExecResult], None]):
        """
        Args:
            lock: the pool's lock over ``table`` (listing and stopping take it too).
            table: exec_id -> Job for every pending or running job of the pool.
            resolve: called with each finished job and its result (the pool's completion thread).
        """
        self._lock, self._table, self._resolve = lock, table, resolve
        self._pending: queue.Queue = queue.Queue()
        self._idle = 0  # slots blocked in take()

    def put(self, job: Job | None) -> None:
        """Queue a job (None: one serving slot stops)."""
        self._pending.put(job)

    def take(self) -> Job | None:
        """Block until a job arrives (None: stop), counted as an idle slot meanwhile."""
        with self._lock:
            self._idle += 1
        try:
            return self._pending.get()
        finally:
            with self._lock:
                self._idle -= 1

    def take_nowait(self) -> Job | None:
        """A job if one is waiting; raises queue.Empty otherwise."""
        return self._pending.get_nowait()

    def more_work_than_idle_slots(self) -> bool:
        """A busy slot queues a second execution at its worker only when no idle slot could take it."""
        return self._pending.qsize() > self._idle

    def claim(self, job: Job, slot, queued: bool) -> bool:
        """Give ``job`` to ``slot``: running now, or (``queued``) pending behind another execution
        at the slot's worker until ``start``."""
        with self._lock:
            if job.state != "pending" or job.slot is not None:
                return False
            job.slot = slot
            if not queued:
                job.state, job.started_at = "running", time.monotonic()
        if not job.future.set_running_or_notify_cancel():  # the caller cancelled the future
            self.finish(job)
            return False
        return True

    def start(self, job: Job) -> bool:
        """A queued job reaches the front of its worker. True if it was waiting until now."""
        with self._lock:
            if job.state != "pending":
                return False
            job.state, job.started_at = "running", time.monotonic()
            return True

    def finish(self, job: Job, result: ExecResult | None = None) -> None:
        """Take ``job`` off the table and hand its result (if any) to the pool to resolve."""
        with self._lock:
            job.state = "done"
            self._table.pop(job.exec_id, None)
        if result is not None:
            self._resolve(job, result)


def internal_result(job: Job, status: Status, message: str, level: str) -> ExecResult:
    """The result of a job the sandbox (not the program) ended: cancelled, or internal_error."""
    return ExecResult(exec_id=job.exec_id, status=status, returncode=None, stdout="", stderr="",
                      stdout_truncated=False, stderr_truncated=False, duration_s=0.0, tags=dict(job.tags),
                      probe_lines=[], isolation=level, message=message)
