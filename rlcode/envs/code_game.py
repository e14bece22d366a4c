"""The adversarial code game (``grpo_code_game``): a writer writes a short Python program,
a predictor reads it and predicts its exact output, ``predictions_per_program`` (K) times. What each
seat earns is ``rlcode.envs.code_game_rewards`` (``writer_reward``: ``zero_sum``, the writer +1 for a
wrong prediction and -1 for a right one, or ``learnability``, paid for programs the predictor gets
right sometimes but not always).

The validity rule. Without it the writer wins by printing what nobody can predict, not by writing code
that is hard to reason about. A program is valid only if

1. its output is a function of its source alone. Statically (``rlcode.envs.pure_source``, in the
   trusted parent): imports only of pure-computation modules (math, itertools, functools,
   collections, re, fractions, decimal, statistics, dataclasses, typing, enum, copy, textwrap, ...;
   not os, sys, time, pathlib, platform, random, hashlib, ...), no ``open``/``input``/``eval``/
   ``exec``/``__import__``/``getattr``/``id``/``hash``, no route from a permitted object to the
   interpreter's internals. ``random`` (even seeded) and ``hashlib`` are refused: their values are
   deterministic but no reader can work them out, which makes them free wins that leave the
   predictor's group all -1. Dynamically: ``check_program`` runs it twice in the sandbox, each
   time in a fresh interpreter with empty stdin and a different random hash seed, environment,
   process id, clock (10 ms apart; a clock shifted by hours is not available in the sandbox, so
   clock reads are refused statically), time zone, working directory (different names and name
   lengths) and CPU set (one CPU in the second run where there are several); it must exit 0 both
   times within the time limit and print the same output. This catches what reading cannot
   (printed addresses, a set's hash order).
2. the predictor can write its output: non-empty valid UTF-8 with no control characters other than
   newline and tab; no special-token text (any added or special token of the predictor's tokenizer,
   e.g. ``<|im_end|>``, which would be encoded as that token in the predictor's prompt and which
   the predictor cannot emit either; and always the generic ``<|...|>`` pattern); no code fence
   (`````), which the answer format cannot carry; and at most ``max_output_tokens -
   FORMAT_RESERVE_TOKENS`` (16) tokens under the predictor's tokenizer (``max_output_tokens`` is the
   predictor's ``max_new_tokens``; the reserve, at most half of it, pays for the fences, the
   end-of-sequence token and a short lead-in). Without a tokenizer the bound is that many UTF-8 bytes: a byte-level BPE (or
   byte-fallback) tokenizer never spends more than one token per byte, so the bound is safe for any
   of them, if 3-4 times stricter than typical text needs.

The program's own text may not hold special-token text or a code fence either (the predictor's
prompt shows it in a fenced block). Reasons name the rule: "uses os (not a pure-computation
module)", "output too long for the predictor: 1000 tokens > budget 112". An invalid program costs
the writer ``invalid_program_penalty`` (-1) and the predictor does not play.

The answer format. The predictor answers with the output in a fenced block; the prediction is the
body of the reply's last fenced block taken whole (the opening fence's line is not part of it; an
unclosed last block runs to the end of the reply, as when generation stops at a stop string), or
the whole reply when it has no fence. Valid outputs hold no fence, so any valid output fits.
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
from rlcode.envs.code_game_rewards import WRITER_REWARDS, WriterReward, prediction_return, writer_return
from rlcode.envs.pure_source import PURE_MODULES, impurity
from rlcode.envs.writable_output import (DEFAULT_MAX_OUTPUT_TOKENS, FORMAT_RESERVE_TOKENS, check_budget,
                                         output_budget, output_problem, special_strings, text_problem)
from rlcode.rewards.extraction import extract_code, fenced_blocks
from rlcode.sandbox import SandboxPool
from rlcode.sandbox.result import Program, Status

__all__ = ["DEFAULT_MAX_OUTPUT_TOKENS", "FORMAT_RESERVE_TOKENS", "MAX_OUTPUT", "CodeGameEnv", "ProgramCheck",
           "check_program", "extract_prediction", "normalise_output", "output_budget", "start_check"]

MAX_OUTPUT = 4096
"""Bytes of each run's output the wrapper keeps; any budget refuses more long before."""

