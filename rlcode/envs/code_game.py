"""The adversarial code game (``grpo_code_game``): a writer writes a short Python program,
a predictor reads it and predicts its exact output. Writer +1 when the prediction is wrong and -1 when
it is right; the predictor the opposite.

Why the validity guard: without it the writer wins by printing what nobody can predict (``time.time()``,
``random.random()``, an object's address, a set's hash order), not by writing code that is hard to
reason about. So a program counts only if it is deterministic and bounded: ``check_program`` runs it
twice in the sandbox, each time in a fresh interpreter with a different random hash seed, environment,
process id and clock, with empty stdin; it must exit 0 both times within the time limit and print the
same non-empty output of at most ``MAX_OUTPUT`` bytes. An invalid program costs the writer
``invalid_program_penalty`` (-1) and the predictor is not scored (it does not play).

Predictions are compared exactly after stripping trailing whitespace from every line (and trailing
blank lines): ``"3 \\n"`` equals ``"3"``, ``"3.0"`` does not.

The two runs are one sandbox execution whose wrapper starts the program twice as child processes and
reports one JSON line keyed by a random nonce the program never sees (it could write to the
wrapper's stdout, but not forge a report it cannot key).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from rlcode.envs.base import StepResult, Turn
from rlcode.rewards.extraction import fenced_blocks

MAX_OUTPUT = 4096

WRITER_PROMPT = (
    "You are the writer in a code game. Write a short Python program (at most about 20 lines) whose "
    "printed output is hard to predict by reading the code, but which is deterministic: no randomness, "
    "time, input or environment. Theme: {theme}\nReply with the program in a ```python block.")
PREDICTOR_PROMPT = (
    "You are the predictor in a code game. Read this Python program and predict exactly what it "
    "prints.\n\n```python\n{program}\n```\n\nReply with the exact output in a ``` block.")

_WRAPPER = r'''
import json, os, subprocess, sys, time
source, limit, nonce, seeds = {source!r}, {timeout!r}, {nonce!r}, {seeds!r}
runs = []
for run, hash_seed in ((1, seeds[0]), (2, seeds[1])):
    if run == 2:
        subprocess.run([sys.executable, "-c", "pass"])  # the second run gets another process id
        time.sleep(0.01)  # and another clock reading
    env = {{"PYTHONHASHSEED": hash_seed, "RLCODE_GAME_RUN": str(run), "HOME": "/tmp", "TZ": ("UTC", "Asia/Tokyo")[run - 1]}}
    try:
        done = subprocess.run([sys.executable, "-s", "-c", source], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=limit)
        out = done.stdout
        runs.append({{"code": done.returncode, "out": out[:{cap} + 1].decode("utf-8", "replace"),
                      "long": len(out) > {cap}, "err": done.stderr[-300:].decode("utf-8", "replace")}})
    except subprocess.TimeoutExpired:
        runs.append({{"code": None, "out": "", "long": False, "err": "timeout"}})
sys.stdout.write(json.dumps({{"nonce": nonce, "runs": runs}}) + "\n")
'''


@dataclass(frozen=True)
class ProgramCheck:
    valid: bool
    output: str | None
    """The program's output when valid (the same in both runs), else None."""
    reason: str
    """Why it is invalid ("" when valid)."""


def check_program(code: str, timeout: float = 5.0, *, pool=None) -> ProgramCheck:
    """Is ``code`` a valid game program (deterministic, bounded, non-empty output)? See the module doc."""
    return start_check(code, timeout, pool=pool)()


