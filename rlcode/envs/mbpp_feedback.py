"""Multi-step MBPP: the model answers, its code runs against the tests shown, and on failure what
went wrong comes back as the next user turn, up to ``max_attempts`` answers (RLEF, arXiv 2410.02089;
ART's multi-turn rollout).

Feedback says which assert failed and the value the code returned, or the exception's last lines,
or the timeout: enough to fix the code, in the words a user would use. A correct answer ends the
episode. The return is the final attempt's tests: binary (every assert passes) or the fraction
passed, times ``attempt_discount`` per extra attempt. With ``hidden_tests`` the return also needs
tests the model never saw (MBPP's ``challenge_test_list``, or the last shown assert held out), so
echoing the feedback back is not enough: the feedback only ever covers the shown tests.

Each attempt is one sandbox execution of the shown and hidden tests together; ``prepare`` submits it
so that the runner can start every live episode's execution before waiting for any.
"""

from __future__ import annotations

from typing import Literal

from rlcode.envs.base import StepResult, Turn

RewardKind = Literal["binary", "fraction"]
HiddenTests = Literal["none", "challenge", "held_out"]

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
        """Start this attempt's execution (the runner calls it for every episode, then ``step``)."""
        from rlcode.rewards.extraction import extract_code
        from rlcode.sandbox.verdict import check_program

        code = extract_code(answer, self.entry_point)
        tags = {**self.tags, "attempt": str(self._attempt + 1)}
        self._pending = check_program(self.pool, code, self.shown + self.hidden, self.setup,
                                      timeout=self.timeout, tags=tags)

    def step(self, answer: str) -> StepResult:
        if self._pending is None:
            self.prepare(answer)
        verdict, self._pending = self._pending.result(), None
        self._attempt += 1
        shown_passed = verdict.passed[:len(self.shown)]
        solved_shown = bool(shown_passed) and all(shown_passed)
        info = {"attempt": self._attempt, "passed_shown": solved_shown, "verdict": verdict.reason,
                "success": verdict.all_passed}
        if solved_shown or self._attempt >= self.max_attempts:
            score = 1.0 if verdict.all_passed else 0.0
            if self.reward == "fraction":
                score = verdict.fraction
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
