"""Multi-step MBPP: the model answers, its code runs against the tests shown, and on failure what
went wrong comes back as the next user turn, up to ``max_attempts`` answers (RLEF, arXiv 2410.02089;
ART's multi-turn rollout).

Feedback says which assert failed and the value the code returned, or the exception's last lines,
or the timeout: enough to fix the code, in the words a user would use. A correct answer ends the
episode. The return is the final attempt's tests: binary (every assert passes) or the fraction
passed, times ``attempt_discount`` per extra attempt. With ``hidden_tests`` the return also needs
tests the model never saw (MBPP's ``challenge_test_list``, or the last shown assert held out), so
echoing the feedback back is not enough.

The feedback only ever describes the shown tests: each attempt is one sandbox execution of the shown
tests, and, with hidden tests, a second, separate execution of the hidden ones whose output never
reaches the model (in one shared execution a program that dies while a hidden test runs, after a
shown test failed, would put that hidden call's stderr, with its inputs, in the feedback). The
hidden execution costs one more sandbox run per attempt. ``prepare`` submits both so that the runner
can start every live episode's executions before waiting for any.

MBPP has ``challenge_test_list`` asserts for 11 of its 500 test-split tasks and for no train or
validation task, so ``hidden_tests: challenge`` refuses a task without them (``require_challenge_tests``
checks a whole task list up front) instead of running silently without hidden tests.
"""

from __future__ import annotations

from typing import Iterable, Literal, Mapping, get_args

from rlcode.envs.base import StepResult, Turn
from rlcode.rewards.extraction import extract_code
from rlcode.sandbox.verdict import check_against_tests

RewardKind = Literal["binary", "fraction"]
HiddenTests = Literal["none", "challenge", "held_out"]

CHALLENGE_NOTE = "MBPP has them for 11 of its 500 test-split tasks and for no train or validation task"
PROMPT = ("You are an expert Python programmer. {text} Your code should pass these tests:\n\n{tests}\n\n"
          "Write the function in a ```python block.")


class MBPPFeedbackEnv:
    def __init__(self, pool, *, task_id, text: str, tests: list[str], setup: str = "", entry_point: str | None = None,
                 challenge_tests: list[str] | None = None, max_attempts: int = 3, reward: RewardKind = "binary",
                 attempt_discount: float = 1.0, hidden_tests: HiddenTests = "none", timeout: float = 5.0,
                 tags: dict | None = None) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts={max_attempts}: an episode needs at least one attempt")
        if not tests:
            raise ValueError(f"MBPP task {task_id} has no tests to run")
        if hidden_tests not in get_args(HiddenTests):
            raise ValueError(f"hidden_tests={hidden_tests!r}: choose one of {', '.join(get_args(HiddenTests))}")
        if hidden_tests == "challenge" and not challenge_tests:
            raise ValueError(f"hidden_tests: challenge, but MBPP task {task_id} has no challenge_test_list asserts "
                             f"({CHALLENGE_NOTE}): use hidden_tests: held_out")
        self.name = f"mbpp-{task_id}"
        self.pool, self.text, self.setup, self.entry_point = pool, text, setup, entry_point
        self.shown, self.hidden = list(tests), []
        if hidden_tests == "challenge":
            self.hidden = list(challenge_tests or [])
        elif hidden_tests == "held_out" and len(tests) > 1:
            self.shown, self.hidden = list(tests[:-1]), [tests[-1]]
        self.max_attempts, self.reward, self.discount = max_attempts, reward, attempt_discount
        self.timeout, self.tags = timeout, dict(tags or {})
        self._messages: list[dict[str, str]] = []
        self._attempt = 0
        self._pending = None

    def reset(self, seed: int) -> Turn:
        self._attempt = 0
        tests = "\n".join(test.strip() for test in self.shown)
        self._messages = [{"role": "user", "content": PROMPT.format(text=self.text.strip(), tests=tests)}]
        return Turn(0, list(self._messages))

    def prepare(self, answer: str) -> None:
        """Start this attempt's executions (the runner calls it for every episode, then ``step``):
        the shown tests, and the hidden ones apart (see the module doc)."""
        code = extract_code(answer, self.entry_point)
        tags = {**self.tags, "attempt": str(self._attempt + 1)}
        shown = check_against_tests(self.pool, code, self.shown, self.setup, timeout=self.timeout, tags=tags)
        hidden = None
        if self.hidden:
            hidden = check_against_tests(self.pool, code, self.hidden, self.setup, timeout=self.timeout,
                                   tags={**tags, "hidden": "1"})
        self._pending = (shown, hidden)

    def step(self, answer: str) -> StepResult:
        if self._pending is None:
            self.prepare(answer)
        (shown_future, hidden_future), self._pending = self._pending, None
        verdict = shown_future.result()  # the shown tests' verdict: the only one feedback may describe
        hidden = hidden_future.result() if hidden_future is not None else None
        self._attempt += 1
        passed = verdict.passed + (hidden.passed if hidden is not None else [])
        solved_shown, solved = verdict.all_passed, bool(passed) and all(passed)
        info = {"attempt": self._attempt, "passed_shown": solved_shown, "verdict": verdict.reason, "success": solved}
        if hidden is not None:
            info["hidden_verdict"] = hidden.reason  # for the run's logs; never in a message
        if solved_shown or self._attempt >= self.max_attempts:
            score = 1.0 if solved else 0.0
            if self.reward == "fraction":
                score = sum(passed) / len(passed)
            info["feedback"] = ""
            return StepResult(None, {0: score * self.discount ** (self._attempt - 1)}, info)
        feedback = feedback_text(verdict, self.shown, self.timeout)
        info["feedback"] = feedback
        self._messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": feedback}]
        return StepResult(Turn(0, list(self._messages)), None, info)


def feedback_text(verdict, shown: list[str], timeout: float) -> str:
    """What the user says after a failed attempt (only ever about the shown tests)."""
    status, result = verdict.status, verdict.result
    ask = "Fix the code and answer with the whole function in a ```python block."
    if status == "timeout":
        return f"Your code did not finish within {timeout:g} seconds (an endless loop?). {ask}"
    if status in ("syntax_error", "error", "memory", "killed") and result is not None:
        lines = [line for line in (result.stderr or "").strip().splitlines() if line.strip()][-3:]
        what = "\n".join(lines) or (result.error_type or status)
        return f"Running your code failed:\n{what}\n{ask}"
    for test, passed, detail in zip(shown, verdict.passed, verdict.details or [""] * len(shown)):
        if not passed:
            why = f" ({detail})" if detail else ""
            return f"This test failed: `{test.strip()}`{why}. {ask}"
    return f"Your code did not pass the tests ({verdict.reason}). {ask}"


def require_challenge_tests(tasks: Iterable, split: str) -> None:
    """Refuse ``hidden_tests: challenge`` on tasks without MBPP challenge tests, in one line, before
    training starts (``tasks``: ``MBPPTask`` objects or rows with a ``challenge_test_list``)."""
    rows = list(tasks)
    missing = sum(1 for row in rows if not (row.get("challenge_test_list") if isinstance(row, Mapping)
                                            else getattr(row, "challenge_test_list", None)))
    if missing:
        raise ValueError(f"hidden_tests: challenge, but {missing} of the {len(rows)} {split} tasks have no "
                         f"challenge_test_list asserts ({CHALLENGE_NOTE}): use hidden_tests: held_out")