def start_check(code: str, timeout: float = 5.0, *, pool=None):
    """Submit the check and return a function that waits for its ``ProgramCheck``."""
    from rlcode.sandbox.result import Program, Status

    if not code.strip():
        return lambda: ProgramCheck(False, None, "no program")
    owned = pool is None
    if owned:
        from rlcode.sandbox import SandboxPool

        pool = SandboxPool(workers=1, timeout=2 * timeout + 5)
    nonce = secrets.token_hex(16)
    # Fresh random hash seeds every check: with fixed ones a writer could find a set whose order
    # happens to agree under both, and still be unpredictable to anyone reading the code.
    first = secrets.randbelow(2**32)
    seeds = (str(first), str((first + 1 + secrets.randbelow(2**31)) % 2**32))
    wrapper = _WRAPPER.format(source=code, timeout=timeout, nonce=nonce, cap=MAX_OUTPUT, seeds=seeds)
    future = pool.submit(Program(code=wrapper), timeout=2 * timeout + 5)

    def result() -> ProgramCheck:
        try:
            outcome = future.result()
        finally:
            if owned:
                pool.close()
        if Status(outcome.status) is not Status.OK:
            return ProgramCheck(False, None, f"sandbox: {Status(outcome.status).value}")
        reports = [line for line in outcome.stdout.splitlines() if nonce in line]
        if len(reports) != 1:
            return ProgramCheck(False, None, "no single report from the runs")
        return _judge(json.loads(reports[0])["runs"])
    return result


def _judge(runs: list[dict]) -> ProgramCheck:
    first, second = runs
    for run in runs:
        if run["code"] is None:
            return ProgramCheck(False, None, "did not finish in time")
        if run["code"] != 0:
            last = (run["err"].strip().splitlines() or ["exit " + str(run["code"])])[-1]
            return ProgramCheck(False, None, f"failed: {last}")
        if run["long"]:
            return ProgramCheck(False, None, f"printed more than {MAX_OUTPUT} bytes")
    if not first["out"].strip():
        return ProgramCheck(False, None, "printed nothing")
    if normalise_output(first["out"]) != normalise_output(second["out"]):
        return ProgramCheck(False, None, "not deterministic: the two runs printed different output")
    return ProgramCheck(True, normalise_output(first["out"]), "")


def normalise_output(text: str) -> str:
    """Trailing whitespace stripped from every line, trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n")


def extract_prediction(reply: str) -> str:
    """The predicted output: the first fenced block's content, else the whole reply."""
    blocks = fenced_blocks(reply)
    return normalise_output(blocks[0][1] if blocks else reply)


class CodeGameEnv:
    def __init__(self, pool, *, theme: str, timeout: float = 5.0, invalid_program_penalty: float = -1.0) -> None:
        """One game: seat 0 writes, seat 1 predicts.

        Args:
            pool: the sandbox pool that runs the writer's program.
            theme: a few words the writer's program should be about (e.g. an MBPP task's text).
            timeout: seconds each of the two runs may take.
            invalid_program_penalty: the writer's return for an invalid program (the predictor then
                does not play).
        """
        self.name = "code_game"
        self.pool, self.theme, self.timeout, self.penalty = pool, theme, timeout, invalid_program_penalty
        self._stage, self._check, self._program = "write", None, None

    def reset(self, seed: int) -> Turn:
        self._stage, self._check, self._program = "write", None, None
        return Turn(0, [{"role": "user", "content": WRITER_PROMPT.format(theme=self.theme.strip())}])

    def prepare(self, answer: str) -> None:
        if self._stage == "write":
            from rlcode.rewards.extraction import extract_code

            self._program = extract_code(answer)
            self._check = start_check(self._program, self.timeout, pool=self.pool)

    def step(self, answer: str) -> StepResult:
        if self._stage == "write":
            if self._check is None:
                self.prepare(answer)
            check = self._check()
            info = {"role": "writer", "valid": check.valid, "reason": check.reason, "output": check.output}
            if not check.valid:
                return StepResult(None, {0: self.penalty}, info)
            self._stage, self._output = "predict", check.output
            return StepResult(Turn(1, [{"role": "user", "content": PREDICTOR_PROMPT.format(program=self._program)}]),
                              None, info)
        correct = extract_prediction(answer) == self._output
        info = {"role": "predictor", "correct": correct, "success": correct, "expected": self._output}
        return StepResult(None, {0: -1.0 if correct else 1.0, 1: 1.0 if correct else -1.0}, info)
