"""SandboxPool: futures over long-lived sandbox workers, with tags, listing, stopping and waiting.

    trainer --(submit: futures, tags)--> worker x N (inside bubblewrap) --fork per execution--> child

One thread per worker slot takes executions from a shared queue (candidate programs) or from the
reference queue (trusted programs, run on a dedicated worker that never runs candidate code, so
expected values never sit in memory a candidate child inherits). Futures never raise for program
failures: a broken worker yields status internal_error and is respawned.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import logging
import os
import queue
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping

from . import cgroups, slot_uids
from .isolation import IsolationReport, IsolationUnavailable, probe_isolation, refuse_visible_filesystem
from .job_queue import ExecutionFuture, Job, JobQueue, internal_result
from .launch import Limits, remove_staging
from .result import ExecResult, ExecutionInfo, Program, Status
from .worker_process import WorkerProcess
from .worker_slot import WorkerSlot, WorkerSpec

log = logging.getLogger(__name__)


class SandboxPool:
    """A pool of sandbox workers. Use as a context manager; ``close()`` (and the parent's death)
    leaves no process behind."""

    def __init__(self, workers: int | None = None, timeout: float = 10.0, memory_mb: int = 1024,
                 max_output_bytes: int = 65536, isolation: str = "auto",
                 tags: Mapping[str, str] | None = None, *, max_processes: int = 64,
                 recycle_after: int = 2000, allow_visible_filesystem: bool = False,
                 site_packages: bool = False):
        """
        Args:
            workers: candidate workers (default: one per core). A dedicated reference worker is
                started on the first ``submit(..., reference=True)``.
            timeout: default wall-clock seconds per execution (the worker kills the whole tree).
            memory_mb: memory of an execution: all its processes together where a cgroup is
                writable (root), and RLIMIT_AS per process everywhere.
            max_output_bytes: stdout and stderr are each capped at this many bytes (the rest is
                counted, flagged as truncated, and dropped without being stored).
            isolation: "auto" (strongest available), "bwrap", "bwrap-userns" or "process".
            tags: tags added to every execution (per-call tags override them).
            max_processes: processes + threads of one execution: the pids cgroup where writable,
                else RLIMIT_NPROC of a uid of the slot's own (root; slot_uids.py) or of your uid
                (see IsolationReport.process_limit for which).
            recycle_after: restart a worker after this many executions (defence in depth).
            allow_visible_filesystem: run even where no layer hides your files from the programs
                (no bubblewrap, no Landlock); otherwise that is an IsolationUnavailable error.
                The environment variable RLCODE_SANDBOX_ALLOW_VISIBLE_FS=1 opts in too.
            site_packages: let programs import from the base interpreter's site-packages
                (default: the standard library only).
        """
        if workers is not None and workers < 1:
            raise ValueError(f"SandboxPool needs workers >= 1 (or None for one per core), got {workers}")
        if timeout <= 0 or memory_mb < 64 or max_output_bytes < 0:
            raise ValueError("SandboxPool needs timeout > 0, memory_mb >= 64 and max_output_bytes >= 0")
        self.timeout = float(timeout)
        self.limits = Limits(memory_mb=memory_mb, max_output_bytes=max_output_bytes,
                             max_processes=max_processes)
        self.default_tags = dict(tags or {})
        self.recycle_after = recycle_after
        # The probe's worker becomes the first slot's, if the thread that started it lives as long
        # as the pool: its parent-death signal fires when that *thread* exits (see WorkerProcess).
        in_main_thread = threading.current_thread() is threading.main_thread()
        count = workers or os.cpu_count() or 1
        names = [f"sandbox-{i}" for i in range(count)] + ["sandbox-reference"]
        self._uids = slot_uids.claim(len(names))  # one uid per slot (root; none otherwise)
        self._cgroups = cgroups.CgroupLimits()  # none yet: nothing to remove if setup() fails
        try:
            self._cgroups = cgroups.setup()
            slot_cgroups = {name: self._cgroups.slot(name, memory_mb << 20, max_processes) for name in names}
            slot_configs = {name: {**self._cgroups.worker_config(slot_cgroups[name]),
                                   **self._uids.worker_config(i)} for i, name in enumerate(names)}
            probe = probe_isolation(isolation, self.limits, keep_worker=in_main_thread,
                                    site_packages=site_packages, cgroups=self._cgroups,
                                    worker_config=slot_configs[names[0]])
        except BaseException:
            self._release_host_resources()
            raise
        try:
            refuse_visible_filesystem(probe.report, allow_visible_filesystem)
        except IsolationUnavailable:
            if probe.worker is not None:
                probe.worker.close()
            shutil.rmtree(probe.staging, ignore_errors=True)
            self._release_host_resources()
            raise
        self.isolation: IsolationReport = probe.report
        self._staging, self._launch = probe.staging, probe.launch
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._closed = False
        self._ids = itertools.count()
        self._completions: queue.Queue = queue.Queue()
        resolve = lambda job, result: self._completions.put((job, result))  # noqa: E731
        self._queue = JobQueue(self._lock, self._jobs, resolve)
        self._reference_queue = JobQueue(self._lock, self._jobs, resolve)
        self._slots = [WorkerSlot(self._reference_queue if name == "sandbox-reference" else self._queue,
                                  self._worker_spec(slot_cgroups[name], slot_configs[name]), name)
                       for name in names]
        self._slots[0].worker = probe.worker  # fresh: it has run nothing yet
        self._completer = threading.Thread(target=self._complete, name="sandbox-completions", daemon=True)
        self._completer.start()
        for slot in self._slots:
            slot.thread.start()
        log.info("sandbox pool: %d workers, isolation %s", count, self.isolation.level)
        if self.isolation.weaker_than_bwrap:
            log.warning("sandbox isolation is %s, weaker than bwrap:\n%s", self.isolation.level,
                        self.isolation.describe())
        atexit.register(_close_if_alive, weakref.ref(self))

    # -- submitting ------------------------------------------------------------------------------
    def submit(self, program: Program | str, *, timeout: float | None = None,
               tags: Mapping[str, str] | None = None, reference: bool = False
               ) -> concurrent.futures.Future[ExecResult]:
        """Queue one execution. The future's result is an ExecResult; it never raises for the
        program's failures (only CancelledError if you cancel the future yourself). ``cancel()``
        works while it waits and while it runs (the execution is killed); either way it leaves
        ``list()`` and ``count()`` at once."""
        program = _as_program(program)
        run_timeout = self.timeout if timeout is None else float(timeout)
        if run_timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        job = Job(exec_id=f"x{next(self._ids):06d}-{uuid.uuid4().hex[:6]}", program=program,
                   timeout=run_timeout, tags={**self.default_tags, **(tags or {})}, reference=reference,
                   future=ExecutionFuture())
        job.future.on_cancel = lambda: self._cancel(job)
        with self._lock:
            if self._closed:
                raise RuntimeError("SandboxPool is closed; create a new pool")
            self._jobs[job.exec_id] = job
        (self._reference_queue if reference else self._queue).put(job)
        return job.future

    def map(self, programs: Iterable[Program | str], *, timeout: float | None = None,
            tags: Mapping[str, str] | None = None) -> list[ExecResult]:
        """Run all programs; results in the programs' order."""
        futures = [self.submit(p, timeout=timeout, tags=tags) for p in programs]
        return [f.result() for f in futures]

    # -- observing and stopping ------------------------------------------------------------------
    def list(self, tags: Mapping[str, str] | None = None) -> list[ExecutionInfo]:
        """Running and pending executions whose tags include all of ``tags``."""
        with self._lock:
            return [ExecutionInfo(exec_id=j.exec_id, state=j.state, tags=dict(j.tags), reference=j.reference,
                                  submitted_at=j.submitted_at, started_at=j.started_at)
                    for j in self._jobs.values() if _matches(j.tags, tags)]

    def count(self, tags: Mapping[str, str] | None = None) -> dict[str, int]:
        infos = self.list(tags)
        return {"running": sum(i.state == "running" for i in infos),
                "pending": sum(i.state == "pending" for i in infos)}

    def stop(self, tags: Mapping[str, str] | None = None) -> int:
        """Cancel pending and kill running executions matching ``tags`` (all when None).
        Their futures resolve with status cancelled. Returns how many were stopped."""
        with self._lock:
            matching = [j for j in self._jobs.values() if _matches(j.tags, tags)]
            pending = [j for j in matching if j.state == "pending"]
            for job in pending:
                job.state = "done"
                del self._jobs[job.exec_id]
            running = [j for j in matching if j.state == "running"]
            for job in matching:
                job.stop_requested = True
        for job in pending:
            _resolve(job.future, internal_result(job, Status.CANCELLED, "stopped before it started", ""))
        for job in running + [j for j in pending if j.slot is not None]:  # queued at a worker too
            job.slot.kill_running(job)
        return len(pending) + len(running)

    def _cancel(self, job: Job) -> None:
        """The caller cancelled ``job``'s future: off the table now, killed if a worker has it
        (a slot that takes it later sees it done and never sends it)."""
        with self._lock:
            if job.state == "done":
                return
            job.state, job.stop_requested = "done", True
            self._jobs.pop(job.exec_id, None)
            slot = job.slot
        if slot is not None:
            slot.kill_running(job)

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Cancel what is pending, kill what runs, stop every worker, delete the staged files."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.stop()
        for slot in self._slots:
            slot.queue.put(None)
        for slot in self._slots:
            slot.thread.join(timeout=30)
        self._completions.put(None)
        self._completer.join(timeout=30)
        remove_staging(self._staging)  # a candidate may have left a tree too deep for rmtree
        self._release_host_resources()

    def _release_host_resources(self) -> None:
        """The pool's cgroup folders and its slots' uids (its workers are gone)."""
        self._cgroups.remove()
        self._uids.release()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- workers ---------------------------------------------------------------------------------
    def _worker_spec(self, slot_cgroup: dict[str, str], config: dict) -> WorkerSpec:
        """``config``: the slot's own worker config (its cgroup files and its uid)."""
        seen = [self._cgroups.oom_kills(slot_cgroup)]

        def on_result(result: ExecResult) -> ExecResult:
            """A child SIGKILLed by the cgroup's OOM killer ran out of memory: status memory."""
            if result.status is Status.KILLED and slot_cgroup:
                kills = self._cgroups.oom_kills(slot_cgroup)
                if kills > seen[0]:
                    seen[0] = kills
                    result.status, result.error_type = Status.MEMORY, "cgroup memory limit"
            return result
        return WorkerSpec(start=lambda: WorkerProcess(self._launch, config=config), level=self.isolation.level,
                          recycle_after=self.recycle_after, on_result=on_result)

    def _complete(self) -> None:
        while (item := self._completions.get()) is not None:
            job, result = item
            log.debug("sandbox exec %s tags=%s status=%s rc=%s stdout=%dB stderr=%dB %.3fs", job.exec_id,
                      job.tags, result.status.value, result.returncode, result.stdout_bytes,
                      result.stderr_bytes, result.duration_s)
            try:
                _resolve(job.future, result)
            except Exception:  # a callback's bug must not stop every later future
                log.exception("sandbox: a future callback raised for %s", job.exec_id)


def wait(futures: Iterable[concurrent.futures.Future], num_returns: int | None = None,
         timeout: float | None = None) -> tuple[list, list]:
    """Wait until ``num_returns`` futures (default: all) are done or ``timeout`` passes.

    Returns (done, not_done): ``done`` holds at most ``num_returns`` finished futures in input order,
    ``not_done`` all the others (some may have finished meanwhile). Cancel what you no longer need.
    """
    futures = list(futures)
    wanted = len(futures) if num_returns is None else num_returns
    if not 0 <= wanted <= len(futures):
        raise ValueError(f"num_returns must be between 0 and {len(futures)}, got {num_returns}")
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        finished = [f for f in futures if f.done()]
        remaining = None if deadline is None else deadline - time.monotonic()
        if len(finished) >= wanted or (remaining is not None and remaining <= 0):
            break
        concurrent.futures.wait([f for f in futures if not f.done()], timeout=remaining,
                                return_when=concurrent.futures.FIRST_COMPLETED)
    done = finished[:wanted]
    chosen = set(map(id, done))
    return done, [f for f in futures if id(f) not in chosen]


def _as_program(program: Program | str) -> Program:
    if isinstance(program, str):
        return Program(code=program)
    if not isinstance(program, Program):
        raise TypeError(f"submit() takes a Program or a str of code, got {type(program).__name__}")
    if not isinstance(program.code, str) or not isinstance(program.setup, str) or \
            not all(isinstance(p, str) for p in program.probes):
        raise TypeError("Program.code, .setup and every probe must be str")
    return program


def _matches(job_tags: dict[str, str], wanted: Mapping[str, str] | None) -> bool:
    return not wanted or all(job_tags.get(k) == v for k, v in wanted.items())


def _resolve(future: concurrent.futures.Future, result: ExecResult) -> None:
    try:
        future.set_result(result)
    except concurrent.futures.InvalidStateError:  # cancelled by the caller meanwhile
        pass


def _close_if_alive(pool_ref: weakref.ref) -> None:
    pool = pool_ref()
    if pool is not None:
        pool.close()
