"""Stopping a run on a signal: one ``StopToken`` per run, passed to whoever asks.

SIGINT, SIGTERM or SIGUSR1 (SLURM's warning) reaches a process; ``callbacks/shutdown.py`` holds the
handlers and only calls ``request``. Everything else reads the token it was handed (the Learner owns
it as ``stop_token``; the callbacks take it from the module, the HF backend from the Learner):

- ``requested()``: a signal reached *this* process. Per rank, so only for what cannot make the ranks
  differ (see "The decode loop" below).
- ``agreed(ranks, at)``: every rank agrees to stop (any rank's request stops them all). Saving and
  FSDP's gathers are collective, so a rank leaving alone would leave the others waiting forever.
  It is one tiny all-reduce, called by every rank at the same named point (``StopPoint``), and it
  latches: once True it stays True and answers without communicating, on every rank alike.

The points where the ranks ask are the members of ``StopPoint``; nothing else asks. The token counts
its asks per point (``asks``), so a test can check that every rank asked equally often at each.

A stop acted on raises ``Stopped`` wherever work in flight is abandoned (an update before its first
optimizer step, an eval between batches, ``rlcode validate`` / ``test`` between batches): all three
mean the same thing, the ranks agreed and nothing of the abandoned work is kept.

The decode loop (``rlcode.rollout.hf_backend``) reads ``ends_rows()``, a per-rank answer, not the
collective: ranks decode different numbers of tokens, so no point inside it is reached equally
often. It cannot make the ranks disagree: the loop runs no collective (a sharded model is gathered
once per generate call), and it ends rows early only inside ``collecting()``, whose caller asks
``agreed`` at ``StopPoint.AFTER_COLLECT`` before using a row. A request is never withdrawn, so a rank
that cut its rows makes that ask True on every rank and the cut rows are dropped everywhere. Outside
a collection (evals, validate/test) rows are never cut: their results would be kept after their
last batch, where no later ask would drop them.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from enum import Enum
from typing import Iterator, Protocol


class StopPoint(str, Enum):
    """Where the ranks ask ``agreed``; every rank reaches each point equally often."""

    AFTER_COLLECT = "after_collect"  # a training step, its rollouts collected, before anything uses them
    BEFORE_MICRO_BATCH = "before_micro_batch"  # the update's first pass, as many times as the fewest micro-batches
    STEP_END = "step_end"  # the shutdown's look at each batch end
    AFTER_SAVE = "after_save"  # the checkpoint callback's, after its save (the last look before the next step)
    EVAL_START = "eval_start"  # an MBPP eval about to begin
    EVAL_BATCH = "eval_batch"  # before each batch of an MBPP eval (greedy, then sampled)
    GAME = "game"  # before each game of a game eval
    SCORING_BATCH = "scoring_batch"  # rlcode validate / test, before each batch


class Ranks(Protocol):
    """What ``agreed`` needs of the ranks: whether a decision holds on any of them (one all-reduce;
    ``rlcode.training.all_ranks_totals.Ranks``, or the Lightning strategy's, in the callbacks)."""

    def any(self, decision: bool) -> bool: ...


class Stopped(Exception):
    """The ranks agreed to stop and the work in flight was abandoned; nothing of it is kept."""


ANOTHER_RANK = "a signal to another rank"  # what ``signal`` says on a rank no signal reached


class StopToken:
    def __init__(self) -> None:
        self.signal: str | None = None  # the newest signal's name (SIGTERM, ...), or ANOTHER_RANK
        self.requeue = False  # SIGUSR1 reached some rank: after the save, the job is requeued
        self.asks: Counter[StopPoint] = Counter()  # ``agreed`` calls per point, for the tests
        self.acted = False  # the run has saved and stopped for this stop (once per stop)
        self._requested = False
        self._agreed = False
        self._collecting = False

    def request(self, signal: str, requeue: bool = False) -> None:
        """A signal reached this process (called from its handler: only sets flags)."""
        self.signal, self._requested = signal, True
        self.requeue = self.requeue or requeue

    def requested(self) -> bool:
        return self._requested

    def agreed(self, ranks: Ranks, at: StopPoint) -> bool:
        """Whether the ranks agreed to stop: collective until they have (every rank calls it at ``at``),
        then True without communicating. On agreement the requeue is agreed too (SIGUSR1 anywhere)."""
        self.asks[at] += 1
        if self._agreed:
            return True
        if not ranks.any(self._requested):
            return False
        self.requeue = ranks.any(self.requeue)
        self.signal = self.signal or ANOTHER_RANK
        self._agreed = True
        return True

    def new_fit(self) -> None:
        """A fit starts (a notebook may fit the same trainer again): nothing agreed or acted on yet. A
        request already received stays, as the handlers' flag always did."""
        self._agreed = self.acted = False
        self.asks.clear()

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Rows generated inside may be ended early on a request (``ends_rows``): the caller asks
        ``agreed`` at ``StopPoint.AFTER_COLLECT`` before it uses them."""
        self._collecting = True
        try:
            yield
        finally:
            self._collecting = False

    def ends_rows(self) -> bool:
        """Whether a decode loop should end its live rows now (see the module's docstring)."""
        return self._collecting and self._requested