# A worked example and "ends by printing" because small writers otherwise define a function and never
# call it, or ramble past the token limit: SmolLM2-135M wrote 6 valid programs of 32 with this prompt,
# 1 of 32 with the example-free one (8 MBPP train themes x 4, benchmarks/code_game_vs_model.py
# writer-validity). A copied example is valid but predictable, which neither writer reward pays for.
WRITER_PROMPT = (
    "You are the writer in a code game. Write a short Python program (at most 10 lines) about this theme: "
    "{theme}\nThe program runs on its own (no input, files, randomness or time), imports only these modules "
    "if any: " + ", ".join(sorted(name for name in PURE_MODULES if "." not in name))
    + ", and ends by printing one short line with print(...). The other player must predict that line by "
    "reading the code, so make it tricky to work out. For example:\n```python\nwords = ['apple', 'kiwi', "
    "'fig']\nprint(sorted(words, key=len)[-1][::-1])\n```\nReply with only your program in a ```python block.")
PREDICTOR_PROMPT = (
    "You are the predictor in a code game. Read this Python program and predict exactly what it "
    "prints.\n\n```python\n{program}\n```\n\n"
    "Reply with the exact output in a ``` block (the output starts on the line after the opening ```).")

_WRAPPER = r'''
import json, os, subprocess, sys, time
source, limit, nonce, seeds, names = {source!r}, {timeout!r}, {nonce!r}, {seeds!r}, {names!r}

def one_cpu():  # the second run sees another CPU set (sched_getaffinity), where there are several
    try:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 1:
            os.sched_setaffinity(0, cpus[-1:])
    except OSError:
        pass

runs = []
for run, hash_seed in ((1, seeds[0]), (2, seeds[1])):
    if run == 2:
        subprocess.run([sys.executable, "-c", "pass"])  # the second run gets another process id
        time.sleep(0.01)  # and another clock reading
    where = os.path.join(os.getcwd(), names[run - 1])  # and another working directory
    os.mkdir(where)
    env = {{"PYTHONHASHSEED": hash_seed, "RLCODE_GAME_RUN": str(run), "HOME": where,
            "TZ": ("UTC", "Asia/Tokyo")[run - 1]}}
    try:
        done = subprocess.run([sys.executable, "-s", "-c", source], env=env, stdin=subprocess.DEVNULL, cwd=where,
                              capture_output=True, timeout=limit, preexec_fn=one_cpu if run == 2 else None)
        out = done.stdout[:{cap} + 1]
        try:
            text, utf8 = out.decode("utf-8"), True
        except UnicodeDecodeError:
            text, utf8 = out.decode("utf-8", "replace"), len(out) > {cap}  # cut inside a character
        runs.append({{"code": done.returncode, "out": text, "utf8": utf8, "long": len(done.stdout) > {cap},
                      "err": done.stderr[-300:].decode("utf-8", "replace")}})
    except subprocess.TimeoutExpired:
        runs.append({{"code": None, "out": "", "utf8": True, "long": False, "err": "timeout"}})
sys.stdout.write(json.dumps({{"nonce": nonce, "runs": runs}}) + "\n")
'''


@dataclass(frozen=True)
class ProgramCheck:
    valid: bool
    output: str | None
    """The program's output when valid (the same in both runs), else None."""
    reason: str
    """Why it is invalid ("" when valid), naming the rule it breaks."""


def check_program(code: str, timeout: float = 5.0, *, pool=None, tokenizer=None,
                  max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS) -> ProgramCheck:
    """Is ``code`` a valid game program? See the module doc for the rule. Never raises.

    Args:
        code: the program's source.
        timeout: seconds each of the two runs may take.
        pool: a ``SandboxPool`` to run it in (a one-worker pool is started and closed when None).
        tokenizer: the predictor's tokenizer: its token count bounds the output and its special
            tokens are refused; without one the bound is one byte per token.
        max_output_tokens: the predictor's ``max_new_tokens``.
    """
    return start_check(code, timeout, pool=pool, tokenizer=tokenizer, max_output_tokens=max_output_tokens)()


