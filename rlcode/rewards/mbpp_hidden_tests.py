"""MBPP rewards over the visible asserts and the task's hidden tests: what special-casing the
asserted inputs cannot earn.

The prompt shows a task's asserts, so ``mbpp_tests`` pays a program that returns the asserted
values for the asserted inputs. These rewards also run the task's hidden tests (the
``hidden_tests`` column: asserts on new inputs with the reference solution's outputs, made by
``rlcode.rewards.hidden_build``) in the same execution, judged by the trusted parent exactly as the
visible ones (``check_against_tests``: no expected value enters the candidate's process). A
completion that passes every visible assert and, running to its end, fails a hidden one is flagged
``hardcoded``: in its ``Scored``, in its verdict (``hardcoded: hidden test 2 failed: ...``, the
rollout tables' verdict when this is the first reward), in the rollout rows' ``hardcoded``
(``StepRecord.hardcoded``) and in the step's ``reward/<name>/hardcoded_share``.

A row without hidden tests (no column: the cache was not built; an empty list: nothing could be
generated for the task) is scored on its visible asserts alone, with one warning per reward.
"""

from __future__ import annotations

import warnings
from concurrent.futures import Future

from rlcode.rewards.base import Scored
from rlcode.rewards.mbpp_tests import MBPPTestsPassed, assert_strings
from rlcode.sandbox import Status
from rlcode.sandbox.verdict import REASON_CHARS, TestVerdict, check_against_tests

COLUMN = "hidden_tests"


class _Judged:
    """A verdict over visible + hidden asserts, and how many of them were visible (they come first)."""

    def __init__(self, verdict: TestVerdict, visible: int):
        self.verdict, self.visible = verdict, visible


class MBPPHiddenTestsPassed(MBPPTestsPassed):
    """1.0 when every visible and hidden test passes, else 0.0.

    Reads ``test_list`` and ``hidden_tests`` (and ``test_setup_code``, ``entry_point``) of each row.
    """

    name = "mbpp_hidden_tests"
    success_label = "passed_hidden"
    success_meaning = "programs that passed every MBPP test and every hidden test"
    _warned_no_hidden = False  # set on the instance at its first row without hidden tests

    def _submit(self, completion, row: dict, tags: dict[str, str]) -> Future:
        visible = self._visible_tests(row)
        hidden = assert_strings(row.get(COLUMN))
        if not hidden:
            self._warn_no_hidden(row)
        verdict = check_against_tests(self.pool, self._code(completion, row, visible), visible + hidden,
                                      row.get("test_setup_code") or "", timeout=self.timeout, tags=tags)
        judged: Future = Future()

        def finish(done: Future) -> None:
            try:
                judged.set_result(_Judged(done.result(), len(visible)))
            except Exception as e:  # scored as an internal error by RewardJob, never lost
                judged.set_exception(e)

        verdict.add_done_callback(finish)
        return judged

    def _warn_no_hidden(self, row: dict) -> None:
        if self._warned_no_hidden:
            return
        self._warned_no_hidden = True
        if COLUMN not in row:
            why = ("the rows have no 'hidden_tests' column: build the cache with `make hidden-tests` "
                   "(python -m rlcode.data.hidden_tests --build) before training")
        else:
            why = f"task {row.get('task_id', '?')} has no hidden tests (the cache records why)"
        warnings.warn(f"{self.name}: {why}; such rows are scored on their visible asserts alone "
                      "(warned once)", stacklevel=3)

    def _score(self, judged: _Judged) -> Scored:
        verdict, visible = judged.verdict, judged.visible
        shown, hidden = verdict.passed[:visible], verdict.passed[visible:]
        # Answers, not time: a program that ran out of time (or memory) on the hidden inputs after
        # passing the shown ones is slow, not special-casing (MBPP task 123's own reference).
        hardcoded = len(shown) == visible and all(shown) and bool(hidden) and not all(hidden) \
            and verdict.status == Status.OK.value
        reason = verdict.reason
        if hardcoded:
            first = visible + hidden.index(False)
            reason = f"hardcoded: hidden test {first - visible + 1} failed: {verdict.details[first]}"
            reason = reason[:REASON_CHARS]
        return Scored(self._reward(verdict), reason, verdict.status, verdict.all_passed, hardcoded)


class MBPPHiddenTestsFraction(MBPPHiddenTestsPassed):
    """The fraction of all tests, visible and hidden, that pass."""

    name = "mbpp_hidden_tests_fraction"

    def _reward(self, verdict: TestVerdict) -> float:
        return float(verdict.fraction)
