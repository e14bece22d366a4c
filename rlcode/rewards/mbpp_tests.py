"""MBPP test rewards: the completion's code against the task's asserts, judged by the parent."""

from __future__ import annotations

import json
import warnings
from concurrent.futures import Future

from rlcode.rewards.base import SandboxReward, Scored
from rlcode.rewards.extraction import extract_code
from rlcode.sandbox.asserts import called_function_names
from rlcode.sandbox.verdict import TestVerdict, check_against_tests

_BUILTINS = frozenset(dir(__import__("builtins")))


def entry_point_of(tests) -> str | None:
    """The function the tests call: the first called name that is not a builtin, else the first
    called name at all (MBPP task 126's tests call the solution's own ``sum``)."""
    first = None
    for test in tests:
        for name in called_function_names(test):
            if name not in _BUILTINS:
                return name
            first = first or name
    return first


class MBPPTestsPassed(SandboxReward):
    """1.0 when every test in ``test_list`` passes, else 0.0.

    Reads the ``test_list`` column (and ``test_setup_code`` when present) of each completion's row.
    """

    name = "mbpp_tests"
    lowest = 0.0
    success_label = "passed"
    success_meaning = "programs that passed every MBPP test"

    def __init__(self, pool=None, timeout: float = 10.0, workers: int | None = None,
                 tags=None, run_id: str | None = None, include_challenge_tests: bool = False):
        """
        Args:
            include_challenge_tests: also run the ``challenge_test_list`` column's asserts.
            (Other arguments: see ``SandboxReward``.)
        """
        super().__init__(pool=pool, timeout=timeout, workers=workers, tags=tags, run_id=run_id)
        self.include_challenge_tests = include_challenge_tests
        self._warned_missing_column = False

    def _submit(self, completion, row: dict, tags: dict[str, str]) -> Future:
        tests = self._visible_tests(row)
        return check_against_tests(self.pool, self._code(completion, row, tests), tests,
                                   row.get("test_setup_code") or "", timeout=self.timeout, tags=tags)

    def _visible_tests(self, row: dict) -> list[str]:
        """The row's ``test_list`` (and challenge tests when asked for); raises when there are none."""
        if "test_list" not in row:
            self._warn_missing_column(row)
        tests = assert_strings(row.get("test_list"))
        if self.include_challenge_tests:
            tests += assert_strings(row.get("challenge_test_list") or [])
        if not tests:
            raise ValueError("no test_list for this completion: pass the dataset's test_list column")
        return tests

    @staticmethod
    def _code(completion, row: dict, tests: list[str]) -> str:
        # The DataModule sends each task's entry point; plain TRL datasets may not have the column.
        return extract_code(completion, row.get("entry_point") or entry_point_of(tests))

    def _warn_missing_column(self, row: dict) -> None:
        """Without it every completion scores 0.0, which looks like a model that never passes (ART's
        data names the column test_cases): say so once, with the columns the rows do have."""
        if not self._warned_missing_column:
            self._warned_missing_column = True
            warnings.warn(f"{self.name}: the rows have no 'test_list' column (columns: {', '.join(sorted(row))}), "
                          "so every completion scores 0.0; rename the dataset's test column to test_list",
                          stacklevel=4)

    def _score(self, verdict: TestVerdict) -> Scored:
        return Scored(self._reward(verdict), verdict.reason, verdict.status, verdict.all_passed)

    def _reward(self, verdict: TestVerdict) -> float:
        return 1.0 if verdict.all_passed else 0.0


class MBPPTestsFraction(MBPPTestsPassed):
    """The fraction of ``test_list`` asserts that pass (a denser signal than all-or-nothing)."""

    name = "mbpp_tests_fraction"

    def _reward(self, verdict: TestVerdict) -> float:
        return float(verdict.fraction)


def assert_strings(value) -> list[str]:
    """A test column's value as a list of assert strings (a list, a JSON list, or one assert)."""
    if value is None:
        return []
    if isinstance(value, str):  # a column stored as a JSON list, or a single assert
        try:
            decoded = json.loads(value)
        except ValueError:
            return [value]
        value = decoded if isinstance(decoded, list) else [value]
    return [str(test) for test in value]
