"""The sandbox pool of a mode that runs code: opened when first needed (fit's setup, the first
collect, or the first validate/test batch) with the run's sandbox settings, closed at teardown."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlcode.sandbox import SandboxPool
    from rlcode.training.mode import LearnerView


class LazyPool:
    def __init__(self, timeout: float) -> None:
        """``timeout``: seconds each execution may run."""
        self.timeout = timeout
        self._pool: SandboxPool | None = None

    def get(self, learner: LearnerView) -> SandboxPool:
        if self._pool is None:
            self._pool = learner.sandbox_pool(self.timeout)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