def start_check(code: str, timeout: float = 5.0, *, pool=None, tokenizer=None,
                max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS, specials: tuple[str, ...] | None = None):
    """Submit the check and return a function that waits for its ``ProgramCheck``.

    ``specials`` (the tokenizer's special-token strings) may be passed precomputed."""
    try:
        return _start_check(code, timeout, pool, tokenizer, max_output_tokens,
                            special_strings(tokenizer) if specials is None else specials)
    except Exception as e:  # the pool refused (closed, broken): a verdict, not an exception
        failed = ProgramCheck(False, None, f"sandbox: {type(e).__name__}: {e}"[:200])
        return lambda: failed


def _start_check(code, timeout, pool, tokenizer, max_output_tokens, specials):
    if not isinstance(code, str) or not code.strip():
        return lambda: ProgramCheck(False, None, "no program")
    static = impurity(code) or text_problem(code, specials, "the program's text")
    if static:
        return lambda: ProgramCheck(False, None, static)
    owned = pool is None
    if owned:
        pool = SandboxPool(workers=1, timeout=2 * timeout + 5)
    nonce = secrets.token_hex(16)
    # Fresh random hash seeds every check: with fixed ones a writer could find a set whose order
    # happens to agree under both, and still be unpredictable to anyone reading the code.
    first = secrets.randbelow(2**32)
    seeds = (str(first), str((first + 1 + secrets.randbelow(2**31)) % 2**32))
    names = ("r" + secrets.token_hex(4), "second-run-" + secrets.token_hex(12))  # other names and lengths
    wrapper = _WRAPPER.format(source=code, timeout=timeout, nonce=nonce, cap=MAX_OUTPUT, seeds=seeds, names=names)
    try:
        future = pool.submit(Program(code=wrapper), timeout=2 * timeout + 5)
    except Exception:
        if owned:
            pool.close()
        raise

    def result() -> ProgramCheck:
        try:
            outcome = future.result()
        except Exception as e:
            return ProgramCheck(False, None, f"sandbox: {type(e).__name__}")
        finally:
            if owned:
                pool.close()
        if Status(outcome.status) is not Status.OK:
            return ProgramCheck(False, None, f"sandbox: {Status(outcome.status).value}")
        reports = [line for line in outcome.stdout.splitlines() if nonce in line]
        try:
            check = _judge(json.loads(reports[0])["runs"]) if len(reports) == 1 else None
        except (ValueError, KeyError, TypeError):
            check = None
        if check is None:
            return ProgramCheck(False, None, "no single report from the runs")
        if check.valid:
            problem = output_problem(check.output, tokenizer=tokenizer, max_output_tokens=max_output_tokens,
                                     specials=specials)
            if problem:
                return ProgramCheck(False, None, problem)
        return check
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
            return ProgramCheck(False, None, f"output too long for the predictor: more than {MAX_OUTPUT} bytes")
        if not run["utf8"]:
            return ProgramCheck(False, None, "output is not valid UTF-8, which the predictor cannot write")
    if not first["out"].strip():
        return ProgramCheck(False, None, "printed nothing")
    if normalise_output(first["out"]) != normalise_output(second["out"]):
        return ProgramCheck(False, None, "not deterministic: the two runs printed different output")
    return ProgramCheck(True, normalise_output(first["out"]), "")


def normalise_output(text: str) -> str:
    """Trailing whitespace stripped from every line, trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n")


def extract_prediction(reply: str) -> str:
    """The predicted output: the last fenced block's body taken whole, else the whole reply."""
    blocks = fenced_blocks(reply)
    return normalise_output(blocks[-1][1] if blocks else reply)


