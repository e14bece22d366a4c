"""``rlcode validate`` / ``test`` of the modes that write code: the greedy pass rate on MBPP (or
HumanEval, ``eval.benchmark``) of each DataModule batch, logged as ``<benchmark>_eval/pass_rate``
and ``<benchmark>_test/pass_rate``. Each step returns its batch's EvalReport: the eval callback
writes the per-problem results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcode.eval.policy_scoring import BENCHMARK_NAMES, score_batch
from rlcode.eval.progress import EvalProgress, problems_in_eval_loop
from rlcode.eval.settings import EvalSettings, resolve
from rlcode.modes.lazy_pool import LazyPool

if TYPE_CHECKING:
    from rlcode.training.mode import LearnerView


class MBPPPassRate:
    def __init__(self, timeout: float) -> None:
        """``timeout``: seconds each program may run in the sandbox."""
        self.timeout = timeout
        self._pool = LazyPool(timeout)
        self._progress = None

    def step(self, learner: LearnerView, batch, batch_idx: int, testing: bool):
        benchmark = getattr(learner.datamodule(), "eval_benchmark", "mbpp")  # passed on through the DataModule
        prefix = f"{benchmark}_{'test' if testing else 'eval'}"
        if batch_idx == 0:  # a new validate / test loop: count its problems from zero
            name = BENCHMARK_NAMES[benchmark]
            self._progress = EvalProgress(f"{name} test" if testing else f"{name} validate",
                                          problems_in_eval_loop(learner.trainer, testing))
        report = score_batch(learner, batch, self._pool.get(learner), split=prefix, progress=self._progress,
                             settings=self._settings(learner))
        count = len(report.problems)
        learner.log(f"{prefix}/pass_rate", report.pass_rate, batch_size=count)  # weighted mean over batches
        learner.log(f"{prefix}/problems_passed", float(report.problems_passed), reduce_fx="sum", batch_size=count)
        return report

    def _settings(self, learner) -> EvalSettings:
        """The eval callback's settings (``eval.*``, handed over at its setup), so validate / test
        score as the fit-time eval does; without the callback, its defaults and this mode's timeout."""
        settings = getattr(learner, "eval_settings", None)
        if settings is None:
            settings = resolve(learner, learner.datamodule(), max_new_tokens=None, temperature=0.0,
                               num_samples=0, k=(), timeout=self.timeout, batch_size=None)
        return settings

    def close(self) -> None:
        self._pool.close()
