"""The code-execution reward: does the completion's code run, and does it print?"""

from __future__ import annotations

from concurrent.futures import Future

from rlcode.rewards.base import SandboxReward, Scored
from rlcode.rewards.extraction import extract_code
from rlcode.sandbox.result import ExecResult, Program, Status

RUNS_WITH_OUTPUT = 1.0
RUNS_WITHOUT_OUTPUT = 0.5
SYNTAX_ERROR = -0.5
RUNTIME_ERROR = -1.0  # also timeouts, memory, killed, and anything that went wrong in the sandbox


class ExecutionReward(SandboxReward):
    """+1.0 runs and prints output, +0.5 runs without output, -0.5 SyntaxError/IndentationError
    (and a completion with no code at all, so an empty answer never out-scores broken code),
    -1.0 runtime error or timeout. No tests are run: this is a learning signal, not correctness."""

    name = "execution"
    lowest = RUNTIME_ERROR
    success_label = "ran"
    success_meaning = "programs that ran without an error"

    def _submit(self, completion, row: dict, tags: dict[str, str]) -> Future:
        code = extract_code(completion)
        if not code.strip():
            done: Future = Future()
            done.set_result(None)  # scored as "no code" without using a worker
            return done
        return self.pool.submit(Program(code=code), timeout=self.timeout, tags=tags)

    def _score(self, result: ExecResult | None) -> Scored:
        if result is None:
            return Scored(SYNTAX_ERROR, "no code", "syntax_error", False)
        status = Status(result.status)
        if status is Status.OK:
            if result.stdout.strip():
                return Scored(RUNS_WITH_OUTPUT, "ran with output", "ok", True)
            return Scored(RUNS_WITHOUT_OUTPUT, "ran without output", "ok", True)
        if status is Status.SYNTAX_ERROR:
            return Scored(SYNTAX_ERROR, f"syntax_error: {result.error_type or 'SyntaxError'}",
                          status.value, False)
        if status is Status.ERROR:
            return Scored(RUNTIME_ERROR, f"error: {result.error_type or 'exit ' + str(result.returncode)}",
                          status.value, False)
        detail = status.value if not result.message else f"{status.value}: {result.message}"[:120]
        return Scored(RUNTIME_ERROR, detail, status.value, False)