class CodeGameEnv:
    def __init__(self, pool, *, theme: str, timeout: float = 5.0, invalid_program_penalty: float = -1.0,
                 tokenizer=None, max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
                 writer_reward: WriterReward = "zero_sum", predictions_per_program: int = 1) -> None:
        """One game: seat 0 writes, seat 1 predicts the program's output ``predictions_per_program`` times.

        Args:
            pool: the sandbox pool that runs the writer's program.
            theme: a few words the writer's program should be about (e.g. an MBPP task's text).
            timeout: seconds each of the two runs may take.
            invalid_program_penalty: the writer's return for an invalid program (the predictor then
                does not play).
            tokenizer: the predictor's tokenizer (the policy's in self-play and with a frozen
                opponent); None for a served predictor, whose outputs are then bounded in bytes.
            max_output_tokens: the predictor's ``max_new_tokens``: valid outputs fit it with room
                for the answer format.
            writer_reward: ``"zero_sum"`` or ``"learnability"`` (``rlcode.envs.code_game_rewards``).
            predictions_per_program: K, the predictor's turns on each valid program (each sees the
                same prompt, afresh); each turn's info carries its verdict and its own ``return``,
                the episode's seat-1 return is their mean, the writer's ``writer_return`` over all K.
        """
        check_budget(max_output_tokens)
        if writer_reward not in WRITER_REWARDS:
            raise ValueError(f"unknown writer_reward {writer_reward!r}: use one of {', '.join(WRITER_REWARDS)}")
        if predictions_per_program < 1:
            raise ValueError(f"predictions_per_program={predictions_per_program}: give at least 1")
        self.name = "code_game"
        self.pool, self.theme, self.timeout, self.penalty = pool, theme, timeout, invalid_program_penalty
        self.tokenizer, self.max_output_tokens = tokenizer, max_output_tokens
        self.writer_reward, self.predictions = writer_reward, predictions_per_program
        self._specials = special_strings(tokenizer)
        self._stage, self._check, self._program, self._verdicts = "write", None, None, []

    def reset(self, seed: int) -> Turn:
        self._stage, self._check, self._program, self._verdicts = "write", None, None, []
        return Turn(0, [{"role": "user", "content": WRITER_PROMPT.format(theme=self.theme.strip())}])

    def prepare(self, answer: str) -> None:
        if self._stage == "write":
            self._program = extract_code(answer)
            self._check = start_check(self._program, self.timeout, pool=self.pool, tokenizer=self.tokenizer,
                                      max_output_tokens=self.max_output_tokens, specials=self._specials)

    def step(self, answer: str) -> StepResult:
        if self._stage == "write":
            if self._check is None:
                self.prepare(answer)
            check = self._check()
            info = {"role": "writer", "valid": check.valid, "reason": check.reason, "output": check.output}
            if not check.valid:
                # a game without a program to predict: not a success. Said, not left unknown, so that a
                # step whose games were all invalid still counts games, not the fallback's completions
                info["success"] = False
                return StepResult(None, {0: writer_return(self.writer_reward, None, self.penalty)}, info)
            self._stage, self._output = "predict", check.output
            return StepResult(self._predictor_turn(), None, info)
        correct = extract_prediction(answer) == self._output
        self._verdicts.append(correct)
        info = {"role": "predictor", "correct": correct, "expected": self._output,
                "return": prediction_return(self.writer_reward, correct)}
        if len(self._verdicts) < self.predictions:
            return StepResult(self._predictor_turn(), None, info)
        verdicts = self._verdicts
        # the episode's success: most of its predictions were right (with K = 1: the prediction was)
        info["success"] = 2 * sum(verdicts) > len(verdicts)
        own = [prediction_return(self.writer_reward, v) for v in verdicts]
        return StepResult(None, {0: writer_return(self.writer_reward, verdicts, self.penalty),
                                 1: sum(own) / len(own)}, info)

    def _predictor_turn(self) -> Turn:
        return Turn(1, [{"role": "user", "content": PREDICTOR_PROMPT.format(program=self._program)}])
