"""A stop asked for by a signal, as the evals, the checkpoint and the validate/test loops see it.

``GracefulShutdown`` (``callbacks/shutdown.py``) catches SIGINT, SIGTERM and SIGUSR1 and only sets a
flag. Between steps it saves ``last.ckpt`` and stops. But an eval (start of run, interval, end; MBPP
or games) can run for half an hour on CPU, longer than SLURM waits between SIGTERM and SIGKILL; so
the evals ask here between their batches whether to stop, abandon themselves (nothing recorded: the
eval at that step runs again on resume) and ask for the save and the stop at once.

One handle per process, because signals are per process: the shutdown registers itself while it
holds the handlers. Callbacks never look each other up in the trainer's list (the order of the
callbacks must not matter); without a registered shutdown nothing here ever stops anything.

Under DDP/FSDP a signal may reach some ranks only, and an eval's generation is collective (FSDP
gathers the weights), so a rank must never leave an eval alone: ``agreed`` is a tiny all-reduce that
every rank calls at the same points (the same batch boundaries of the same eval), and every rank
acts on the agreed answer only.
"""

from __future__ import annotations

from typing import Callable

_active = None  # the GracefulShutdown holding this process's signal handlers


class StopRequested(Exception):
    """``rlcode validate`` / ``test`` stopped by a signal between batches; nothing was written."""


def register(shutdown) -> None:
    global _active
    _active = shutdown


def unregister(shutdown) -> None:
    global _active
    if _active is shutdown:
        _active = None


def agreed(trainer) -> bool:
    """Whether the ranks agreed to stop. Collective until they have: every rank calls it at the
    same points. Once they have, it answers without communicating (on every rank alike)."""
    return _active is not None and _active.agreed(trainer)


def stop_now(trainer, pl_module) -> None:
    """Save what the run has (``last.ckpt``) and end the fit loop; once per stop. Call it only after
    ``agreed`` said yes, from a hook every rank runs (the save is collective)."""
    if _active is not None:
        _active.stop(trainer, pl_module)


def checker(trainer) -> Callable[[], bool]:
    """``agreed`` bound to ``trainer``, for loops that know nothing of Lightning (the eval scorer)."""
    return lambda: agreed(trainer)
